"""Inductor's vector-ISA probe in a fresh process: its load checks (one child
Python each) run in the first process and are answered from our cache in the
next, with the same ISAs found; a check that failed is run again."""

import ast
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"),
    reason="inductor probes vector ISAs with child processes on x86 Linux only",
)

# Counts the probe's children (a Python that loads a library) around a body.
COUNTING = textwrap.dedent(
    """
    import subprocess, sys
    import torch
    children = []
    real = subprocess.run
    def counted(cmd, *args, **kwargs):
        if isinstance(cmd, list) and cmd[:2] == [sys.executable, "-c"] and "LoadLibrary" in cmd[2]:
            children.append(cmd)
        return real(cmd, *args, **kwargs)
    subprocess.run = counted
    """
)
COUNTED = textwrap.dedent(
    """
    from torch._inductor import cpu_vec_isa
    print("CHILDREN", len(children))
    print("ISAS", [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()])
    """
)

PROBE = """
from dispatch.cache import ArtifactCache
from dispatch.inductor_isa import probe_vector_isas
from torch._inductor import cpu_vec_isa
if "fail-first" in sys.argv:  # the first load check fails, as a broken loader would
    real_probe, failed = cpu_vec_isa.VecISA._probe_load, []
    def failing(isa, path):
        if not failed:
            failed.append(path)
            return False
        return real_probe(isa, path)
    cpu_vec_isa.VecISA._probe_load = failing
probe_vector_isas(ArtifactCache(sys.argv[1]), [torch.ones(1)])
"""

TRAINING_STEP = """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
torch.compile(model, backend="auto")(torch.randn(3, 8)).sum().backward()
print("GRADS", [round(float(p.grad.abs().sum()), 6) for p in model.parameters()])
"""


def _run(body: str, env: dict[str, str], *args: str) -> dict[str, str]:
    script = COUNTING + body + COUNTED
    out = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ")[0].isupper())


def _env(tmp_path) -> dict[str, str]:
    """Fresh caches, ours and inductor's (where the probe's libraries are built)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}
    env.update(
        {
            "DISPATCH_CACHE_DIR": str(tmp_path / "dispatch"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        }
    )
    return env


def test_a_second_process_compiles_on_inductor_without_probing_the_isas_again(tmp_path):
    # Forced onto inductor: left to auto, the step is timed against the traced graph
    # on its first call, and beside other tests (not cached) one process may keep
    # each, whose gradients differ in their last bits.
    env = {**_env(tmp_path), "DISPATCH_ROUTE": "inductor"}
    first, second = _run(TRAINING_STEP, env), _run(TRAINING_STEP, env)
    assert int(first["CHILDREN"]) > 0  # the probe ran, as inductor runs it
    assert second["CHILDREN"] == "0"
    assert second["ISAS"] == first["ISAS"]
    assert second["GRADS"] == first["GRADS"]


def test_a_failed_load_check_is_not_recorded_and_runs_again(tmp_path):
    env = _env(tmp_path)
    cache = str(tmp_path / "dispatch")
    failed = _run(PROBE, env, cache, "fail-first")
    again = _run(PROBE, env, cache)
    served = _run(PROBE, env, cache)
    assert int(again["CHILDREN"]) > 0  # the failed check, and those it had kept from running
    assert served["CHILDREN"] == "0"
    assert served["ISAS"] == again["ISAS"]
    assert len(ast.literal_eval(again["ISAS"])) > len(ast.literal_eval(failed["ISAS"]))


CONCURRENT = """
import threading, time
from dispatch.cache import ArtifactCache
from dispatch.inductor_isa import probe_vector_isas
from torch._inductor import cpu_vec_isa
# Every ISA allowed whatever this CPU has, and a build that takes 0.3 s: no
# compiler runs.
cpu_vec_isa.x86_isa_checker = lambda: ["avx2", "avx512", "avx512_vnni", "amx_tile"]
torch.cpu._is_vnni_supported = torch.cpu._init_amx = lambda: True
torch.cpu._is_avx512_bf16_supported = torch.cpu._is_amx_fp16_supported = lambda: False
lock, running, most = threading.Lock(), [0], [0]
def build(isa, code):
    with lock:
        running[0] += 1
        most[0] = max(most[0], running[0])
    time.sleep(0.3)
    with lock:
        running[0] -= 1
    return True
cpu_vec_isa.VecISA.check_build = build
probe_vector_isas(ArtifactCache(sys.argv[1]), [torch.ones(1)])
print("MOST", most[0])
"""


def test_the_isas_are_checked_at_once(tmp_path):
    # Inductor checks them one after another: on an empty cache, 10 builds of
    # 1.5 s where the CPU has AMX and AVX-512.
    out = _run(CONCURRENT, _env(tmp_path), str(tmp_path / "dispatch"))
    assert int(out["MOST"]) >= 2
    assert ast.literal_eval(out["ISAS"]) == [
        "avx512 avx512_vnni amx_tile",
        "avx512 avx512_vnni",
        "avx512",
        "avx2",
    ]


PLAIN = """
from pathlib import Path
from dispatch.config import Config
from dispatch.plain_inductor import compile_plain
graphs = []
def capture(gm, example_inputs):
    graphs.append((gm, list(example_inputs)))
    return gm.forward
x = torch.randn(3, 8)
torch.compile(lambda x: torch.tanh(x) * 2 + 1, backend=capture)(x)
(gm, args), = graphs
compile_plain(gm, args, Config(cache_dir=Path(sys.argv[1])))
"""


def test_a_graph_the_trial_moved_to_plain_inductor_starts_warm_without_probing_the_isas_again(tmp_path):
    # A warm start compiles such a graph as plain inductor on its first call, outside
    # the route: unanswered, the probe's children took 2.2 s of Falcon's 5.3.
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}
    cache = str(tmp_path / "dispatch")
    first, second = _run(PLAIN, env, cache), _run(PLAIN, env, cache)
    assert int(first["CHILDREN"]) > 0
    assert second["CHILDREN"] == "0"
    assert second["ISAS"] == first["ISAS"]
