"""AOTAutograd's cache serves the graphs auto compiles as plain inductor does, with
their plans: a warm start skips the trace and still shows what ran where, and an
entry written by plain inductor or under other settings never serves auto."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters

import dispatch.inductor_baseline as baseline
from dispatch.record import recorder
from dispatch.served_plans import KIND
from tests.conftest import counted
from tests.models import MLP

pytestmark = pytest.mark.usefixtures("training_stays_on_inductor")


@pytest.fixture(autouse=True)
def aotautograd_cache_on():
    """On, as torch leaves it (the suite turns it off elsewhere, tests/conftest.py)."""
    with torch._functorch.config.patch(enable_autograd_cache=True):
        yield


@pytest.fixture
def inner_calls(monkeypatch):
    """How many aten graphs the planning inner compile saw."""
    return counted(monkeypatch, baseline.PlanningInnerCompile, "__call__")


@pytest.fixture
def own_inductor_cache(monkeypatch, tmp_path):
    """An inductor cache no other test wrote to."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _step(model, x, backend="auto", **options):
    """A new process's first training step, as far as one process can be new."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, options=options or None)
    with recorder.recording() as plans:
        compiled(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [(p.kind, [(r.name, r.route) for r in p.regions]) for p in plans], grads


def test_a_warm_training_start_is_served_by_aotautograds_cache_with_its_plans(inner_calls):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 16)
    cold, cold_grads = _step(model, x)
    assert cold == [
        ("forward", [("inductor_cpu_0", "inductor")]),
        ("backward", [("inductor_cpu_0", "inductor")]),
    ]
    calls = inner_calls[0]
    warm, warm_grads = _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert inner_calls[0] == calls  # no aten graph was traced or planned again
    assert warm == cold  # explain still says what ran where
    for got, expected in zip(warm_grads, cold_grads):
        torch.testing.assert_close(got, expected)


def test_plain_inductors_entry_and_other_settings_never_serve_auto(own_inductor_cache, inner_calls):
    torch.manual_seed(0)
    model, x = MLP(depth=1), torch.randn(4, 16)
    _step(model, x, backend="inductor")
    assert counters["aot_autograd"]["autograd_cache_saved"] == 1
    _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0
    assert inner_calls[0] == 2  # forward and backward, planned
    _step(model, x, min_region_size=3)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0
    assert inner_calls[0] == 4
    _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert inner_calls[0] == 4


def test_an_entry_without_our_plans_is_compiled_again_and_planned(own_inductor_cache, inner_calls, tmp_path):
    torch.manual_seed(0)
    model, x = MLP(depth=1), torch.randn(4, 16)
    cold, _ = _step(model, x)
    shutil.rmtree(os.path.join(os.environ["DISPATCH_CACHE_DIR"], KIND))  # ours cleared, inductor's kept
    again, _ = _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1  # served, but with no plan
    assert inner_calls[0] == 4  # so compiled again, and planned
    assert again == cold


def test_without_a_cache_of_ours_aotautograds_stays_off(
    own_inductor_cache, inner_calls, tmp_path, monkeypatch
):
    """Plans could not be stored, so every hit would compile again: no hits at all."""
    import dispatch.cache as cache_module
    from dispatch.cache import CacheWarning

    monkeypatch.setattr(cache_module, "_WARNED", set())
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(blocker / "cache"))
    torch.manual_seed(0)
    model, x = MLP(depth=1), torch.randn(4, 16)
    with pytest.warns(CacheWarning, match="cannot write"):
        _step(model, x)
    second, _ = _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0
    assert inner_calls[0] == 4  # each step planned its forward and backward once
    assert second == [
        ("forward", [("inductor_cpu_0", "inductor")]),
        ("backward", [("inductor_cpu_0", "inductor")]),
    ]


def test_a_warm_training_start_is_served_where_inductors_directory_is_its_default(
    inner_calls, tmp_path, monkeypatch
):
    """Left to its default, inductor's directory was ours for auto's compiles, but
    AOTAutograd writes a training entry at the first backward call, outside them:
    the entry went to inductor's default directory and was never found."""
    from torch._inductor.runtime import cache_dir_utils

    default = str(tmp_path / "inductor-default")
    monkeypatch.setattr(cache_dir_utils, "default_cache_dir", lambda: default)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)  # as inductor sets it on first use
    torch.manual_seed(0)
    model, x = MLP(depth=1), torch.randn(4, 16)
    _step(model, x)
    _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert inner_calls[0] == 2


# One training step in a fresh process: AOTAutograd's cache hits, the plans
# published, and the gradients.
TRAINING_STEP = textwrap.dedent(
    """
    import torch, dispatch
    import dispatch.capture_check
    from dispatch.record import recorder
    from torch._dynamo.utils import counters
    dispatch.capture_check.TRAINING_TIMED_BELOW_S = 0.0  # the step stays on inductor, untimed
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with recorder.recording() as plans:
        torch.compile(model, backend="auto")(x).sum().backward()
    print("HITS", counters["aot_autograd"]["autograd_cache_hit"])
    print("PLANS", [(p.kind, [(r.name, r.route) for r in p.regions]) for p in plans])
    print("GRADS", [round(float(p.grad.abs().sum()), 6) for p in model.parameters()])
    """
)


def test_a_second_process_is_served_with_the_first_ones_plans(tmp_path):
    """Both caches at their defaults: ours under DISPATCH_CACHE_DIR, inductor's
    under the temporary directory, as a user who set neither has them."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update({"DISPATCH_CACHE_DIR": str(tmp_path / "dispatch"), "TMPDIR": str(tmp_path)})

    def run() -> dict[str, str]:
        out = subprocess.run(
            [sys.executable, "-c", TRAINING_STEP], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return dict(
            line.split(" ", 1) for line in out.stdout.splitlines() if line[:4] in ("HITS", "PLAN", "GRAD")
        )

    first, second = run(), run()
    assert (first["HITS"], second["HITS"]) == ("0", "1")
    assert second["PLANS"] == first["PLANS"]
    assert "('forward', [('inductor_cpu_0', 'inductor')])" in first["PLANS"]
    assert second["GRADS"] == first["GRADS"]


def test_aotautograds_cache_stays_off_where_the_user_turned_it_off(inner_calls):
    torch.manual_seed(0)
    model, x = MLP(depth=1), torch.randn(4, 16)
    # Its config's own patch: monkeypatch's undo deletes the setting, which hides it.
    with torch._functorch.config.patch(enable_autograd_cache=False):
        _step(model, x)
        _step(model, x)
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0
    assert inner_calls[0] == 4
