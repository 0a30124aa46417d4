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
shuffled order, and each block's timed calls come after ``LEAD_CALLS`` untimed
ones of its side: a program's first calls after the other side's ran slowly on
every model measured, whichever side it was, and ORT's by the most. A call
from another thread, a call made inside a timing loop (``timing_loop``:
autotune's, back to back) or a call left untimed breaks the block it falls
in: that block is not counted.

Calls of a graph with symbolic sizes differ in work from one to the next (a
sequence length per request). Each such call then comes with its size (the
log2 of its largest input's element count), and a block is compared only with the other
sides' blocks of the same size class (``SIZE_CLASSES_PER_OCTAVE``): a side
whose blocks fell on the long sequences would lose for them. Where the sizes
seldom repeat, the blocks of all sizes are compared once there are
``UNCLASSED_BLOCKS`` times as many: on a steady mix of sizes the shuffled order
gives each side the same mix, with more spread.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .inspect import META_EXAMPLE_VALUE

# Periods are compared where each side's median period is at most this many
# times its median call; past it the call is under a tenth of what a period
# holds, and the durations decide.
PERIOD_SPAN = 10.0
# Calls a side runs in a row: a callable run k times a model step (a loop body
# behind a graph break) would give one side every period that holds the rest
# of the step, were the sides to alternate call by call; a block of 4 holds
# whole steps for k of 1, 2 and 4.
BLOCK_CALLS = 4
# Calls a block runs on its side, untimed, before its timed calls. Right after
# the other side's block a program runs slowly for a few calls, whoever owns
# the threads (Intel Xeon with AVX-512 and AMX, 2 cores; ORT and eager in turn,
# blocks of 8, medians by place in the block against the program alone):
# timm_vit_tiny on ORT 3.74, 3.55, 3.38, 3.09, then 2.85-2.77 ms (2.63 alone),
# eager 5.96, 5.38, 5.07, 4.87, then 4.76-4.70 (4.58); hf_resnet on ORT 0.77,
# 0.51, 0.41, then 0.40-0.38 (0.38). Timed from a block's first call, ORT's
# slower start cost it the in-place trial on timm_vit_tiny (4.17 ms in place
# against the traced graph's 4.20; settled, it runs 2.6-3.0 ms, and plain
# inductor 3.7). No steady loop of one program pays that start: it is the
# trial's own cost. The lead also takes a side's first calls after a compile.
LEAD_CALLS = 4
#: the calls one block runs: its lead, then its timed calls
BLOCK_LENGTH = LEAD_CALLS + BLOCK_CALLS
# Blocks of calls whose mean size (log2 of an element count) rounds to the same
# multiple of 1/SIZE_CLASSES_PER_OCTAVE are compared with each other: work
# within one class differs by under 2**(1/2) = 1.41x.
SIZE_CLASSES_PER_OCTAVE = 2
# Blocks of all sizes are compared once each side has this many times the
# blocks it would need within classes.
UNCLASSED_BLOCKS = 4
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
    ``BLOCK_LENGTH`` calls at a time: a block runs one side, ``LEAD_CALLS``
    untimed, then ``BLOCK_CALLS`` timed, whose period runs from the first timed
    call's start to the next block's first call's start."""

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
        #: each block's size class (None: calls without a size)
        self.classes: dict[str, list[int | None]] = {side: [] for side in self.sides}
        self._order: list[str] = []
        self._block: _Block | None = None

    def start(self, size: float | None = None) -> float:
        """The start of a timed call (of ``size``, where calls differ in work: the
        log2 of its largest input's element count); it ends the period of a full block before it."""
        now = self.clock()
        block = self._block
        if block is not None and block.thread != threading.get_ident():
            block = self._block = None
        if block is not None and block.calls == BLOCK_LENGTH:
            self.periods[block.side].append((now - block.start) / BLOCK_CALLS)
            self.durations[block.side].append(block.busy / BLOCK_CALLS)
            self.classes[block.side].append(block.size_class())
            block = self._block = None
        if block is None:
            if not self._order:  # each side once per round, rounds shuffled
                self._order = list(self.sides)
                self._random.shuffle(self._order)
            self._block = block = _Block(self._order.pop(), now, threading.get_ident())
        if block.calls == LEAD_CALLS:
            block.start = now
        if block.calls >= LEAD_CALLS:
            block.sizes.append(size)
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
            if block.calls >= LEAD_CALLS:
                block.busy += self.clock() - start
            block.calls += 1

    def interrupt(self) -> None:
        """An untimed call ran: the block it broke is not counted."""
        self._block = None

    def counted(self) -> int:
        """The fewest blocks recorded, over the sides; where calls come with sizes,
        the fewest that another side's blocks of the same size class can be
        compared with, or ``UNCLASSED_BLOCKS`` times fewer of all sizes."""
        classes = self._compared_classes()
        if classes is not None:
            return self._in_classes(classes)
        return self._recorded() // (UNCLASSED_BLOCKS if self._sized() else 1)

    def calls(self) -> dict[str, float]:
        """Each side's median call, its own time alone."""
        return self._medians(self.durations)

    def seconds(self) -> tuple[dict[str, float], str]:
        """Each side's median period per call, or where a period is mostly other
        work (``PERIOD_SPAN``) each side's median call. Also which of the two
        was compared."""
        durations = self.calls()
        periods = self._medians(self.periods)
        if all(periods[s] <= PERIOD_SPAN * durations[s] for s in self.sides):
            return periods, "period"
        return durations, "call"

    def _medians(self, values: dict[str, list[float]]) -> dict[str, float]:
        """Each side's median of ``values``; where calls come with sizes and enough
        blocks share size classes, the geometric mean over those classes of its
        median there, so that each side is judged on the same sizes."""
        classes = self._compared_classes()
        if classes is None:
            return {s: statistics.median_high(values[s]) for s in self.sides}
        medians = {}
        for s in self.sides:
            by_class: dict[int, list[float]] = {}
            for value, size_class in zip(values[s], self.classes[s]):
                if size_class in classes:
                    by_class.setdefault(size_class, []).append(value)
            medians[s] = statistics.geometric_mean(statistics.median_high(v) for v in by_class.values())
        return medians

    def _compared_classes(self) -> set[int] | None:
        """The size classes every side has blocks of, each side judged within
        them; None where the blocks of all sizes are judged together: calls
        without sizes, or too few blocks in shared classes (under one in
        ``UNCLASSED_BLOCKS``)."""
        if not self._sized():
            return None
        shared = set.intersection(*({c for c in self.classes[s] if c is not None} for s in self.sides))
        if shared and self._in_classes(shared) * UNCLASSED_BLOCKS >= self._recorded():
            return shared
        return None

    def _recorded(self) -> int:
        """The fewest blocks recorded, over the sides."""
        return min(len(self.periods[s]) for s in self.sides)

    def _sized(self) -> bool:
        """Whether the calls come with sizes (a block of them has a size class)."""
        return any(c is not None for s in self.sides for c in self.classes[s])

    def _in_classes(self, shared: set[int]) -> int:
        """The fewest blocks in ``shared`` classes, over the sides."""
        return min(sum(c in shared for c in self.classes[s]) for s in self.sides)


def call_size(gm: torch.fx.GraphModule) -> Callable[[Sequence[Any]], float] | None:
    """What a call of Dynamo's graph ``gm`` weighs, for ``CallPeriods.start``: the
    log2 of the element count of its largest input of symbolic shape (a batch of
    sequences, a decoder's cache); None for a graph of static sizes. Not the
    product of its size symbols: a decoding step's many symbols all follow the
    cache's length, and their product split the calls of one length into too
    many classes to compare."""
    positions = [
        i
        for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))
        if isinstance(value := node.meta.get(META_EXAMPLE_VALUE), torch.Tensor)
        and any(isinstance(d, torch.SymInt) for d in value.shape)
    ]
    if not positions:
        return None

    def size(args: Sequence[Any]) -> float:
        return math.log2(max(max(args[i].numel() for i in positions), 1))

    return size


@dataclass
class _Block:
    side: str
    start: float  # the first timed call's, once it starts
    thread: int
    calls: int = 0  # lead and timed
    busy: float = 0.0  # seconds inside the block's timed calls
    sizes: list[float | None] = field(default_factory=list)  # each call's, where calls differ

    def size_class(self) -> int | None:
        """The block's class of mean size (``SIZE_CLASSES_PER_OCTAVE``); None without sizes."""
        sizes = [s for s in self.sizes if s is not None]
        if not sizes:
            return None
        return round(SIZE_CLASSES_PER_OCTAVE * sum(sizes) / len(sizes))
