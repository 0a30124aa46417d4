"""Measured routing, whole graph: the routes the regions chose, timed together.

Each region measures its candidates alone, in a loop of its own. In the graph
the regions run between each other's thread pools (an ORT session's workers,
torch's OpenMP team, each waking and spinning on the same cores), and that
cost is invisible to a region timed alone: on the custom-op benchmark model the
regions' winners together ran 1.33x slower than eager. So after the regions
have decided, the whole graph is timed as routed and all on eager, and the
faster wins.

A graph cut by eager work between ONNX Runtime regions (an op no exporter
knows: a mixture-of-experts layer's grouped matmuls) is timed whole by default,
without autotune: as routed, all on eager, and with its ORT regions on
inductor, whose kernels share torch's threads with the eager ops between them.
Inductor is tried even where ORT beats eager there: in one zoo run of Mixtral, as
routed ran in 0.75 of eager's time and inductor in 0.60.
On Mixtral the ORT regions ran 2x slower in place than alone, and the graph
1.4x slower than inductor's. The decision is cached like the regions' own.
A cut graph whose ORT regions do under ``TIMED_GRAPH_FLOPS`` is left to the
in-place trial (``graph_trial``), as an uncut one is: a custom op between two
64-wide layers (28 µs a call) took 18 s to its first result, inductor's
compile included, against 2.4 s timed in place, where it ran as traced.

Any other CPU inference graph that ONNX Runtime runs is timed too, where it
does enough work for the routes to differ by more than a timer sees: as routed
against all eager and, where ORT did not run it in well under eager's time,
against inductor (where it is not compiled, the decision says so and
``explain`` shows the share that kept it out). ORT is not always the fastest:
on the zoo's layer_graph_break (LayerNorm and a 128-256-128 MLP on 512 rows)
ORT's GEMMs ran the layer in 595 µs, eager in 506 and inductor in 518.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from torch.utils._python_dispatch import _disable_current_modes

from . import autotune
from .cache import ArtifactCache, region_key
from .config import Config
from .planner import availability
from .region import GraphPlan
from .routes import CompiledFn, registry
from .stitch import COMPILE_LOCK, RegionRunner, StitchedGraph, with_region_inputs, with_regions_swapped
from .work import estimated_flops

AS_ROUTED = "as routed"
ALL_EAGER = "all eager"
ON_INDUCTOR = "regions on inductor"  # the regions of routes that cut inductor's graph
WHOLE_GRAPH = "whole graph"  # the key of this measurement in each region's ``measured``
INDUCTOR_UNTRIED = "inductor untried"  # a decision's note: why inductor was not compiled
CUTTING_ROUTE = "onnxrt"  # runs on threads of its own: its regions contend with the eager ones
# An ORT graph below this much work is not timed: it runs in tens of µs, where
# Dynamo's own call dominates and the routes differ by less than a busy
# machine's noise, and timing costs about half a second of its first call.
TIMED_GRAPH_FLOPS = 25_000_000
# Inductor is compiled and timed as well only where ORT ran the graph in more
# than this share of eager's time. Inductor ran the zoo's CPU graphs in 0.6 to
# 0.85 of eager's time, so past it inductor may well win. And a graph timed
# alone flatters ORT: layer_graph_break's layer measured 0.89 to 0.94 of
# eager's time there in three cold starts of five, and ran at 1.11 in the
# model (four weight sets, four sessions); at 1.0 it stayed on ORT, 1.40x
# inductor's time. Below it ORT's
# lead rarely repays a compile of seconds. The price, where it is tried: a
# cold start of hf_bert took 18.5 s against 3.4 (ORT kept by measurement).
INDUCTOR_PAST_EAGER_SHARE = 0.8


def is_cut(stitched: StitchedGraph, config: Config) -> bool:
    """True where ONNX Runtime regions share a graph with eager regions that compute
    (not only views) and inductor may stand in for them."""
    routes = {r.chain[0] for r in stitched.runners}
    if CUTTING_ROUTE not in routes or not config.allows("inductor"):
        return False
    if not availability(registry.get("inductor")).ok:
        return False
    # A region's node_count counts its computing ops, not its views (partition.py).
    return any(r.chain[0] == "eager" and r.plan.node_count for r in stitched.runners)


def whole_graph_check(stitched: StitchedGraph, plan: GraphPlan, config: Config) -> WholeGraphCheck | None:
    """The check that times an inference graph whole on its first call, or None
    where nothing is timed: a multi-region graph under autotune; one cut by
    eager work whose ORT regions do enough work (or an unknown amount: a
    symbolic size); and a CPU graph with ORT regions doing enough work, unless
    the user forced a route or a size is symbolic (one shape's timing need not
    hold for the others)."""
    several = len(plan.regions) > 1
    cut = several and is_cut(stitched, config)
    work = _onnx_work(stitched)
    if (cut and (work is None or work >= TIMED_GRAPH_FLOPS)) or (several and config.autotune):
        return WholeGraphCheck(stitched, config, cut)
    if config.autotune or config.forced or not config.allows("eager") or plan.devices != {"cpu"}:
        return None
    if not work or work < TIMED_GRAPH_FLOPS:
        return None
    inductor = config.allows("inductor") and availability(registry.get("inductor")).ok
    return WholeGraphCheck(stitched, config, inductor_past=INDUCTOR_PAST_EAGER_SHARE if inductor else None)


def _onnx_work(stitched: StitchedGraph) -> int | None:
    """The FLOPs of the graph's ONNX Runtime regions (0 with none); None where a
    region's work is unknown (a symbolic size)."""
    flops = [estimated_flops(r.gm) for r in stitched.runners if r.chain[0] == CUTTING_ROUTE]
    return None if None in flops else sum(f for f in flops if f is not None)


