"""How many threads an ONNX Runtime region runs on: one, ORT's pool, or whichever ran faster
on the region's first real calls.

Small regions run on one thread: waking the pool costs more than it
parallelises (crossover 8-9 MFLOP on two AVX-512 cores, set below it since
slower cores cross over earlier; ``benchmarks/README.md``). Larger regions run
on the pool: alone it ran them 1.3x to 1.5x faster than one thread.

In between, the answer depends on what runs around the region, which no work
estimate sees. Torch's OpenMP workers spin after each parallel op (an index, a
linear) for longer than a small call, on the same cores as ORT's workers; on
the data-dependent zoo model (a 8.4 MFLOP region between torch ops) the pool
made one process in two run at 1.9x the time of the next, 118 against 226 µs,
while one thread ran every process at 117-119 µs. So a region in that band
runs its first calls on the pool and on one thread in turn, in the program as
the user runs it, and keeps the pool only where it ran at least 10% faster
there: it takes a core from the code around the region, and on a near tie the
one-thread session is the one that stays fast when the other pools wake. The
band stops at 25 MFLOP: early runs are noisy, and on a 67 MFLOP region
(hf_bert) one process measured the pool at 693 µs against one thread's 734
and then ran 1.55x slower on one thread than the pool runs it. That holds for
a region alone in its graph. A large region between other routes' regions is
tried too: in a mixture-of-experts decoder (91-op ORT regions between eager
expert matmuls) the pool ran a region in 207 µs alone and in 394 µs in place,
where one thread took 393.

The pool has as many threads as torch's own (``torch.set_num_threads``), not
ORT's default of one per physical core: a process told to use one thread (one
of several serving processes, a data-loader worker) ran its ORT regions on
every core of the machine, past what it was given, beside the other processes'
pools. At one thread there is no pool to try.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_BESIDE_OTHER_ROUTES
from ..work import estimated_flops
from .base import CompiledFn

log = logging.getLogger("dispatch")

ONE, POOL, TRIAL = "one", "pool", "trial"

SMALL_REGION_FLOPS = 6_000_000
LARGE_REGION_FLOPS = 25_000_000
# Where a size is symbolic (no flop estimate): one thread below this many
# elements in the largest input, else a trial.
SMALL_REGION_NUMEL = 4096
TRIAL_CALLS = 16  # timed runs per side, after WARM_CALLS untimed runs each
WARM_CALLS = 4
POOL_MARGIN = 0.9  # the pool is kept where it ran in 90% of one thread's time or less


def pool_threads() -> int:
    """The size of a region's ORT pool: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())


def thread_plan(gm: torch.fx.GraphModule, args: Sequence[Any]) -> str:
    """ONE, POOL or TRIAL for a region, by its estimated flops, or where a size is
    symbolic by its largest input. A large region whose graph runs other routes'
    regions too is tried as well: torch's workers, spinning after its ops, take
    the cores the pool would run on."""
    flops = estimated_flops(gm)
    if flops is None:
        return ONE if _largest_numel(args) < SMALL_REGION_NUMEL else TRIAL
    if flops < SMALL_REGION_FLOPS:
        return ONE
    if flops >= LARGE_REGION_FLOPS and not gm.meta.get(META_BESIDE_OTHER_ROUTES):
        return POOL
    return TRIAL


def _largest_numel(args: Sequence[Any]) -> int:
    # Real inputs, never the graph's fake values: comparing a symbolic size would
    # add a guard to Dynamo's shape environment and specialise the graph.
    return max((t.numel() for t in args if isinstance(t, torch.Tensor)), default=0)


class ThreadCountTrial:
    """A region's runner that runs its first calls on ORT's pool and on one thread in
    turn (``build(one_thread)`` makes each session), times each run, then keeps the
    faster session and drops the other.

    The runs are timed where they happen, between whatever the program runs
    around them, so the other thread pools of the process are in the measurement.
    One thread wins a near tie: the pool must pay for the core it takes."""

    def __init__(
        self,
        build: Callable[[bool], CompiledFn],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.build = build
        self.clock = clock
        self.sessions: dict[bool, CompiledFn] = {False: build(False)}
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.chosen: CompiledFn | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        chosen = self.chosen
        if chosen is not None:
            return chosen(*args)
        with self._lock:  # the trial's few calls run one at a time
            if self.chosen is not None:
                return self.chosen(*args)
            one_thread = len(self.times[True]) < len(self.times[False])
            session = self.sessions.get(one_thread)
            if session is None:
                session = self.sessions[one_thread] = self.build(one_thread)
            start = self.clock()
            out = session(*args)
            self.times[one_thread].append(self.clock() - start)
            if min(len(t) for t in self.times.values()) >= WARM_CALLS + TRIAL_CALLS:
                self._settle()
            return out

    def _settle(self) -> None:
        pool, one = (statistics.median_high(self.times[side][WARM_CALLS:]) for side in (False, True))
        one_thread = pool > POOL_MARGIN * one
        self.chosen = self.sessions[one_thread]
        self.sessions = {}  # the other session's memory goes with it
        log.info(
            "onnxrt region: %s (runs measured in place: pool %.1f µs, one thread %.1f µs)",
            "one ORT thread" if one_thread else "ORT's thread pool",
            pool * 1e6,
            one * 1e6,
        )
