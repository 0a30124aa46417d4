"""An AOTInductor package is loaded in a child Python before this process loads it
(dispatch/aoti_load_check.py): on an H200 with torch 2.11 the load segfaulted."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import dispatch
import dispatch.aoti_load_check as load_check
from dispatch.cache import ArtifactCache
from dispatch.routes import PreprocessResult
from dispatch.stitch import FallbackWarning

CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
RAISE = "raise OSError('libcuda.so.1: cannot open shared object file')"
LOADS = "import sys; assert open(sys.argv[1], 'rb').read() == b'package'"


@pytest.fixture
def children(monkeypatch):
    """A one-item list counting the load checks' child processes."""
    count = [0]
    run = subprocess.run

    def counted(cmd, *args, **kwargs):
        if isinstance(cmd, list) and load_check.CHILD in cmd:  # not inductor's own compiles
            count[0] += 1
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(load_check.subprocess, "run", counted)
    return count


def test_a_package_that_loads_is_recorded_and_not_checked_again(tmp_path, monkeypatch, children):
    monkeypatch.setattr(load_check, "CHILD", LOADS)
    cache = ArtifactCache(tmp_path)
    load_check.check_package_loads(b"package", cache)
    load_check.check_package_loads(b"package", cache)
    assert children[0] == 1
    load_check.check_package_loads(b"package", ArtifactCache(tmp_path / "other"))
    assert children[0] == 2  # the record lives in the cache, not in this process


def test_a_crash_in_the_child_is_an_error_here_and_is_checked_again(tmp_path, monkeypatch, children):
    monkeypatch.setattr(load_check, "CHILD", CRASH)
    cache = ArtifactCache(tmp_path)
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"died of SIGSEGV .*not loaded in this process"):
            load_check.check_package_loads(b"package", cache)
    assert children[0] == 2  # a failure is never recorded


def test_an_exception_in_the_child_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(load_check, "CHILD", RAISE)
    with pytest.raises(RuntimeError, match=r"raised OSError: libcuda\.so\.1: cannot open"):
        load_check.check_package_loads(b"package", ArtifactCache(tmp_path))


def test_only_cuda_packages_are_checked():
    assert load_check.needs_load_check({"device": "cuda:0"})
    assert not load_check.needs_load_check({"device": "cpu"})


def _fake_package(self, region, compile_specs):
    """The inductor route's preprocess without AOTInductor's minute of C++."""
    return PreprocessResult(b"package", {}, {**compile_specs, "torch": torch.__version__})


@torch.no_grad()
def test_lower_falls_back_where_the_package_crashed_its_check(monkeypatch, children):
    """The region's package is never loaded here: the region runs on the next route,
    with one warning saying what the child died of."""
    from dispatch.routes.inductor import InductorRoute

    monkeypatch.setattr(load_check, "CHECKED_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(load_check, "CHILD", CRASH)
    monkeypatch.setattr(InductorRoute, "preprocess", _fake_package)
    loaded = []
    monkeypatch.setattr("torch._inductor.aoti_load_package", lambda path: loaded.append(path))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = dispatch.lower(model, (x,), routes=["inductor", "eager"])
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallbacks) == 1 and "died of SIGSEGV" in fallbacks[0], fallbacks
    assert [r.route for r in program.regions] == ["eager"]
    assert loaded == [] and children[0] == 1
    torch.testing.assert_close(program(x), model(x))


@pytest.mark.slow
@torch.no_grad()
def test_a_real_package_passes_its_check_once(tmp_path, monkeypatch, children):
    """A CPU package made by AOTInductor (about a minute cold: ``nox -s slow``) loads
    in the child, and ``dispatch.load`` in this process then finds it recorded."""
    monkeypatch.setattr(load_check, "CHECKED_DEVICES", frozenset({"cpu"}))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    program = dispatch.lower(model, (x,), routes=["inductor"])
    assert [r.route for r in program.regions] == ["inductor"] and children[0] == 1
    path = Path(tmp_path) / "checked.dispatch"
    program.save(path)
    torch.testing.assert_close(dispatch.load(path)(x), model(x))
    assert children[0] == 1
