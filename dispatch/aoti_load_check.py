"""An AOTInductor package loaded first in a child Python, where a crash costs nothing.

On an H200 with torch 2.11 (``benchmarks/results/gpu-h200-20261126-2.md``),
loading the CUDA package that ``dispatch.lower`` had just built ended the
process with a segmentation fault inside torch's package loader, twice, with
nothing printed. A crash in native code cannot be caught, so it took the
user's whole program with it, where a route that fails must fall back for its
region alone. So before a CUDA package is loaded in this process, a fresh
Python loads it (a few seconds, beside the minute AOTInductor takes to build
one); if that child dies or raises, this process does not load the package and
the route fails with the reason, which ``lower`` answers by falling back and
``load`` by a clear error. A package that loaded once is recorded in our cache
by its hash, with the torch and Python that loaded it, so it is not checked
again. CPU packages are not checked: their load has never crashed, and the
child would cost every CPU ``lower`` and ``load`` its seconds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .cache import ArtifactCache, install_key

log = logging.getLogger("dispatch")

KIND = "aoti-load-checks"
#: devices whose packages are loaded in a child first
CHECKED_DEVICES = frozenset({"cuda"})
#: seconds a child may take to load a package
LOAD_TIMEOUT_S = 300

CHILD = """
import sys
from torch._inductor import aoti_load_package
aoti_load_package(sys.argv[1])
"""


def needs_load_check(specs: Mapping[str, Any]) -> bool:
    """Whether a package lowered with ``specs`` is loaded in a child first."""
    return torch.device(str(specs.get("device", "cpu"))).type in CHECKED_DEVICES


def check_package_loads(payload: bytes, cache: ArtifactCache | None) -> None:
    """Load the package ``payload`` (a ``.pt2`` archive's bytes) in a fresh Python;
    raise RuntimeError, with what the child died of, where it does not load.
    ``cache`` records packages that loaded (``dispatch.load`` runs outside any
    compile: the user's cache directory then, as ``auto`` would use)."""
    if cache is None:
        from .config import ENV_CACHE_DIR, default_cache_dir

        cache = ArtifactCache(Path(os.environ.get(ENV_CACHE_DIR) or default_cache_dir()))
    key = _key(payload)
    if cache.get_json(KIND, key) is True:
        return
    with tempfile.TemporaryDirectory(prefix="dispatch-aoti-check-") as folder:
        path = os.path.join(folder, "region.pt2")
        with open(path, "wb") as file:
            file.write(payload)
        try:
            out = subprocess.run(
                [sys.executable, "-X", "faulthandler", "-c", CHILD, path],
                capture_output=True,
                text=True,
                timeout=LOAD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(
                f"inductor: loading the region's AOTInductor package took a fresh Python over "
                f"{LOAD_TIMEOUT_S} s, so it was not loaded in this process"
            ) from error
    if out.returncode == 0:
        cache.put_json(KIND, key, True)
        return
    log.info("the AOTInductor package's load check failed:\n%s", out.stderr[-4000:])
    if out.returncode < 0:
        how = f"died of {signal.Signals(-out.returncode).name}"
    else:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
        how = f"raised {lines[-1][:300] if lines else f'(exit status {out.returncode})'}"
    raise RuntimeError(
        f"inductor: a fresh Python that loaded the region's AOTInductor package {how} "
        f"(torch {torch.__version__}), so it was not loaded in this process, where it "
        "could have ended the program"
    )


def _key(payload: bytes) -> str:
    return hashlib.sha256(hashlib.sha256(payload).digest() + install_key().encode()).hexdigest()
