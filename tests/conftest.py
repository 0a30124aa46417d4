"""Shared set-up: one Inductor cache per test run, shared by its workers
(AOTAutograd's cache off), the Triton interpreter where there is no GPU, a clean
environment and Dynamo cache per test, and helpers for fake-device models."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import torch._functorch.config
from torch._subclasses.fake_tensor import FakeTensorMode

# One Inductor cache for the whole session: a cold C++ compile costs seconds.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "dispatch-tests-inductor")
)
# AOTAutograd's cache off, but where a test turns it on (tests/test_served_plans.py):
# its entries live in the session's shared Inductor cache, so a test would be
# served a graph another test (or an earlier run) compiled, and plan nothing.
torch._functorch.config.enable_autograd_cache = False
# Without a GPU, Triton kernels run in the interpreter on CPU tensors. It must be
# set before triton decorates any kernel, that is before kernels/ is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run `nox -s gpu` on one)"
)
ROOT = Path(__file__).resolve().parent.parent


def run_python(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (faulthandler on), with the repository importable."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


@pytest.fixture(autouse=True)
def clean_state(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("DISPATCH_"):
            monkeypatch.delenv(name)
    # A fresh persistent cache per test: no test reads another's decisions or exports.
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(tmp_path / "dispatch-cache"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def demo(request):
    """The tests' ``DemoRoute`` in the registry; ``param`` picks its failure mode."""
    from dispatch.routes import registry
    from tests.demo_route import DemoRoute

    route = DemoRoute(getattr(request, "param", "ok"))
    registry.replace(route)
    yield route
    registry.remove("demo")


def counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """A one-item list counting the calls of ``owner.name`` (a module's function or a
    class's method) from now on; each call still runs."""
    count = [0]
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return count


@pytest.fixture
def onnx_exports(monkeypatch):
    """A one-item list counting the onnxrt route's ONNX exports from now on."""
    import dispatch.routes.onnxrt as onnxrt_route

    return counted(monkeypatch, onnxrt_route, "export_region")


@pytest.fixture
def onnx_bakes(monkeypatch):
    """A one-item list counting the ONNX models the onnxrt route makes from now on,
    each with one set of weights baked in: an export, or another set baked into
    an earlier export's program (``onnx_rebake.py``)."""
    import dispatch.routes.onnx_export as onnx_export

    return counted(monkeypatch, onnx_export, "finished_model")


@pytest.fixture
def compiles(monkeypatch):
    """A one-item list counting inductor's inner compiles from now on."""
    import torch._inductor.compile_fx as compile_fx_module

    return counted(monkeypatch, compile_fx_module, "compile_fx_inner")


@pytest.fixture(autouse=True)
def own_trial_slot(monkeypatch):
    """Each test's trials take turns among themselves: a graph of an earlier
    test still holding the turn would start this test's trials a second late,
    in the middle of what it measures."""
    import dispatch.trial_slot as trial_slot

    monkeypatch.setattr(trial_slot, "TRIAL_SLOT", trial_slot.TrialSlot())


@pytest.fixture(autouse=True)
def quiet_cpus(monkeypatch):
    """Timings count as taken on a quiet machine: the suite's own workers share
    the cores, and a decision left uncached by that (``cpu_contention.py``)
    would fail the tests of warm starts at random. ``tests/test_cpu_contention.py``
    reads the kernel's counts and fakes busy ones."""
    import dispatch.cpu_contention as cpu_contention

    monkeypatch.setattr(cpu_contention, "thread_wait", lambda tid: None)


@pytest.fixture
def busy_cpus(monkeypatch):
    """Every thread waits half the wall time for a CPU: other work holds them,
    until the test sets the returned state's ``busy`` to False (no more waits)."""
    import time
    import types

    import dispatch.cpu_contention as cpu_contention

    state = types.SimpleNamespace(busy=True, waited=0)

    def thread_wait(tid):
        if state.busy:
            state.waited = int(time.perf_counter() * 0.5e9)
        return state.waited

    monkeypatch.setattr(cpu_contention, "thread_wait", thread_wait)
    return state


@pytest.fixture
def routed_throughout(monkeypatch):
    """Small CPU graphs keep their routes for as many calls as a test makes: the
    in-place trial against the traced graph (dispatch/graph_trial.py) never starts."""
    import dispatch.graph_trial as graph_trial

    monkeypatch.setattr(graph_trial, "ROUTED_FIRST_CALLS", 10**9)


@pytest.fixture
def training_stays_on_inductor(monkeypatch):
    """CPU training graphs stay on inductor untimed: the first-call check
    (``capture_check.py``) would move a test's tiny graphs to eager by this busy
    machine's clock. For tests of inductor's training path; the check has its own
    (``test_training_check.py``)."""
    import dispatch.capture_check as capture_check

    monkeypatch.setattr(capture_check, "TRAINING_TIMED_BELOW_S", 0.0)


@pytest.fixture
def timed(monkeypatch, request):
    """Whole-graph candidates (dispatch/graph_tuning.py) timed by a fake clock:
    milliseconds per candidate from the test's ``param``, 2 ms for the others;
    returns the candidate sets timed, in order."""
    import dispatch.autotune as autotune

    ms, seen = request.param, []

    def median_call_s(candidates, args, batch_s=None, batches=None):
        seen.append(set(candidates))
        for fn in candidates.values():
            fn(*args)
        return {name: ms.get(name, 2.0) * 1e-3 for name in candidates}

    monkeypatch.setattr(autotune, "median_call_s", median_call_s)
    return seen


@pytest.fixture
def no_trial_follows(monkeypatch):
    """The whole-graph check told of no in-place trial that may compile inductor
    later (a cut graph under autotune, one of symbolic sizes): past its bar it
    times inductor itself, whatever ORT's share."""
    from dispatch.graph_tuning import WholeGraphCheck

    monkeypatch.setattr(WholeGraphCheck, "leave_inductor_to_trial", lambda self: None)


@pytest.fixture
def route_compiles(monkeypatch):
    """The routes (onnxrt, inductor) that compiled a region from now on, in order."""
    from dispatch.routes import registry

    seen = []
    for name in ("onnxrt", "inductor"):
        route = registry.get(name)
        original = type(route).compile

        def compile(self, gm, args, name=name, original=original):
            seen.append(name)
            return original(self, gm, args)

        monkeypatch.setattr(type(route), "compile", compile)
    return seen


def on_fake_device(module: torch.nn.Module, device: str, mode: FakeTensorMode) -> torch.nn.Module:
    """``module`` with fake parameters on ``device`` (``cuda``/``mps`` need no hardware)."""
    module.requires_grad_(False)
    with mode:
        return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


def fake_inputs(mode: FakeTensorMode, device: str, *shapes: tuple[int, ...], dtype=torch.float32):
    with mode:
        return [torch.randn(*s, device=device, dtype=dtype) for s in shapes]


@pytest.fixture
def torch_threads():
    """``torch.set_num_threads`` for one test; the count is put back after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
