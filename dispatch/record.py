"""Where compiled graph plans are published, so that ``explain`` can collect them.

``recording()`` is a context manager yielding a list that receives every
``GraphPlan`` compiled while it is open; ``next_graph_index()`` numbers Dynamo
graphs within the innermost recording.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .region import GraphPlan


class PlanRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[tuple[list[GraphPlan], itertools.count]] = []
        self._global = itertools.count()

    @contextmanager
    def recording(self) -> Iterator[list[GraphPlan]]:
        plans: list[GraphPlan] = []
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

    def publish(self, plan: GraphPlan) -> None:
        with self._lock:
            for plans, _ in self._open:
                plans.append(plan)


recorder = PlanRecorder()
