"""Measured routing: time a region's candidate routes on its real inputs, keep the fastest.

With ``options={"autotune": True}`` (or ``DISPATCH_AUTOTUNE=1``) each region is
compiled by every route that can run it, each result is checked against eager
(dtype-aware tolerance), each correct candidate is timed (warm-up, then the
median of several batches, the candidates taken in turn) and the fastest wins. A time budget per region
bounds the measuring; candidates past it are skipped with that reason. The
decision is stored in the persistent cache, so a second process measures
nothing, unless other work held the CPUs while it was timed (``cpu_contention.py``).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .call_periods import timing_loop
from .cpu_contention import ContentionMeter
from .errors import error_line
from .routes import CompiledFn

BUDGET_S = 30.0  # per region: compiling and timing all candidates
WARMUP_CALLS = 2
BATCHES = 7
BATCH_S = 30e-3  # each timed batch runs at least this long, so timer resolution does not matter
# Before each batch, a pause lets the last candidate's idle workers stop
# spinning (torch's OpenMP team for a few ms; ORT's regions stop theirs as a
# run returns). A long pause cost accuracy: this machine's cores went idle and
# woke slowly. Timing a 256-512-256 MLP (ORT, eager, inductor; back to back
# 213, 259 and 298 µs) four times over: with 100 ms pauses and 10 ms batches ORT
# measured 288 to 583 µs and lost to eager in three of four; with 10 ms pauses
# and 30 ms batches it measured 217 to 230 µs, eager 259 to 276 and inductor
# 288 to 311, in a third of the time (AMD EPYC, 2 cores, 2026-11-25).
PAUSE_S = 0.01
# ...and after the pause, untimed calls wake the candidate's threads again: a
# batch timed straight after a 100 ms sleep measured the 1024-wide MLP's eager
# at 9.5-15.7 ms against 4.4 ms back to back, and its onnxrt at 3.5-9.8 ms
# against 3.1 ms (four processes), so the pick depended on chance. With these
# calls the measured times match back-to-back ones within 10%.
REWARM_CALLS = 2
# Where every candidate's call takes this long, a batch is one call, and that
# call's own length already averages what a batch of short calls would: the
# candidates are timed over ``LONG_CALL_BATCHES`` batches, each woken by one
# call. Seven batches of three calls each cost a 12-layer BERT (2x128, 140-170
# ms a call) 11 s of its 37 s first call, timing three candidates.
LONG_CALL_S = 20e-3
LONG_CALL_BATCHES = 3


@dataclass
class Tuning:
    """The outcome of measuring one region: the winner and a line per candidate."""

    best: str | None = None
    compiled: CompiledFn | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    # Why the timing is not to be cached (other work held the CPUs), else None.
    not_cached: str | None = None

    def ranking(self) -> list[str]:
        return sorted(self.seconds, key=lambda route: self.seconds[route])


def measure(
    candidates: Sequence[str],
    compile_route: Callable[[str], CompiledFn],
    reference: Callable[[], Any],
    args: Sequence[Any],
    budget_s: float | None = None,
    batch_s: float = BATCH_S,
    compare: bool = True,
) -> Tuning:
    """Compile, check and time each candidate; never on fake tensors. ``batch_s``:
    how long each timed batch runs (``median_call_s``). ``compare=False`` where no
    candidate's outputs can match the reference's (they draw random numbers): each
    still runs once before it is timed."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    if any(isinstance(a, torch._subclasses.FakeTensor) for a in args):
        raise RuntimeError("autotune measures real inputs only; these are fake")
    tuning = Tuning()
    expected = reference()
    start = time.perf_counter()
    compiled: dict[str, CompiledFn] = {}
    for route in candidates:
        if time.perf_counter() - start > budget_s:
            tuning.reasons[route] = f"not measured: the measuring budget of {budget_s:.0f} s was spent"
            continue
        try:
            fn = compile_route(route)
            got = fn(*args)
            if compare:
                check_close(expected, got)
        except Exception as error:  # a failing candidate loses; it never breaks the region
            detail = error_line(error)
            tuning.reasons[route] = f"not measured: {detail}"
            continue
        compiled[route] = fn
    contention = ContentionMeter()
    with contention.running():
        tuning.seconds = median_call_s(compiled, args, batch_s)
    if contention.contended():
        tuning.not_cached = contention.note()
    if tuning.seconds:
        tuning.best = tuning.ranking()[0]
        tuning.compiled = compiled[tuning.best]
        best_s = tuning.seconds[tuning.best]
        for route, seconds in tuning.seconds.items():
            if route != tuning.best:
                tuning.reasons[route] = (
                    f"slower by measurement: {format_seconds(seconds)} vs {tuning.best} {format_seconds(best_s)}"
                )
    return tuning


