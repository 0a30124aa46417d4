"""The untimed calls a benchmark cell runs before its first timed batch.

A model in a service or a training loop runs many calls; what a column decides
on its calls (auto's trials: ORT's thread count, a small graph against the
graph as traced, inductor for a graph slow for its work) is decided within its
first ``WARM_UP_CALLS``. Timed before that, a cell reads the trial's sides, not
the program that then runs: the lowered TransformerEncoderLayer ran half its
first 64 calls on one ORT thread (13.8 ms against 7.3 on the pool), and with
batches sized from those calls the bench read it at 9.9 ms.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from dispatch.graph_trial import LONGEST_TRIAL_CALLS

# Past the longest in-place trial of one graph (its thread counts, routed
# against traced, inductor's rounds and one more), and at least the 150 that
# hf_mamba's trial needed to compile inductor.
WARM_UP_CALLS = max(150, LONGEST_TRIAL_CALLS)
WARM_UP_S = 120.0  # a cap for the slowest cells (a training step of seconds)


def warmed_up(fn: Callable[[], Any], sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """``WARM_UP_CALLS`` calls of ``fn`` (or ``WARM_UP_S``), and how long they took:
    ``warm_up_s`` and ``warm_up_calls``. hf_mamba's trial compiles inductor
    around its 80th call, for seconds; a timing budget ran out on that call."""
    start = time.perf_counter()
    calls = 0
    while calls < WARM_UP_CALLS and time.perf_counter() - start < WARM_UP_S:
        fn()
        calls += 1
    sync()
    return {"warm_up_s": time.perf_counter() - start, "warm_up_calls": calls}


def serve_timing_requests(
    fn: Callable[[], Any], sync: Callable[[], None] = lambda: None, out: TextIO | None = None
) -> dict[str, float]:
    """A worker's timing loop (``process.Worker``): each stdin line ``N`` times N
    calls of ``fn`` and answers ``BENCH_TIME seconds`` on ``out`` (stdout where
    None); ``quit`` or the end of stdin ends it. The first request warms up
    first (``warmed_up``), whose times are returned ({} where none came)."""
    out = out or sys.stdout
    warm_up: dict[str, float] = {}
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        n = int(command)
        if not warm_up:
            warm_up = warmed_up(fn, sync)
        sync()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.write(f"BENCH_TIME {time.perf_counter() - start}\n")
        out.flush()
    return warm_up
