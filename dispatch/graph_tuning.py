"""Measured routing, whole graph: the routes the regions chose, timed together.

Each region measures its candidates alone, in a loop of its own. In the graph
the regions run between each other's thread pools (an ORT session's workers,
torch's OpenMP team, each waking and spinning on the same cores), and that
cost is invisible to a region timed alone: on the custom-op benchmark model the
regions' winners together ran 1.33x slower than eager. So after the regions
have decided, the whole graph is timed as routed and all on eager, and the
faster wins. The decision is cached like the regions' own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from torch.utils._python_dispatch import _disable_current_modes

from . import autotune
from .cache import ArtifactCache, region_key
from .config import Config
from .stitch import COMPILE_LOCK, StitchedGraph

AS_ROUTED = "as routed"
ALL_EAGER = "all eager"
WHOLE_GRAPH = "whole graph"  # the key of this measurement in each region's ``measured``


class WholeGraphCheck:
    """A stitched inference graph of several regions, under autotune.

    Its first call runs the graph (each region measures and compiles), then
    compares the whole graph as routed with the whole graph on eager, and moves
    every region to eager where that is faster."""

    def __init__(self, stitched: StitchedGraph, config: Config) -> None:
        self.forward = stitched.forward
        self.runners = stitched.runners
        self.cache = ArtifactCache(config.cache_dir)
        self.gm = stitched.gm
        self.pending = config.allows("eager")
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if not self.pending:
            return self.forward(*args)
        with self._lock:
            if self.pending and all(r.read_decision() for r in self.runners):
                # Every region's order is cached: a warm start. Take the cached
                # whole-graph decision before the regions compile, so that a
                # route it moves to eager is never compiled (an Inductor region
                # costs seconds).
                decision = self._cached_decision()
                if decision is not None:
                    self._apply(decision)
                    self.pending = False
            out = self.forward(*args)  # the regions measure and compile
            if self.pending:
                self._decide(args)
                self.pending = False
            return out

    def _key(self) -> str:
        return region_key(self.gm, *(region_key(r.gm, tuple(r.chain)) for r in self.runners))

    def _routed(self) -> bool:
        return any(r.chain[0] != "eager" for r in self.runners)

    def _cached_decision(self) -> dict[str, Any] | None:
        return self.cache.get_json("whole-graph", self._key()) if self._routed() else None

    def _decide(self, args: Sequence[Any]) -> None:
        if not self._routed():
            return
        decision = self._cached_decision()
        if decision is None:
            with _disable_current_modes(), COMPILE_LOCK:
                seconds = autotune.median_call_s({AS_ROUTED: self.forward, ALL_EAGER: self._all_eager}, args)
            decision = {name: autotune.format_seconds(s) for name, s in seconds.items()}
            decision["eager wins"] = seconds[ALL_EAGER] < seconds[AS_ROUTED]
            self.cache.put_json("whole-graph", self._key(), decision)
        self._apply(decision)

    def _apply(self, decision: dict[str, Any]) -> None:
        line = f"{AS_ROUTED} {decision[AS_ROUTED]}, {ALL_EAGER} {decision[ALL_EAGER]}"
        for runner in self.runners:
            runner.run.measured[WHOLE_GRAPH] = line
        if decision["eager wins"]:
            for runner in self.runners:
                if runner.chain[0] != "eager":
                    runner.run_eager(f"slower as a whole graph by measurement: {line}")

    def _all_eager(self, *args: Any) -> Any:
        chosen = [r.swap(r.gm.forward) for r in self.runners]
        try:
            return self.forward(*args)
        finally:
            for r, fn in zip(self.runners, chosen):
                r.swap(fn)
