"""Timing a choice on the user's own calls: each call's duration, and its period
from its start to the start of the next call.

A route costs the code after it as well as its own call: a thread pool it
woke, torch's OpenMP team left asleep. On the zoo's data_dependent model
(three small Dynamo graphs between torch's indexing ops) each graph's trial,
timed call by call, kept ORT, and the model ran at 1.10-1.27x the time of a
backend that does nothing; judged by periods it ran at 0.99-1.04x (three
processes each; Xeon, 2 cores, 2026-11-29). The period from one call's start
to the next call's start holds what the call leaves behind, so the sides of a
trial are compared by their periods. Where the calls are far apart (a server
idle between requests, a data loader between steps), the period is mostly
other work, whose spread then decides; the durations are compared there
instead. What a graph's own work is (whether inductor is worth compiling for
it) is judged by its calls alone (``calls``).

The sides run in blocks of calls (``BLOCK_CALLS``), each side's blocks in a
shuffled order. A call from another thread, a call made inside a timing loop
(``timing_loop``: autotune's, back to back) or a call left untimed breaks the
block it falls in: that block is not counted.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

# Periods are compared where each side's median period is at most this many
# times its median call; past it the call is under a tenth of what a period
# holds, and the durations decide.
PERIOD_SPAN = 10.0
# Calls a side runs in a row: a callable run k times a model step (a loop body
# behind a graph break) would give one side every period that holds the rest
# of the step, were the sides to alternate call by call; a block of 4 holds
# whole steps for k of 1, 2 and 4.
BLOCK_CALLS = 4
_loop = threading.local()
_SEEDS = itertools.count()


@contextlib.contextmanager
def timing_loop() -> Iterator[None]:
    """Marks this thread's calls as a timing loop's (a candidate called back to
    back, alone): trials on the user's own calls leave them out."""
    depth = getattr(_loop, "depth", 0)
    _loop.depth = depth + 1
    try:
        yield
    finally:
        _loop.depth = depth


def in_timing_loop() -> bool:
    """Whether this thread is inside ``timing_loop``."""
    return getattr(_loop, "depth", 0) > 0


class CallPeriods:
    """The durations and periods of the calls of one trial, by side, a block of
    ``BLOCK_CALLS`` calls at a time: a block runs one side, and its period runs
    from its first call's start to the next block's first call's start."""

    def __init__(self, sides: Sequence[str], clock: Callable[[], float], seed: int | None = None) -> None:
        self.clock = clock
        # Trials that run on the same calls (the regions of one model) each take
        # their own order, so one trial's sides fall on both of the other's.
        self._random = random.Random(next(_SEEDS) if seed is None else seed)
        self.reset(sides)

    def reset(self, sides: Sequence[str]) -> None:
        """Start over with ``sides``: nothing recorded, the chain broken."""
        self.sides = list(sides)
        self.durations: dict[str, list[float]] = {side: [] for side in self.sides}
        self.periods: dict[str, list[float]] = {side: [] for side in self.sides}
        self._order: list[str] = []
        self._block: _Block | None = None

    def start(self) -> float:
        """The start of a timed call; it ends the period of a full block before it."""
        now = self.clock()
        block = self._block
        if block is not None and block.thread != threading.get_ident():
            block = self._block = None
        if block is not None and block.calls == BLOCK_CALLS:
            self.periods[block.side].append((now - block.start) / BLOCK_CALLS)
            self.durations[block.side].append(block.busy / BLOCK_CALLS)
            block = self._block = None
        if block is None:
            if not self._order:  # each side once per round, rounds shuffled
                self._order = list(self.sides)
                self._random.shuffle(self._order)
            self._block = _Block(self._order.pop(), now, threading.get_ident())
        return now

    @property
    def side(self) -> str:
        """The side the call that ``start`` began runs."""
        assert self._block is not None, "start() first"
        return self._block.side

    def end(self, start: float) -> None:
        """The end of the timed call that began at ``start``."""
        block = self._block
        if block is not None:
            block.busy += self.clock() - start
            block.calls += 1

    def interrupt(self) -> None:
        """An untimed call ran: the block it broke is not counted."""
        self._block = None

    def counted(self) -> int:
        """The fewest blocks recorded, over the sides."""
        return min(len(self.periods[s]) for s in self.sides)

    def calls(self, skip: int = 0) -> dict[str, float]:
        """Each side's median call, its own time alone; the first ``skip`` blocks left out."""
        return {s: statistics.median_high(self.durations[s][skip:]) for s in self.sides}

    def seconds(self, skip: int = 0) -> tuple[dict[str, float], str]:
        """Each side's median period per call, or where a period is mostly other
        work (``PERIOD_SPAN``) each side's median call; the first ``skip`` blocks
        of each side left out. Also which of the two was compared."""
        durations = self.calls(skip)
        periods = {s: statistics.median_high(self.periods[s][skip:]) for s in self.sides}
        if all(periods[s] <= PERIOD_SPAN * durations[s] for s in self.sides):
            return periods, "period"
        return durations, "call"


@dataclass
class _Block:
    side: str
    start: float
    thread: int
    calls: int = 0
    busy: float = 0.0  # seconds inside the block's calls
