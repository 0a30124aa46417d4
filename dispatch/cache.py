"""The persistent cache under ``DISPATCH_CACHE_DIR``: routing decisions and artifacts.

    cache = ArtifactCache(config.cache_dir)
    model = cache.get("onnx", key) or cache.put("onnx", key, export())  # bytes-like either way

Entries are keyed by ``region_key``: the region's code, its inputs' shapes,
dtypes and devices, the versions of torch, onnxruntime, onnx, onnxscript,
triton and dispatch, and a digest of dispatch's own code, so neither an upgrade
nor a fix between releases reads an old entry. Each file is
written to a temporary name and renamed into place (atomic: two processes
compiling the same model at once both write whole files, and the last one
wins). A file carries a digest of its payload; a truncated or corrupted entry
is reported once, ignored and rewritten.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import getpass
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.fx

from .inspect import META_STATIC, META_VAL

_MAGIC = b"DISPATCH-CACHE-1\n"
_DIGEST = 32
ENV_INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


class CacheWarning(UserWarning):
    """A cache entry was unreadable; it is ignored and rewritten."""


class ArtifactCache:
    """Bytes and JSON records under ``root/<kind>/<key[:2]>/<key>``.

    A root that is not the user's own, or that others may write, is not
    trusted: it reads as empty and nothing is written to it (one warning)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / key

    def get(self, kind: str, key: str) -> memoryview | None:
        """The entry's payload (a view of the file's bytes: an entry may hold weights)."""
        if not trusted_root(self.root):
            return None
        path = self._path(kind, key)
        try:
            data = memoryview(path.read_bytes())
        except OSError:
            return None
        head, digest, payload = (
            data[: len(_MAGIC)],
            data[len(_MAGIC) : len(_MAGIC) + _DIGEST],
            data[len(_MAGIC) + _DIGEST :],
        )
        if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
            warn_once(
                f"dispatch: cache entry {path} is truncated or corrupted; ignoring it, it will be rewritten"
            )
            return None
        return payload

    def put(self, kind: str, key: str, payload: bytes) -> bytes:
        self.put_parts(kind, key, [payload])
        return payload

    def put_parts(self, kind: str, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Write the payload made of ``parts`` in order, without joining them in memory."""
        if not trusted_root(self.root):
            return
        path = self._path(kind, key)
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        try:
            for directory in (path.parent.parent, path.parent):  # <kind>, then <key[:2]>
                directory.mkdir(mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC)
                f.write(digest.digest())
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)
        except OSError as error:  # a read-only or full disk costs speed, never a result
            warn_once(f"dispatch: cannot write the cache under {self.root}: {error}")

    def get_json(self, kind: str, key: str) -> Any:
        payload = self.get(kind, key)
        return None if payload is None else json.loads(bytes(payload))

    def put_json(self, kind: str, key: str, record: Any) -> None:
        self.put(kind, key, json.dumps(record, sort_keys=True).encode())


@functools.cache
def versions() -> tuple[tuple[str, str], ...]:
    """Versions of everything whose change invalidates an entry."""
    from . import __version__

    found = [("torch", torch.__version__), ("dispatch", __version__)]
    for name in ("onnxruntime", "onnx", "onnxscript", "triton"):
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, "-"))
    return tuple(found)


@functools.cache
def install_key() -> str:
    """This torch install and Python: what a check that loads a library built
    against torch (inductor's ISA probe, an AOTInductor package) depends on
    beyond the library itself."""
    import platform

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    parts = [torch.__version__, torch_lib, sys.executable, platform.machine()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


@functools.cache
def code_digest() -> str:
    """A digest of dispatch's source files: an export or compile made by other
    code (a fixed translation, a changed route) is a miss, whatever the version says."""
    return source_digest(Path(__file__).parent)


def source_digest(package: Path) -> str:
    """A digest of the Python files under ``package``, their paths included."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package).as_posix()).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def region_key(gm: torch.fx.GraphModule, *parts: object) -> str:
    """A key for a region: its code, its inputs' metadata, the versions, and ``parts``."""
    h = hashlib.sha256()
    h.update(gm.code.encode())
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get(META_VAL)
        if isinstance(value, torch.Tensor):
            h.update(f"{tuple(value.shape)}|{value.stride()}|{value.dtype}|{value.device}".encode())
        else:
            h.update(repr(value).encode())
        h.update(b"static" if node.meta.get(META_STATIC) else b"input")
    h.update(repr(versions()).encode())
    h.update(code_digest().encode())
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()


def timing_context() -> tuple[object, ...]:
    """What a timed decision holds under beyond its graph: torch's thread count
    (``torch.set_num_threads``; ORT's pool follows it), the CPU and the vector ISA
    torch's kernels run on (virtual machines name an AVX-512 and an AVX2-only
    host alike, "AMD EPYC"), and the GPUs where CUDA is in use. A decision stored
    under another (a process given one thread, a cache folder shared by two
    machines) is a miss, timed again."""
    gpus: tuple[str, ...] = ()
    if torch.cuda.is_initialized():  # never initialised here: that costs a context
        gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    isa = torch.backends.cpu.get_cpu_capability()
    return ("timed under", torch.get_num_threads(), cpu_name(), isa, gpus)


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tensors_digest(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of tensor values (baked weights are part of an ONNX artifact)."""
    h = hashlib.blake2b(digest_size=20)
    for t in tensors:
        t = t.detach()
        h.update(f"{tuple(t.shape)}|{t.dtype}".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().data)
    return h.hexdigest()


def trusted_root(root: Path) -> bool:
    """Whether the cache under ``root`` may be read and written: a directory of the
    user's own that nobody else can write. Creates it (mode 0700) where missing.
    An untrusted root warns once and reads as empty."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = root.stat()
    except OSError as error:
        warn_once(f"dispatch: cannot write the cache under {root}: {error}; running without a cache")
        return False
    reason = None
    getuid = getattr(os, "getuid", None)  # POSIX only: elsewhere the OS's ACLs decide
    if getuid is not None and status.st_uid != getuid():
        reason = f"it belongs to uid {status.st_uid}, not to this user (uid {getuid()})"
    elif getuid is not None and status.st_mode & 0o022:
        reason = f"others can write it (mode {stat.filemode(status.st_mode)})"
    if reason is None:
        return True
    warn_once(
        f"dispatch: not using the cache directory {root}: {reason}, so an entry there could "
        f"have been written by someone else; running without a cache. Instead: `chmod 700 {root}` "
        "if it is yours, or set DISPATCH_CACHE_DIR (or options['cache_dir']) to a directory of your own"
    )
    return False


@contextlib.contextmanager
def inductor_cache(root: Path, training: bool = False) -> Iterator[None]:
    """Inductor's on-disk cache under ours, for our own inference compiles only.

    A training graph's compiles keep inductor's own directory: AOTAutograd
    writes a training graph's entry after the backward compiles, on the first
    backward call, outside any call of ours, so the lookup on a warm start, the
    FX graph cache and that write must all see one directory.

    The user's own ``backend="inductor"`` models keep inductor's cache: the
    variable is restored on exit, and inductor's in-memory caches that remember
    the directory are cleared on the way in and out, as torch's
    ``temporary_cache_dir`` does. That helper is not used because importing it
    imports all of inductor (0.3 s and more), which a process whose graphs all
    run on ONNX Runtime never needs. A directory the user chose
    (``TORCHINDUCTOR_CACHE_DIR`` set to other than inductor's default) is used
    as it is, and an untrusted root is not used."""
    if training:
        yield
        return
    ours = str((Path(root) / "inductor").absolute())
    chosen = os.environ.get(ENV_INDUCTOR_CACHE)
    if chosen == ours or (chosen and chosen != _inductor_default_dir()):
        yield  # already ours (a nested compile), or the user's choice
        return
    if not trusted_root(Path(root)):
        yield
        return
    _clear_inductor_caches()
    os.environ[ENV_INDUCTOR_CACHE] = ours
    try:
        yield
    finally:
        _clear_inductor_caches()
        if chosen is None:
            os.environ.pop(ENV_INDUCTOR_CACHE, None)
        else:
            os.environ[ENV_INDUCTOR_CACHE] = chosen


def _clear_inductor_caches() -> None:
    """Inductor's caches that remember its directory; none exist before it is imported."""
    utils = sys.modules.get("torch._inductor.utils")
    if utils is not None:
        utils.clear_caches()


def _inductor_default_dir() -> str:
    """Where inductor puts its cache unless told (``cache_dir_utils.default_cache_dir``,
    read without importing inductor where it is not imported yet)."""
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if module is not None:
        return str(module.default_cache_dir())
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


_WARNED: set[str] = set()  # messages already shown in this process


def warn_once(message: str) -> None:
    """Warn with ``message`` unless this process already has."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


_ACTIVE: contextvars.ContextVar[ArtifactCache | None] = contextvars.ContextVar("dispatch_cache", default=None)


def current_cache() -> ArtifactCache | None:
    """The cache of the compilation in progress (None outside one)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(cache: ArtifactCache | None) -> Iterator[None]:
    """Make ``cache`` the one routes read and write while compiling."""
    token = _ACTIVE.set(cache)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
