"""Inductor's vector-ISA probe, its load checks answered from our cache.

Before its first CPU compile in a process, inductor asks which vector ISAs
work here: for each that the CPU's flags allow (AVX-512 with VNNI, AVX-512,
AVX2 on these machines) it builds a small library with that ISA's flags, then
loads it in a child Python, to catch a compiler or loader that cannot. The
libraries are cached on disk; the six children are not, and they cost about
1 s of every process that compiles a CPU graph with inductor, warm start or
not (AMD EPYC, AVX-512, 2026-11-26: 1.05 s of layer_graph_break's 3.3 s warm
start). Torch has no switch for this short of ``cpp.vec_isa_ok``, which
declares every ISA good and, being inductor config, changes the key of every
cached graph.

A load check's answer depends only on the library it loads, whose file name
is a hash of its code, the compiler's version, the ISA's flags and torch's
version, and on the torch install it links against. So a load that succeeded
once is recorded under that name, and a later process's check of the same
library is answered from the record. Only successes are recorded: a check
that failed or timed out runs again. Inductor keeps the answers for the
process, as it keeps its own.

On an empty inductor cache (a new machine, a new cache folder) the builds come
first, one after another: with AMX and AVX-512, 10 builds of 1.5 s. Each ISA's
checks are independent of the others', so they run at once here, a thread each,
before inductor asks for them.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .cache import ArtifactCache, install_key

KIND = "inductor-isa-loads"

log = logging.getLogger("dispatch")


def probe_vector_isas(cache: ArtifactCache | None, example_inputs: Sequence[Any]) -> None:
    """Run inductor's ISA probe now, for a compile on ``example_inputs``, with the
    load checks recorded in ``cache`` answered from it. Nothing happens for a
    graph with no CPU tensor, off x86 Linux, without a cache, or where the
    process has probed already."""
    if cache is None or sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return
    if not any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in example_inputs):
        return
    from torch._inductor import config, cpu_vec_isa

    # Private to torch (2.13): where another torch lacks these, inductor probes as it does.
    probe: Callable[[Any, str], bool] | None = getattr(cpu_vec_isa.VecISA, "_probe_load", None)
    valid = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    info = getattr(valid, "cache_info", None)
    if probe is None or valid is None or info is None or config.cpp.vec_isa_ok is not None:
        return
    if info().currsize:
        return  # probed already in this process
    key = install_key()
    stored = cache.get_json(KIND, key)
    known: set[str] = set(stored) if isinstance(stored, list) else set()
    loaded: set[str] = set()

    def answered(isa: Any, output_path: str) -> bool:
        name = os.path.basename(output_path)
        ok = (name in known and os.path.isfile(output_path)) or probe(isa, output_path)
        if ok:
            loaded.add(name)
        return ok

    # Torch's own method, swapped for this one call: the probe has no hook.
    setattr(cpu_vec_isa.VecISA, "_probe_load", answered)  # noqa: B010
    try:
        _check_concurrently(cpu_vec_isa)
        valid()
    finally:
        setattr(cpu_vec_isa.VecISA, "_probe_load", probe)  # noqa: B010
    if not loaded <= known:
        cache.put_json(KIND, key, sorted(known | loaded))


def _check_concurrently(cpu_vec_isa: Any) -> None:
    """Check each vector ISA the CPU's flags allow at once, each on a thread of its
    own, before inductor asks for them one after another. A check is compiler
    runs and a child Python that the thread waits on, and the answer is cached
    on the ISA's object, where ``valid_vec_isa_list`` reads it. With AMX and
    AVX-512 that is 10 builds: 15 to 17 s in a row on a Xeon of 2 cores. Where
    torch's private names moved, or a check raises, inductor checks as it does."""
    supported = getattr(cpu_vec_isa, "supported_vec_isa_list", None)
    cpu_flags = getattr(cpu_vec_isa, "x86_isa_checker", None)
    if supported is None or cpu_flags is None:
        return
    flags = set(cpu_flags())
    isas = [isa for isa in supported if all(flag in flags for flag in str(isa).split())]
    if len(isas) < 2:
        return
    workers = min(len(isas), max(2, os.cpu_count() or 1))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dispatch-isa") as pool:
            list(pool.map(bool, isas))
    except Exception as error:  # torch's checks catch their own failures; this is a surprise
        log.debug("inductor: checking the vector ISAs at once failed (%s); inductor checks them", error)
