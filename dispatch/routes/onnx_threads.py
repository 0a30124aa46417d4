"""How many threads an ONNX Runtime region runs on: one, or whichever of one and
ORT's pool ran the user's program faster on the region's first real calls.

Small regions run on one thread: waking the pool costs more than it
parallelises (crossover 8-9 MFLOP on two AVX-512 cores, set below it since
slower cores cross over earlier; ``benchmarks/README.md``). Larger regions run
on the pool: alone it ran them 1.3x to 1.5x faster than one thread.

The answer depends on what runs around the region, which no work estimate
sees. Torch's OpenMP workers spin after each parallel op (an index, a linear)
for longer than a small call, on the same cores as ORT's workers; on the
data-dependent zoo model (a 8.4 MFLOP region between torch ops) the pool made
one process in two run at 1.9x the time of the next, 118 against 226 µs, while
one thread ran every process at 117-119 µs. And the pool may cost the code
after it: on the graph_break zoo model (two 34 MFLOP regions, each alone in
its Dynamo graph, with eager code and Python between them) one session
measured the model at 951-1062 µs a call with both on the pool and 652-842 µs
on one thread (three processes each; Xeon, 2 cores), and another, on the same
kind of machine, found the two within the spread of its processes. No rule
on size holds both; a measurement in the user's program can.

So every region of 6 MFLOP or more runs its first calls on one thread and on
the pool in turn, in blocks of calls, in the program as the user runs it,
each side judged by its period to the next block (``call_periods.py``), and
the side it started on keeps a near tie: the other must run in 90% of its
time. A region under 25 MFLOP starts on one thread, which stays fast when the
other pools wake; a larger one starts on the pool, which alone ran such
regions 1.3x to 1.5x faster (on hf_bert's 67 MFLOP region one early trial
measured the pool at 693 µs against one thread's 734, and one thread then ran
1.55x slower than the pool, on an AVX2 EPYC), unless other routes' regions
share its graph: in a mixture-of-experts decoder (91-op ORT regions between
eager expert matmuls) the pool ran a region in 207 µs alone and in 394 µs in
place, where one thread took 393.

The pool has as many threads as torch's own (``torch.set_num_threads``), not
ORT's default of one per physical core: a process told to use one thread (one
of several serving processes, a data-loader worker) ran its ORT regions on
every core of the machine, past what it was given, beside the other processes'
pools. At one thread there is no pool to try.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..call_periods import CallPeriods, in_timing_loop
from ..inspect import META_BESIDE_OTHER_ROUTES
from ..work import estimated_flops
from .base import CompiledFn

log = logging.getLogger("dispatch")

# One thread; the pool; a trial with one thread first; a trial with the pool first.
ONE, POOL, TRIAL, POOL_TRIAL = "one", "pool", "trial", "pool trial"

SMALL_REGION_FLOPS = 6_000_000
LARGE_REGION_FLOPS = 25_000_000
# Where a size is symbolic (no flop estimate): one thread below this many
# elements in the largest input, else a trial.
SMALL_REGION_NUMEL = 4096
# Timed blocks of calls per side (call_periods.BLOCK_LENGTH each). A session's
# first runs pay for its allocations: each block's lead leaves them untimed.
TRIAL_BLOCKS = 4
POOL_MARGIN = 0.9  # the side that did not run first wins with 90% of the other's time or less


def pool_threads() -> int:
    """The size of a region's ORT pool: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())


def thread_plan(gm: torch.fx.GraphModule, args: Sequence[Any]) -> str:
    """ONE, TRIAL or POOL_TRIAL for a region, by its estimated flops, or where a
    size is symbolic by its largest input. A large region starts on the pool,
    unless its graph runs other routes' regions too: torch's workers, spinning
    after their ops, take the cores the pool would run on."""
    flops = estimated_flops(gm)
    if flops is None:
        return ONE if _largest_numel(args) < SMALL_REGION_NUMEL else TRIAL
    if flops < SMALL_REGION_FLOPS:
        return ONE
    if flops >= LARGE_REGION_FLOPS and not gm.meta.get(META_BESIDE_OTHER_ROUTES):
        return POOL_TRIAL
    return TRIAL


def _largest_numel(args: Sequence[Any]) -> int:
    # Real inputs, never the graph's fake values: comparing a symbolic size would
    # add a guard to Dynamo's shape environment and specialise the graph.
    return max((t.numel() for t in args if isinstance(t, torch.Tensor)), default=0)


class ThreadCountTrial:
    """A region's runner that runs its first calls on ORT's pool and on one thread in
    turn (``build(one_thread)`` makes each session), times each run where the user
    makes it, then keeps the faster session and drops the other.

    The sides run in blocks of calls, and each is judged by its period, from a
    block's start to the next block's start, per call (``call_periods.py``):
    what the pool costs the code after it counts against it. Calls inside a
    timing loop (the whole-graph check's) run the incumbent untimed. The
    regions of a model try theirs on the same calls: each side's blocks come in
    a shuffled order, so another region's choice falls on both sides alike.
    The incumbent (``pool_first``: the pool, else one thread) keeps a near tie:
    the other side must run in ``POOL_MARGIN`` of its time."""

    def __init__(
        self,
        build: Callable[[bool], CompiledFn],
        clock: Callable[[], float] = time.perf_counter,
        pool_first: bool = False,
    ) -> None:
        self.build = build
        self.incumbent = not pool_first  # one_thread of the session that runs untimed calls
        self.sessions: dict[bool, CompiledFn] = {self.incumbent: build(self.incumbent)}
        self.periods = CallPeriods([POOL, ONE], clock)
        self.chosen: CompiledFn | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        chosen = self.chosen
        if chosen is not None:
            return chosen(*args)
        with self._lock:  # the trial's few calls run one at a time
            if self.chosen is not None:
                return self.chosen(*args)
            if in_timing_loop():
                self.periods.interrupt()
                return self.sessions[self.incumbent](*args)
            start = self.periods.start()
            if self.periods.counted() >= TRIAL_BLOCKS:
                self._settle()
                assert self.chosen is not None
                return self.chosen(*args)
            one_thread = self.periods.side == ONE
            session = self.sessions.get(one_thread)
            if session is None:
                session = self.sessions[one_thread] = self.build(one_thread)
            out = session(*args)
            self.periods.end(start)
            return out

    def _settle(self) -> None:
        seconds, measure = self.periods.seconds()
        pool, one = seconds[POOL], seconds[ONE]
        # The side the trial started on keeps a near tie.
        one_thread = pool > POOL_MARGIN * one if self.incumbent else one < POOL_MARGIN * pool
        self.chosen = self.sessions[one_thread]
        self.sessions = {}  # the other session's memory goes with it
        log.info(
            "onnxrt region: %s (measured in place, %s: pool %.1f µs, one thread %.1f µs)",
            "one ORT thread" if one_thread else "ORT's thread pool",
            measure,
            pool * 1e6,
            one * 1e6,
        )
