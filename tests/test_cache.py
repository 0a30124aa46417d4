"""The persistent cache: a second process exports nothing, entries are atomic,
corrupted ones are detected and rewritten, and weights are part of the key."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import dispatch.cache as cache_module
from dispatch.cache import ArtifactCache, CacheWarning, region_key

pytest.importorskip("onnxruntime")

# Prints how many ONNX exports this process made and checks the result.
SCRIPT = textwrap.dedent(
    """
    import torch, dispatch
    import dispatch.backend
    import dispatch.routes.onnxrt as onnxrt_route
    count, traces = [0], [0]
    export, trace = onnxrt_route.export_region, dispatch.backend.aot_compile
    def counting(*a, **k):
        count[0] += 1
        return export(*a, **k)
    def counting_traces(*a, **k):
        traces[0] += 1
        return trace(*a, **k)
    onnxrt_route.export_region = counting
    dispatch.backend.aot_compile = counting_traces
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="auto")(x), m(x))
    print("EXPORTS", count[0])
    print("TRACES", traces[0])
    """
)


def _run(cache_dir, background=False):
    env = {**os.environ, "DISPATCH_CACHE_DIR": str(cache_dir)}
    args = [sys.executable, "-c", SCRIPT]
    if background:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _exports(stdout: str, what: str = "EXPORTS") -> int:
    return int(next(line for line in stdout.splitlines() if line.startswith(what)).split()[1])


def test_a_second_process_exports_nothing_and_traces_nothing(tmp_path):
    first = _run(tmp_path)
    assert (_exports(first.stdout), _exports(first.stdout, "TRACES")) == (1, 1)
    second = _run(tmp_path)
    assert _exports(second.stdout) == 0
    assert _exports(second.stdout, "TRACES") == 0  # AOTAutograd's graph came from the cache
    assert "Warning" not in second.stderr


def test_two_processes_compiling_at_once_corrupt_nothing(tmp_path):
    procs = [_run(tmp_path, background=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    cache = ArtifactCache(tmp_path)
    entries = [p for p in (tmp_path / "onnx").rglob("*") if p.is_file()]
    assert entries and all(cache.get("onnx", p.name) is not None for p in entries)
    assert not list(tmp_path.rglob(".tmp-*"))  # every write was renamed into place
    assert _exports(_run(tmp_path).stdout) == 0


def _compile_mlp(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        return torch.compile(m, backend="auto")(x), m(x)


def test_a_corrupted_entry_is_reported_once_ignored_and_rewritten(onnx_exports, monkeypatch):
    monkeypatch.setattr(cache_module, "_WARNED", set())
    _compile_mlp()
    root = cache_module.Path(os.environ["DISPATCH_CACHE_DIR"])
    (entry,) = [p for p in (root / "onnx").rglob("*") if p.is_file()]
    entry.write_bytes(entry.read_bytes()[:100])  # truncated, as by a crash mid-copy
    with pytest.warns(CacheWarning, match="truncated or corrupted") as record:
        got, expected = _compile_mlp()
    torch.testing.assert_close(got, expected)
    assert len([w for w in record if issubclass(w.category, CacheWarning)]) == 1
    assert onnx_exports[0] == 2  # exported again
    assert ArtifactCache(root).get("onnx", entry.name) is not None  # and rewritten whole
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        _compile_mlp()
    assert onnx_exports[0] == 2


def test_other_weights_are_another_entry(onnx_exports):
    got, expected = _compile_mlp(seed=0)
    torch.testing.assert_close(got, expected)
    got, expected = _compile_mlp(seed=1)  # same graph, other weights: never the cached model
    torch.testing.assert_close(got, expected)
    assert onnx_exports[0] == 2
    _compile_mlp(seed=0)
    assert onnx_exports[0] == 2


def test_key_changes_with_versions_and_shapes(monkeypatch):
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["val"] = torch.empty(3, 2)
    key = region_key(gm)
    assert region_key(gm) == key
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["val"] = torch.empty(4, 2)
    other_shape = region_key(gm)
    assert other_shape != key
    monkeypatch.setattr(cache_module, "versions", lambda: (("torch", "0.0"),))
    other_versions = region_key(gm)
    assert other_versions not in (key, other_shape)
    # A fix to dispatch between releases (the GQA export) must not read entries the old code wrote.
    monkeypatch.setattr(cache_module, "code_digest", lambda: "other code")
    assert region_key(gm) not in (key, other_shape, other_versions)


def test_the_code_digest_covers_every_module_of_the_package(tmp_path):
    import shutil
    from pathlib import Path

    package = tmp_path / "dispatch"
    shutil.copytree(Path(cache_module.__file__).parent, package)
    digest = cache_module.source_digest(package)
    assert digest == cache_module.code_digest()
    export = package / "routes" / "onnx_export.py"
    export.write_bytes(export.read_bytes() + b"\n# a fix\n")
    assert cache_module.source_digest(package) != digest


def test_an_unwritable_cache_costs_speed_not_results(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "_WARNED", set())
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(CacheWarning, match="cannot write"):
        got, expected = _compile_mlp()
    torch.testing.assert_close(got, expected)


def test_weights_beside_the_graph_run_when_exported_and_when_read_back(onnx_exports):
    from dispatch.stitch import FallbackWarning

    def compile_wide() -> tuple[torch.Tensor, torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
        x = torch.randn(5, 64)
        with torch.no_grad():
            return torch.compile(m, backend="auto")(x), m(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # onnxrt must run them, not eager
        for _ in range(2):  # exported, then read from the cache
            got, expected = compile_wide()
            torch.testing.assert_close(got, expected)
    assert onnx_exports[0] == 1


def test_the_cache_root_is_created_private(tmp_path, monkeypatch):
    root = tmp_path / "fresh" / "dispatch"
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(root))
    _compile_mlp()
    assert root.stat().st_mode & 0o777 == 0o700
    ours = [p for p in root.rglob("*") if p != root / "inductor" and root / "inductor" not in p.parents]
    assert ours and all(p.stat().st_mode & 0o077 == 0 for p in ours)


@pytest.mark.parametrize("who", ["others can write it", "another user owns it"])
def test_an_untrusted_cache_root_reads_as_empty_and_is_not_written(tmp_path, monkeypatch, who):
    monkeypatch.setattr(cache_module, "_WARNED", set())
    root = tmp_path / "shared"
    cache = ArtifactCache(root)
    cache.put_json("decision", "ab" * 8, {"order": ["eager"]})  # written while it was trusted
    if who == "others can write it":
        root.chmod(0o777)
    else:
        if os.getuid() != 0:
            pytest.skip("changing a directory's owner needs root")
        os.chown(root, 12345, -1)
    with pytest.warns(CacheWarning, match="not using the cache directory") as caught:
        assert cache.get_json("decision", "ab" * 8) is None
        cache.put_json("decision", "cd" * 8, {"order": ["eager"]})
        assert cache.get("decision", "cd" * 8) is None
    assert len(caught) == 1
    assert not (root / "decision" / "cd").exists()
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        got, expected = _compile_mlp()  # runs, without a cache
    torch.testing.assert_close(got, expected)
    assert not (root / "onnx").exists() and not (root / "inductor").exists()


def test_inductor_uses_our_cache_for_our_compiles_only(tmp_path, monkeypatch):
    """auto sets no process-wide TORCHINDUCTOR_CACHE_DIR: a user's own inductor
    models keep inductor's cache, and so do auto's training graphs."""
    import torch._inductor.compile_fx as compile_fx_module
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    root = tmp_path / "dispatch"
    monkeypatch.setenv("DISPATCH_CACHE_DIR", str(root))
    seen = []
    real = compile_fx_module.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        seen.append(cache_dir())
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", spy)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4)
    with torch.no_grad():  # inference on inductor: ours
        torch.compile(model, backend="auto", options={"routes": ["inductor"]})(x)
    torch._dynamo.reset()
    # Training: inductor's own, where AOTAutograd writes the entry at the first backward call.
    torch.compile(model, backend="auto")(x).sum().backward()

    def users_inductor(gm, example_inputs):  # backend="inductor", with the spy inside
        with torch._functorch.config.patch(enable_autograd_cache=False):  # a hit would skip the spy
            return compile_fx_module.compile_fx(gm, example_inputs, inner_compile=spy)

    torch.compile(lambda t: t.sin() + 1, backend=users_inductor)(x)
    ours = str((root / "inductor").absolute())
    assert seen[0] == ours
    assert seen[1:3] == [default_cache_dir()] * 2  # forward, then backward (on the first backward call)
    assert seen[3] == default_cache_dir()  # the user's inductor model
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir())
