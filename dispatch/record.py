"""Where compiled graphs are published, so that ``explain`` can collect them.

``recording()`` is a context manager yielding a list that receives a
``GraphRecord`` for every graph compiled while it is open: its plan, as made,
and its regions as they turned out at run time (a route that failed, a
measurement). ``next_graph_index()`` numbers Dynamo graphs within the
innermost recording.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .region import GraphPlan, Region

if TYPE_CHECKING:
    from .stitch import StitchedGraph


class Outcome(Protocol):
    """What a graph's regions turned out to be at run time."""

    def outcome(self) -> list[Region]: ...


@dataclass(frozen=True)
class GraphRecord:
    """One compiled graph: the plan, and what ran it: the stitched program, a kernel
    trial (``kernel_trial.py``), or None for a graph that inductor compiled whole
    with nothing to decide at run time."""

    plan: GraphPlan
    stitched: StitchedGraph | Outcome | None

    @property
    def regions(self) -> list[Region]:
        """The regions as they turned out (the plan's where nothing happened)."""
        return self.plan.regions if self.stitched is None else self.stitched.outcome()

    def outcome(self) -> GraphPlan:
        return replace(self.plan, regions=self.regions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)  # graph, kind, dynamic, ... as the plan says


class PlanRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[tuple[list[GraphRecord], itertools.count]] = []
        self._global = itertools.count()

    @contextmanager
    def recording(self) -> Iterator[list[GraphRecord]]:
        plans: list[GraphRecord] = []
        entry = (plans, itertools.count())
        with self._lock:
            self._open.append(entry)
        try:
            yield plans
        finally:
            with self._lock:
                self._open.remove(entry)

    def next_graph_index(self) -> int:
        with self._lock:
            if self._open:
                return next(self._open[-1][1])
            return next(self._global)

    def publish(self, record: GraphRecord) -> None:
        with self._lock:
            for plans, _ in self._open:
                plans.append(record)


recorder = PlanRecorder()
