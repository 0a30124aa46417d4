"""The turn at timing in place that one graph's trial holds at a time
(``graph_trial.py``)."""

from __future__ import annotations

import threading
import weakref
from time import monotonic
from typing import Any


class TrialSlot:
    """Lets one graph's trial alternate at a time in a process.

    The graphs of one model start their trials on the same call. Alternating
    together, each graph's routed calls ran beside the other graphs' routed
    calls, never beside the traced graphs that replace them once decided: on
    data_dependent, the middle graph measured 48 µs routed against 52 as
    traced, and then ran in 61-72 µs routed beside its traced neighbours,
    where as traced it ran in 48-55. So the graphs take turns, each timed beside
    the decisions made before it, and the graphs still waiting run as traced,
    untimed: the state a graph leaves only where that measured faster, so that
    what is kept never makes the model slower than a backend that does nothing.
    A trial whose graph has not been called for ``STALE_S`` loses its turn (a
    graph run once at start-up must not hold the others back), and so does one
    whose graph the waiting graphs' calls outnumber ``STALE_CALLS`` to one: a
    decoder's prompt graph, run once per ``generate``, held the turn for the
    trial's hundred-odd calls while its decoding-step graph, run 31 times as
    often, waited as traced at eager's speed. One whose model is gone loses it
    at once: the turn is held by a weak reference, which keeps no deleted
    model's regions and sessions alive."""

    STALE_S = 1.0
    STALE_CALLS = 16

    def __init__(self) -> None:
        self._owner: weakref.ref[Any] | None = None
        self._seen = 0.0
        self._waited = 0  # the waiting graphs' calls since the owner's last
        self._lock = threading.Lock()

    def take(self, trial: Any) -> bool:
        """True where ``trial`` may time this call (it holds the slot or takes it)."""
        now = monotonic()
        with self._lock:
            owner = self._owner() if self._owner is not None else None
            if (
                owner is not None
                and owner is not trial
                and now - self._seen < self.STALE_S
                and self._waited < self.STALE_CALLS
            ):
                self._waited += 1
                return False
            self._owner, self._seen, self._waited = weakref.ref(trial), now, 0
            return True

    def release(self, trial: Any) -> None:
        with self._lock:
            if self._owner is not None and self._owner() is trial:
                self._owner = None


#: The process's one slot; looked up at each use (``trial_slot.TRIAL_SLOT``), so a test can give itself its own.
TRIAL_SLOT = TrialSlot()