def cutting_regions_on_inductor(
    runners: Sequence[RegionRunner], region_args: dict[str, Sequence[Any]]
) -> tuple[dict[str, CompiledFn], RegionRunner | None]:
    """Each ``CUTTING_ROUTE`` region compiled by inductor on the inputs it ran on
    (``region_args``) and checked against torch, by name; stops at the first that
    fails, returned second (its reason is in its ``measured``), else None."""
    compiled: dict[str, CompiledFn] = {}
    for runner in runners:
        if runner.chain[0] != CUTTING_ROUTE:
            continue
        inputs = region_args.get(runner.plan.name)
        fn = None if inputs is None else runner.candidate("inductor", inputs)
        if fn is None:
            return compiled, runner
        compiled[runner.plan.name] = fn
    return compiled, None


class WholeGraphCheck:
    """A stitched inference graph, timed whole on its first call.

    Its first call runs the graph (each region measures and compiles), then
    times the whole graph as routed against its rivals (all on eager; for a cut
    graph, its ORT regions on inductor too) and moves the regions to the
    fastest. ``inductor_past``: time the ORT regions on inductor as well only
    where as routed took more than this share of eager's time."""

    def __init__(
        self, stitched: StitchedGraph, config: Config, cut: bool = False, inductor_past: float | None = None
    ) -> None:
        self.stitched = stitched
        self.forward = stitched.forward
        self.runners = stitched.runners
        self.cache = ArtifactCache(config.cache_dir)
        self.gm = stitched.gm
        self.autotune = config.autotune
        self.rivals = [ALL_EAGER] if config.allows("eager") else []
        if cut:
            self.rivals.append(ON_INDUCTOR)
        self.inductor_past = inductor_past if self.rivals and not cut else None
        self.pending = bool(self.rivals)
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if not self.pending:
            return self.forward(*args)
        with self._lock:
            if self.pending and (not self.autotune or all(r.read_decision() for r in self.runners)):
                # Every region's order is cached: a warm start. Take the cached
                # whole-graph decision before the regions compile, so that a
                # route it moves away from is never compiled (an Inductor region
                # costs seconds, an ORT export as much).
                decision = self._cached_decision()
                if decision is not None:
                    self._apply(decision, {})
                    self.pending = False
            if not self.pending:
                return self.forward(*args)
            # The regions measure and compile on this call.
            out, region_args = with_region_inputs([self.stitched], lambda: self.forward(*args))
            self._decide(args, region_args)
            self.pending = False
            return out

    def _key(self) -> str:
        parts = (region_key(r.gm, tuple(r.chain)) for r in self.runners)
        past = () if self.inductor_past is None else (f"{ON_INDUCTOR} past {self.inductor_past}",)
        return region_key(self.gm, *parts, *self.rivals, *past)

    def _routed(self) -> bool:
        return any(r.chain[0] != "eager" for r in self.runners)

    def _cached_decision(self) -> dict[str, Any] | None:
        return self.cache.get_json("whole-graph", self._key()) if self._routed() else None

    def _decide(self, args: Sequence[Any], region_args: dict[str, Sequence[Any]]) -> None:
        if not self._routed():
            return
        decision = self._cached_decision()
        compiled: dict[str, CompiledFn] = {}
        if decision is None:
            candidates = {AS_ROUTED: self.forward}
            if ALL_EAGER in self.rivals:
                candidates[ALL_EAGER] = with_regions_swapped(
                    self.runners, {r.plan.name: r.gm.forward for r in self.runners}, self.forward
                )
            if ON_INDUCTOR in self.rivals:
                compiled = self._add_inductor(candidates, region_args)
            seconds = self._timed(candidates, args)
            untried = None
            if self.inductor_past is not None:
                share = seconds[AS_ROUTED] / seconds[ALL_EAGER]
                if share > self.inductor_past:
                    compiled = self._add_inductor(candidates, region_args)
                    if compiled:
                        seconds = self._timed(candidates, args)
                else:
                    untried = (
                        f"inductor not compiled: as routed took {share:.2f} of all eager's time, "
                        f"at most {self.inductor_past} (autotune times it: DISPATCH_AUTOTUNE=1)"
                    )
            decision = {name: autotune.format_seconds(s) for name, s in seconds.items()}
            decision["winner"] = min(seconds, key=lambda name: seconds[name])
            if untried is not None:
                decision[INDUCTOR_UNTRIED] = untried
            self.cache.put_json("whole-graph", self._key(), decision)
        self._apply(decision, compiled)

    def _timed(self, candidates: dict[str, CompiledFn], args: Sequence[Any]) -> dict[str, float]:
        with _disable_current_modes(), COMPILE_LOCK:
            return autotune.median_call_s(candidates, args)

    def _add_inductor(
        self, candidates: dict[str, CompiledFn], region_args: dict[str, Sequence[Any]]
    ) -> dict[str, CompiledFn]:
        """Each ORT region compiled by inductor and checked against torch, added to
        ``candidates`` as one; empty where one fails (the candidate is then not timed)."""
        compiled, failed = cutting_regions_on_inductor(self.runners, region_args)
        if failed is not None:
            return {}
        if compiled:
            candidates[ON_INDUCTOR] = with_regions_swapped(self.runners, compiled, self.forward)
        return compiled

    def _apply(self, decision: dict[str, Any], compiled: dict[str, CompiledFn]) -> None:
        line = ", ".join(
            f"{name} {decision[name]}" for name in (AS_ROUTED, ALL_EAGER, ON_INDUCTOR) if name in decision
        )
        winner = decision["winner"]
        note = f"; {decision[INDUCTOR_UNTRIED]}" if INDUCTOR_UNTRIED in decision else ""
        for runner in self.runners:
            runner.run.measured[WHOLE_GRAPH] = line + note
        reason = f"slower as a whole graph by measurement: {line}"
        for runner in self.runners:
            if winner == ALL_EAGER and runner.chain[0] != "eager":
                runner.run_eager(reason)
            elif winner == ON_INDUCTOR and runner.chain[0] == CUTTING_ROUTE:
                runner.run_on("inductor", reason, compiled.get(runner.plan.name))
