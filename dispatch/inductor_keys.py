"""Inductor's source keys, answered from our cache.

Before its first cache lookup in a process, inductor hashes the code it runs:
every module file of torch (``torch_key``) and, where triton is installed,
triton's compiler and its shared library (``triton_key``). Both enter the key
of every graph inductor and AOTAutograd cache, so a warm start pays for them
before its first hit, every process: 0.15-0.24 s and 0.56 s (2.1 s with the
files out of the page cache; AMD EPYC, 2 cores). Answered here, hf_bert's
warm first call on plain inductor took 2.0-2.6 s against 3.1-3.5.
Torch keeps each key for the process and has no cache of them across processes.

A key depends only on the files it hashes. Their paths, sizes and modification
times are read here instead, a walk of about 25 ms over torch's 2,286 module
files and triton's 149, and a key computed once is recorded under them; a
later process whose files read the same is given the recorded key (torch's
``prefetchable_cache.set``). Installing, upgrading or editing a file moves its
modification time, and the key is computed again, as inductor computes it:
the rule by which Python itself trusts a ``.pyc`` for its source (size and
modification time), here with the path and the time in nanoseconds.
The walk covers at least the files each key reads: every module file in every
package under torch's and triton's folders, triton's compiled libraries, and
the two files inductor adds to torch's key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from .cache import ArtifactCache, install_key

KIND = "inductor-source-keys"
# Files outside torch's packages that inductor adds to torch's key
# (``torch._inductor.codecache.torch_key``).
TORCH_EXTRA_FILES = ("_inductor/codegen/aoti_runtime/interface.cpp", "_inductor/script.ld")

_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())
_INIT_NAMES = frozenset("__init__" + s for s in _MODULE_SUFFIXES)


def answer_source_keys(cache: ArtifactCache | None) -> None:
    """Give inductor's ``torch_key`` and ``triton_key`` their recorded values where
    the files they hash are unchanged since they were recorded in ``cache``, and
    record those computed here. Once a process per cache; nothing happens
    without a cache, for a key this process already has, or where torch's
    private names moved."""
    if cache is not None:
        _answer_once(cache.root)


@functools.cache
def _answer_once(root: Path) -> None:
    from torch._inductor import codecache

    torch_root = os.path.dirname(torch.__file__)
    sources = {"torch": [torch_root, *(os.path.join(torch_root, f) for f in TORCH_EXTRA_FILES)]}
    triton_root = _triton_root()
    if triton_root is not None:
        sources["triton"] = [triton_root, os.path.join(triton_root, "_C")]
    for name, paths in sources.items():
        key_fn = getattr(codecache, f"{name}_key", None)  # private to torch (2.13)
        if callable(getattr(key_fn, "set", None)):
            _answer(ArtifactCache(root), name, key_fn, paths)


def _answer(cache: ArtifactCache, name: str, key_fn: Any, paths: list[str]) -> None:
    try:
        signature = files_signature(paths)
    except OSError:  # a folder this process cannot read: inductor hashes what it can, as it does
        return
    record_key = hashlib.sha256(json.dumps([name, install_key(), signature]).encode()).hexdigest()
    recorded = _decoded(cache.get_json(KIND, record_key))
    if recorded is not None:
        with contextlib.suppress(RuntimeError):  # this process has the key already
            key_fn.set(recorded)
        return
    try:
        value = key_fn()
    except Exception:  # inductor computes it again where it needs it, and raises there
        return
    if isinstance(value, (bytes, str)):
        cache.put_json(KIND, record_key, _encoded(value))


def _encoded(value: bytes | str) -> dict[str, str]:
    if isinstance(value, bytes):
        return {"type": "bytes", "value": value.hex()}
    return {"type": "str", "value": value}


def _decoded(stored: Any) -> bytes | str | None:
    """The key ``_encoded`` wrote; None for no record, or one that is not such
    (then the key is computed and recorded again)."""
    if not isinstance(stored, dict) or not isinstance(stored.get("value"), str):
        return None
    if stored.get("type") == "str":
        return stored["value"]
    if stored.get("type") == "bytes":
        try:
            return bytes.fromhex(stored["value"])
        except ValueError:
            return None
    return None


def files_signature(paths: list[str]) -> str:
    """A digest of the path, size and modification time of every module file in
    the packages under each folder of ``paths`` (the folder itself, and every
    folder below it with an ``__init__``), of every file directly in a folder
    that is not a package, and of each file in ``paths``."""
    h = hashlib.sha256()
    for path, size, mtime in _stats(paths):
        h.update(f"{path}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


def _stats(paths: list[str]) -> Iterator[tuple[str, int, int]]:
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            yield path, -1, -1  # absent: a file that appears later changes the signature
            continue
        if not stat.S_ISDIR(st.st_mode):
            yield path, st.st_size, st.st_mtime_ns
            continue
        entries = _entries(path)
        if _is_package(entries):
            yield from _package_files(entries)
        else:
            yield from _file_stats(e for e in entries if e.is_file())


def _package_files(entries: list[os.DirEntry[str]]) -> Iterator[tuple[str, int, int]]:
    """The module files of the package whose folder holds ``entries``, then those
    of each package below it; each folder is listed once."""
    yield from _file_stats(e for e in entries if e.is_file() and e.name.endswith(_MODULE_SUFFIXES))
    # Links followed, as pkgutil follows them into a linked package.
    for sub in (e for e in entries if e.is_dir()):
        sub_entries = _entries(sub.path)
        if _is_package(sub_entries):
            yield from _package_files(sub_entries)


def _entries(folder: str) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as listing:
        return sorted(listing, key=lambda e: e.name)


def _file_stats(files: Iterable[os.DirEntry[str]]) -> Iterator[tuple[str, int, int]]:
    for entry in files:
        st = entry.stat()  # a link's target: an edit there moves its time
        yield entry.path, st.st_size, st.st_mtime_ns


def _is_package(entries: list[os.DirEntry[str]]) -> bool:
    # As pkgutil finds packages: a folder with an ``__init__`` module of any suffix.
    return any(e.name in _INIT_NAMES and e.is_file() for e in entries)


def _triton_root() -> str | None:
    """Triton's folder, where inductor would hash it (triton importable)."""
    try:
        from torch._inductor.runtime.triton_compat import HAS_TRITON
    except ImportError:
        return None
    if not HAS_TRITON:
        return None
    import triton

    return os.path.dirname(triton.__file__)
