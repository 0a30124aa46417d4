"""`import dispatch` and `auto` work with only torch: optional runtimes are blocked
from importing in a subprocess, and the doctor says why each route is off."""

import subprocess
import sys
import textwrap

# A None in sys.modules makes `import name` fail and find_spec(name) say "not
# installed", exactly as on a machine without the package.
BLOCK = textwrap.dedent(
    """
    import sys
    for name in ("onnxruntime", "onnx", "onnxscript", "triton"):
        sys.modules[name] = None
    """
)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_auto_works_without_optional_runtimes():
    out = run(
        """
        import torch, dispatch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        x = torch.randn(2, 4)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(m, backend="auto")(x), m(x))
            e = dispatch.explain(m, x)
        print(sorted({r.route for r in e.regions}))
        print(e.regions[0].rejected["onnxrt"])
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    routes, reason = out.stdout.strip().splitlines()[-2:]
    assert routes == "['eager']"
    assert "not installed" in reason


def test_doctor_says_why_routes_are_off():
    out = run("import sys, runpy; sys.argv = ['dispatch']; runpy.run_module('dispatch', run_name='__main__')")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert "no" in lines["onnxrt"].split() and "onnxruntime" in lines["onnxrt"]
    assert "no" in lines["triton"].split() and "triton is not installed" in lines["triton"]
    assert "yes" in lines["eager"].split()


def test_kernels_install_under_the_dispatch_namespace(tmp_path):
    """A top-level ``kernels`` package would overwrite (or be overwritten by) the
    ``kernels`` distribution that transformers loads hub kernels from."""
    code = (
        "import importlib.util, dispatch.kernels._launch as launch\n"
        "print(launch.__name__, importlib.util.find_spec('kernels'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["dispatch.kernels._launch", "None"]