@timing_loop()  # trials timing the user's own calls leave these out
def median_call_s(
    candidates: dict[str, CompiledFn],
    args: Sequence[Any],
    batch_s: float = BATCH_S,
    batches: int = BATCHES,
) -> dict[str, float]:
    """Median seconds per call of each candidate, from batches taken in turn.

    Taking the candidates in turn, round after round, makes drift on a busy
    machine hit all of them alike; the pause before each batch lets the last
    candidate's idle worker threads (ORT's, OpenMP's) stop spinning first, and
    a few untimed calls then wake this candidate's, so that each batch times
    back-to-back calls, as a model serving requests makes them. On CUDA each
    timing waits for the device (a call returns once its kernels are queued).
    Where every candidate's call takes ``LONG_CALL_S`` or more, fewer batches
    and one call to wake each do (``LONG_CALL_BATCHES``)."""
    sync = synchronizer(args)
    calls = {}
    shortest = float("inf")
    for route, fn in candidates.items():
        for _ in range(WARMUP_CALLS):
            fn(*args)
        sync()
        start = time.perf_counter()
        fn(*args)
        sync()
        one = max(time.perf_counter() - start, 1e-7)
        shortest = min(shortest, one)
        calls[route] = max(1, min(1000, int(batch_s / one)))
    rewarm_calls = REWARM_CALLS
    if shortest >= LONG_CALL_S:
        batches, rewarm_calls = min(batches, LONG_CALL_BATCHES), 1
    samples: dict[str, list[float]] = {route: [] for route in candidates}
    for _ in range(batches):
        for route, fn in candidates.items():
            time.sleep(PAUSE_S)
            for _ in range(rewarm_calls):
                fn(*args)
            sync()
            start = time.perf_counter()
            for _ in range(calls[route]):
                fn(*args)
            sync()
            samples[route].append((time.perf_counter() - start) / calls[route])
    return {route: statistics.median_high(v) for route, v in samples.items()}


def synchronizer(args: Sequence[Any]) -> Callable[[], None]:
    """A function that waits for every CUDA device among ``args`` (a no-op on CPU)."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}
    if not devices:
        return lambda: None

    def sync() -> None:
        for device in devices:
            torch.cuda.synchronize(device)

    return sync


def flat_outputs(out: Any) -> list[Any]:
    """A program's outputs as the list ``measure`` compares: a tuple or list as it
    is, a single output in a list of one."""
    return list(out) if isinstance(out, (list, tuple)) else [out]


def check_close(expected: Sequence[Any], got: Sequence[Any]) -> None:
    """Raise where ``got`` differs from eager's ``expected`` beyond the dtype's tolerance."""
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if isinstance(e, torch.Tensor):
            rtol, atol = tolerance(e.dtype)
            torch.testing.assert_close(
                g,
                e,
                rtol=rtol,
                atol=atol,
                check_device=True,
                msg=functools.partial(_differs, i),
            )


def _differs(index: int, message: str) -> str:
    return f"output {index} differs from eager: {message}"


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2, 2e-2
    if dtype == torch.float32:
        return 1e-4, 1e-4
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-7, 1e-7
    return 0.0, 0.0


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def parse_seconds(text: str) -> float:
    """``format_seconds``'s text (a cached decision's) back in seconds."""
    value, unit = text.split()
    return float(value) * {"µs": 1e-6, "ms": 1e-3}[unit]
