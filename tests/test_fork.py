"""A model compiled by ``auto``, then a ``fork()``: the child's calls return.

Pre-forking servers and data-loader workers fork a process that has already
served calls. ``auto`` keeps compiling after the first call (trials, the
whole-graph check, a new shape), so a child often compiles: it must not wait on
compile workers that stayed behind in the parent.
"""

from tests.conftest import run_python

# The child compiles a new shape with inductor. The parent compiled with two
# compile threads (one CPU would compile in-line and never build the pool), in a
# fresh Inductor cache, so that the child's C++ kernels are not on disk yet.
FORKED_CHILD_COMPILES = """
import multiprocessing, queue, torch, torch._inductor.config
torch._inductor.config.compile_threads = 2
model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8)).eval()
compiled = torch.compile(model, backend="auto", dynamic=False, options={"routes": ["inductor"]})
with torch.no_grad():
    compiled(torch.randn(5, 24))

def child(results):
    torch.set_num_threads(1)  # as DataLoader's workers do: GNU OpenMP's pool does not survive a fork
    x = torch.randn(3, 24)
    with torch.no_grad():
        results.put(float((compiled(x) - model(x)).abs().max()))

results = multiprocessing.get_context("fork").Queue()
worker = multiprocessing.get_context("fork").Process(target=child, args=(results,))
worker.start()
try:
    print("child's error", results.get(timeout=90))
except queue.Empty:
    print("the child hung")
worker.kill()
worker.join()
"""


def test_a_forked_child_compiles_and_returns(tmp_path):
    done = run_python(FORKED_CHILD_COMPILES, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("child's", "the child"))]
    assert len(lines) == 1 and lines[0].startswith("child's error"), done.stdout[-2000:]
    assert float(lines[0].split()[-1]) < 1e-5
