"""Inductor's source keys (``torch_key``, ``triton_key``): computed and recorded in
one process, answered from our cache in the next while the files they hash are
unchanged, computed again once one changes."""

import os
import subprocess
import sys
import textwrap

import pytest

from dispatch.cache import ArtifactCache
from dispatch.inductor_keys import _answer, files_signature

# Torch's settable cache of a key (2.13); an older torch computes its keys as it does.
prefetchable_cache = getattr(pytest.importorskip("torch.utils._functools"), "prefetchable_cache", None)
pytestmark = pytest.mark.skipif(prefetchable_cache is None, reason="this torch has no settable key cache")


def _key_fn(value: bytes, calls: list[bytes]):
    def compute() -> bytes:
        calls.append(value)
        return value

    return prefetchable_cache(compute)


def _tree(tmp_path):
    """A package with a subpackage, a plain folder and a non-module file."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "lib").mkdir()
    for path, text in [
        ("__init__.py", ""),
        ("core.py", "x = 1\n"),
        ("sub/__init__.py", ""),
        ("sub/deep.py", "y = 2\n"),
        ("lib/native.bin", "binary"),
        ("notes.txt", "not a module"),
    ]:
        (pkg / path).write_text(text)
    return pkg


def test_a_key_is_answered_from_the_record_until_a_file_it_hashes_changes(tmp_path):
    pkg = _tree(tmp_path)
    cache = ArtifactCache(tmp_path / "cache")
    paths = [str(pkg), str(pkg / "lib")]
    first_calls: list[bytes] = []
    first = _key_fn(b"computed", first_calls)
    _answer(cache, "pkg", first, paths)
    assert first() == b"computed" and first_calls == [b"computed"]

    # A later process: its own computation would give another value, and never runs.
    later_calls: list[bytes] = []
    later = _key_fn(b"computed again", later_calls)
    _answer(cache, "pkg", later, paths)
    assert later() == b"computed" and later_calls == []

    os.utime(pkg / "sub" / "deep.py", ns=(1, 1))  # an edit of a subpackage's module
    edited_calls: list[bytes] = []
    edited = _key_fn(b"after the edit", edited_calls)
    _answer(cache, "pkg", edited, paths)
    assert edited() == b"after the edit" and edited_calls == [b"after the edit"]


def test_the_signature_follows_module_files_in_packages_and_every_file_in_a_plain_folder(tmp_path):
    pkg = _tree(tmp_path)
    paths = [str(pkg), str(pkg / "lib"), str(pkg / "extra.ld")]
    before = files_signature(paths)
    (pkg / "notes.txt").write_text("edited, and not a module: torch's key never reads it")
    assert files_signature(paths) == before
    changes = [
        lambda: (pkg / "core.py").write_text("x = 10\n"),  # another size
        lambda: os.utime(pkg / "core.py", ns=(5, 5)),  # same size, another time
        lambda: (pkg / "sub" / "new.py").write_text(""),  # a new module
        lambda: (pkg / "lib" / "native.bin").write_text("rebuilt library"),
        lambda: (pkg / "extra.ld").write_text("appeared"),  # a named file, absent before
    ]
    seen = {before}
    for change in changes:
        change()
        signature = files_signature(paths)
        assert signature not in seen
        seen.add(signature)


CHILD = textwrap.dedent(
    """
    import sys
    import torch
    from torch._inductor import codecache
    from torch._inductor.runtime import triton_compat
    computed = []
    real_hash = codecache.build_code_hash
    def counted_hash(roots, prefix, hasher):
        if prefix == "":
            computed.append("torch")
        return real_hash(roots, prefix, hasher)
    codecache.build_code_hash = counted_hash
    if triton_compat.HAS_TRITON:
        real_triton = triton_compat.triton_key
        def counted_triton():
            computed.append("triton")
            return real_triton()
        triton_compat.triton_key = counted_triton
    from dispatch.cache import ArtifactCache
    from dispatch.inductor_keys import answer_source_keys
    answer_source_keys(ArtifactCache(sys.argv[1]))
    print("TORCH", codecache.torch_key().hex())
    print("TRITON", codecache.triton_key())
    print("COMPUTED", sorted(set(computed)))
    """
)


def _child(cache: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", CHILD, cache], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ")[0].isupper())


def test_a_fresh_process_is_given_the_keys_the_first_computed(tmp_path):
    cache = str(tmp_path / "cache")
    first, second = _child(cache), _child(cache)
    assert first["COMPUTED"] != "[]"  # torch's key at least, as inductor computes it
    assert second["COMPUTED"] == "[]"
    assert (second["TORCH"], second["TRITON"]) == (first["TORCH"], first["TRITON"])


def test_a_malformed_record_is_computed_and_recorded_again(tmp_path, monkeypatch):
    pkg = _tree(tmp_path)
    cache = ArtifactCache(tmp_path / "cache")
    _answer(cache, "pkg", _key_fn(b"first", []), [str(pkg)])
    real_get = cache.get_json
    monkeypatch.setattr(cache, "get_json", lambda kind, key: {"type": "bytes", "value": "not hex"})
    calls: list[bytes] = []
    again = _key_fn(b"computed", calls)
    _answer(cache, "pkg", again, [str(pkg)])
    assert again() == b"computed" and calls == [b"computed"]
    monkeypatch.setattr(cache, "get_json", real_get)
    later = _key_fn(b"unused", [])
    _answer(cache, "pkg", later, [str(pkg)])
    assert later() == b"computed"  # the record was written anew


def test_an_edit_inside_a_linked_package_changes_the_signature(tmp_path):
    pkg = _tree(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "__init__.py").write_text("")
    (elsewhere / "mod.py").write_text("z = 3\n")
    (pkg / "linked").symlink_to(elsewhere, target_is_directory=True)  # pkgutil walks into it too
    before = files_signature([str(pkg)])
    (elsewhere / "mod.py").write_text("z = 30\n")
    assert files_signature([str(pkg)]) != before
