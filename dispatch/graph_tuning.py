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
without autotune: as routed, all on eager, and compiled whole by inductor,
whose kernels share torch's threads with the eager ops, which it calls from
its own program as plain inductor does (where inductor fails the whole graph,
its ORT regions are compiled one by one instead). Inductor is tried where
as routed took more than the share of all eager's time that ``inductor_bar``
sets for what the ORT regions do, as for an uncut graph (here, or left to the
in-place trial, below): Mixtral's and
OLMoE's regions mostly move data (bar 0.5), and as routed ran in 0.74 of
eager's time, inductor in 0.65 and 0.68. On Mixtral the ORT regions ran 2x
slower in place than alone, and the graph 1.4x slower than inductor's; its
ORT regions on inductor one by one, cut four times by the grouped matmuls,
1.10x, and the whole graph on inductor 1.02x (one process, in turn). The
benchmark's custom-op MLP (two ORT regions of 512-wide GEMMs, bar 0.8) ran
as routed in 0.52 of eager's time and compiled inductor in vain before the
bar applied to cut graphs (inductor: 0.99 of eager's time): 10 s to its
first result, against 2.3 s now. The decision is cached like the regions' own,
unless other work held the CPUs while it was timed (``cpu_contention.py``).
A cut graph whose ORT regions do under ``TIMED_GRAPH_FLOPS`` is left to the
in-place trial (``graph_trial``), as an uncut one is: a custom op between two
64-wide layers (28 µs a call) took 18 s to its first result, inductor's
compile included, against 2.4 s timed in place, where it ran as traced.

Any other CPU inference graph that ONNX Runtime runs is timed too, where it
does enough work for the routes to differ by more than a timer sees: as routed
against all eager and, where ORT did not run it in well under eager's time,
against inductor (where it is not compiled, the decision says so and
``explain`` shows the share that kept it out; ``inductor_bar.py`` sets that
share by what the ORT regions do). ORT is not always the fastest: on the
zoo's layer_graph_break (LayerNorm and a 128-256-128 MLP on 512 rows) ORT's
GEMMs ran the layer in 595 µs, eager in 506 and inductor in 518.

Past that share, with the graph as routed still ahead of all eager, inductor is
left to the in-place trial that follows (``leave_inductor_to_trial``), which
compiles the Dynamo graph as plain inductor does on a later call and times it
in place. Compiled here, it was auto's lowered graph, which the trial then
compiled again as plain inductor's: a 12-layer BERT (2x128, as routed at 0.91
of all eager's time) took 26.2 s to its first result, against 10.4 s now and
plain inductor's 9.9 (Intel Xeon, 2 cores), and ran at 150 ms a call either
way. Where all eager leads, inductor is compiled and timed here: moved to
eager, the graph would leave the trial nothing routed to time it against.

The check's "all eager" runs the lowered aten regions eagerly, a stand-in for
the graph as Dynamo traced it that can be far slower than that graph (RAFT-small:
5117 ms against 170 in one process), so what it keeps is then timed in place
against the traced graph (``graph_trial``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from . import autotune
from .cache import ArtifactCache, region_key, timing_context
from .config import Config
from .cpu_contention import NOT_CACHED, ContentionMeter
from .inductor_bar import CUTTING_ROUTE, InductorBar, inductor_past, onnx_work
from .inspect import is_computing_op, is_size_arithmetic
from .planner import availability
from .region import GraphPlan
from .routes import CompiledFn, registry
from .stitch import (
    COMPILE_LOCK,
    StitchedGraph,
    with_region_inputs,
    with_regions_swapped,
)
from .whole_inductor import cutting_regions_on_inductor, run_whole_on_inductor, whole_graph_on_inductor

AS_ROUTED = "as routed"
ALL_EAGER = "all eager"
ON_INDUCTOR = "regions on inductor"  # the regions of routes that cut inductor's graph
WHOLE_ON_INDUCTOR = "whole graph on inductor"  # the graph before the split, one inductor compile
WHOLE_GRAPH = "whole graph"  # the key of this measurement in each region's ``measured``
INDUCTOR_UNTRIED = "inductor untried"  # a decision's note: why inductor was not compiled
NEAR_TIE = "near tie"  # a decision's note: inductor won within INDUCTOR_TIE, not outright
# An ORT graph below this much work is not timed: it runs in tens of µs, where
# Dynamo's own call dominates and the routes differ by less than a busy
# machine's noise, and timing costs about half a second of its first call.
TIMED_GRAPH_FLOPS = 25_000_000
# Inductor takes a near tie with the graph as routed. ORT's pool and torch's
# OpenMP team share the cores there, and what ORT's wake costs the code around
# its calls is not in its time; such a graph's time moves from one process to
# the next (Jamba's, as routed: 2.55 to 6.22 ms in four processes), while
# inductor's program runs on torch's threads alone. A coin toss decided there is
# cached for good: in one of those processes Jamba kept ORT at 2.64 ms against
# inductor's 2.72, and ran 2.17x plain inductor's time (1.40 ms).
INDUCTOR_TIE = 1.05
# Past the bar, where the in-place trial follows, the graph stays as routed for
# it up to this share of all eager's time. The check's as routed is not yet the
# program that runs: an ORT region of the thread trial's band is on the count it
# starts on (the bench's custom_op_mlp, beside an eager custom op: one thread,
# 1.29 of all eager's time), and all eager runs the lowered graph where
# the trial's traced side runs torch's own kernels (TransformerEncoderLayer's
# fused path). There the check compiled the lowered graph on inductor, 9-11 s
# of the first call; beyond this share, the trial's calls as routed cost more.
TRIAL_KEEPS_SHARE = 2.0


def is_cut(stitched: StitchedGraph, config: Config) -> bool:
    """True where ONNX Runtime regions share a graph with eager regions that compute
    (not only views) and inductor may stand in for them."""
    routes = {r.chain[0] for r in stitched.runners}
    if CUTTING_ROUTE not in routes or not config.allows("inductor"):
        return False
    if not availability(registry.get("inductor")).ok:
        return False
    return any(r.chain[0] == "eager" and _computes_tensors(r.gm) for r in stitched.runners)


def _computes_tensors(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` computes a tensor: views only re-describe memory, and size
    arithmetic (``s0 + 1``) is Python's integer math. Mistral's decoding step left
    eager a view it returns and its cache's next length: counted as a cut, each
    cold start compiled the step whole by inductor to time it (5 s to 20 s), for
    ORT to win (111 against 162 µs)."""
    return any(is_computing_op(n) and not is_size_arithmetic(n) for n in gm.graph.nodes)


def whole_graph_check(stitched: StitchedGraph, plan: GraphPlan, config: Config) -> WholeGraphCheck | None:
    """The check that times an inference graph whole on its first call, or None
    where nothing is timed: a multi-region graph under autotune; one cut by
    eager work whose ORT regions do enough work (or an unknown amount: a
    symbolic size); and a CPU graph with ORT regions doing enough work, unless
    the user forced a route or a size is symbolic (one shape's timing need not
    hold for the others)."""
    several = len(plan.regions) > 1
    cut = several and is_cut(stitched, config)
    work = onnx_work(stitched.runners)
    if not cut:
        stitched.whole = None  # only a cut graph is compiled whole: free the copy
    if (cut and (work is None or work >= TIMED_GRAPH_FLOPS)) or (several and config.autotune):
        # Autotune, or a symbolic size, times inductor on a cut graph whatever ORT's share.
        bar = (
            inductor_past(stitched.runners, work)
            if cut and work is not None and not config.autotune
            else None
        )
        return WholeGraphCheck(stitched, config, cut, inductor_past=bar)
    if config.autotune or config.forced or not config.allows("eager") or plan.devices != {"cpu"}:
        return None
    if not work or work < TIMED_GRAPH_FLOPS:
        return None
    if not (config.allows("inductor") and availability(registry.get("inductor")).ok):
        return WholeGraphCheck(stitched, config)
    return WholeGraphCheck(stitched, config, inductor_past=inductor_past(stitched.runners, work))


class WholeGraphCheck:
    """A stitched inference graph, timed whole on its first call.

    Its first call runs the graph (each region measures and compiles), then
    times the whole graph as routed against its rivals (all on eager; for a cut
    graph without ``inductor_past``, the graph compiled whole by inductor too)
    and moves the regions to the fastest (inductor on a near tie with the graph
    as routed, ``INDUCTOR_TIE``). ``inductor_past``: time inductor as
    well only where as routed took more than its share of eager's time (or
    leave it to the in-place trial, ``leave_inductor_to_trial``)."""

    def __init__(
        self,
        stitched: StitchedGraph,
        config: Config,
        cut: bool = False,
        inductor_past: InductorBar | None = None,
    ) -> None:
        self.stitched = stitched
        self.runners = stitched.runners
        self.cache = ArtifactCache(config.cache_dir)
        self.config = config
        self.gm = stitched.gm
        self.autotune = config.autotune
        self.cut = cut
        self.rivals = [ALL_EAGER] if config.allows("eager") else []
        self.inductor_past = inductor_past if self.rivals else None
        if cut and self.inductor_past is None:
            self.rivals.append(ON_INDUCTOR)  # timed whatever ORT's share
        self.pending = bool(self.rivals)
        #: once decided: inductor left uncompiled (by ``inductor_past``, or to the trial), where the
        #: in-place trial (``graph_trial``) then tries it if the traced graph wins
        self.inductor_left_out = False
        #: once decided: the routed program kept, and inductor timed ahead of all eager
        self.kept_routed = False
        #: once decided: the graph moved to inductor, compiled from the lowered graph
        #: (the in-place trial times plain inductor's program of the Dynamo graph against it)
        self.moved_to_inductor = False
        self.inductor_led_eager = False
        #: set by ``leave_inductor_to_trial``
        self.inductor_trial_follows = False
        # The key of the decision, from the routes as planned: a warm start's
        # in-place trial moves the regions to its cached winner before this
        # check's first call, and must not make it measure again.
        self.key = self._key()
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if not self.pending:
            return self.stitched.forward(*args)
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
                return self.stitched.forward(*args)
            # The regions measure and compile on this call.
            out, region_args = with_region_inputs([self.stitched], lambda: self.stitched.forward(*args))
            self._decide(args, region_args)
            self.pending = False
            return out

    def leave_inductor_to_trial(self) -> None:
        """Told by the in-place trial that follows, where it may compile inductor on
        a later call (plain inductor's program of the Dynamo graph, else the graph
        unsplit, else the ORT regions): past the bar, with the graph as routed ahead
        of all eager, the first call then leaves inductor to it instead of
        compiling auto's lowered graph, which the trial would compile again as plain
        inductor's (BERT-base: 26 s to the first result against plain inductor's
        10 s). Where all eager leads, the routed program is kept for the trial up
        to ``TRIAL_KEEPS_SHARE`` of its time; beyond, inductor is compiled here."""
        self.inductor_trial_follows = True

    @property
    def inductor_open(self) -> bool:
        """Once decided: whether the in-place trial still judges inductor where the
        traced graph overturns the routed program kept here (this check left it
        out, by its bar or to the trial, or timed it ahead of the graph all on
        eager, the traced graph's stand-in here)."""
        return self.kept_routed and (self.inductor_left_out or self.inductor_led_eager)

    @property
    def inductor_untimed(self) -> bool:
        """Once decided: the routed program kept, and inductor left out (by the bar,
        or to the trial), never timed (the in-place trial may time it against the
        routed program)."""
        return self.kept_routed and self.inductor_left_out

    def _key(self) -> str:
        parts = (region_key(r.gm, tuple(r.chain)) for r in self.runners)
        past = () if self.inductor_past is None else (f"{ON_INDUCTOR} past {self.inductor_past.share}",)
        whole = (WHOLE_ON_INDUCTOR,) if self.cut and self.stitched.whole is not None else ()
        return region_key(self.gm, *parts, *self.rivals, *past, *whole, timing_context())

    def _routed(self) -> bool:
        return any(r.chain[0] != "eager" for r in self.runners)

    def _cached_decision(self) -> dict[str, Any] | None:
        return self.cache.get_json("whole-graph", self.key) if self._routed() else None

    def _decide(self, args: Sequence[Any], region_args: dict[str, Sequence[Any]]) -> None:
        if not self._routed():
            return
        decision = self._cached_decision()
        compiled: dict[str, CompiledFn] = {}
        if decision is None:
            contention = ContentionMeter()
            candidates = {AS_ROUTED: self.stitched.split_forward}
            if ALL_EAGER in self.rivals:
                candidates[ALL_EAGER] = with_regions_swapped(
                    self.runners,
                    {r.plan.name: r.gm.forward for r in self.runners},
                    self.stitched.split_forward,
                )
            if ON_INDUCTOR in self.rivals:
                compiled = self._add_inductor(candidates, region_args, args)
            seconds = self._timed(candidates, args, contention)
            untried = None
            kept_for_trial = False
            bar = self.inductor_past
            if bar is not None:
                share = seconds[AS_ROUTED] / seconds[ALL_EAGER]
                regions = f" for ORT regions {bar.regions}" if bar.regions else ""
                if share <= bar.share:
                    untried = (
                        f"inductor not compiled: as routed took {share:.2f} of all eager's time, "
                        f"at most {bar.share}{regions} (autotune times it: DISPATCH_AUTOTUNE=1)"
                    )
                elif self.inductor_trial_follows and share < TRIAL_KEEPS_SHARE:
                    kept_for_trial = share >= 1
                    untried = (
                        f"inductor left to the in-place trial: as routed took {share:.2f} of all "
                        f"eager's time, past {bar.share}{regions}; the trial compiles it on a later "
                        "call and times it in place"
                    )
                    if kept_for_trial:
                        untried += (
                            ", and times the graph as routed, its ORT thread counts tried, "
                            "against the traced graph"
                        )
                else:
                    compiled = self._add_inductor(candidates, region_args, args)
                    if compiled:
                        seconds = self._timed(candidates, args, contention)
            decision = {name: autotune.format_seconds(s) for name, s in seconds.items()}
            decision["winner"] = AS_ROUTED if kept_for_trial else _winner(seconds)
            if not kept_for_trial and seconds[decision["winner"]] > min(seconds.values()):
                decision[NEAR_TIE] = (
                    f"{decision['winner']} within {INDUCTOR_TIE - 1:.0%} of the graph as routed, "
                    "a near tie that inductor takes"
                )
            if untried is not None:
                decision[INDUCTOR_UNTRIED] = untried
            if contention.contended():
                decision[NOT_CACHED] = contention.note()
            else:
                self.cache.put_json("whole-graph", self.key, decision)
        self._apply(decision, compiled)

    def _timed(
        self, candidates: dict[str, CompiledFn], args: Sequence[Any], contention: ContentionMeter
    ) -> dict[str, float]:
        with _disable_current_modes(), COMPILE_LOCK, contention.running():
            return autotune.median_call_s(candidates, args)

    def _add_inductor(
        self,
        candidates: dict[str, CompiledFn],
        region_args: dict[str, Sequence[Any]],
        args: Sequence[Any],
    ) -> dict[str, CompiledFn]:
        """Inductor's candidate, checked against torch, added to ``candidates``: for a
        cut graph, the graph compiled whole (``whole_graph_on_inductor``), or where
        that fails, each ORT region compiled by inductor; empty where that fails too
        (the candidate is then not timed)."""
        if self.cut:
            whole, why_not = whole_graph_on_inductor(self.stitched, args, self.config)
            if whole is not None:
                candidates[WHOLE_ON_INDUCTOR] = whole
                return {WHOLE_ON_INDUCTOR: whole}
            for runner in self.runners:
                if runner.chain[0] == CUTTING_ROUTE:
                    runner.run.measured[WHOLE_ON_INDUCTOR] = str(why_not)
        compiled, failed = cutting_regions_on_inductor(self.runners, region_args)
        if failed is not None:
            return {}
        if compiled:
            candidates[ON_INDUCTOR] = with_regions_swapped(
                self.runners, compiled, self.stitched.split_forward
            )
        return compiled

    def _apply(self, decision: dict[str, Any], compiled: dict[str, CompiledFn]) -> None:
        names = (AS_ROUTED, ALL_EAGER, WHOLE_ON_INDUCTOR, ON_INDUCTOR)
        line = ", ".join(f"{name} {decision[name]}" for name in names if name in decision)
        winner = decision["winner"]
        note = f"; {decision[INDUCTOR_UNTRIED]}" if INDUCTOR_UNTRIED in decision else ""
        note += f", {NOT_CACHED} {decision[NOT_CACHED]}" if NOT_CACHED in decision else ""
        for runner in self.runners:
            runner.run.measured[WHOLE_GRAPH] = line + note
        self.inductor_left_out = INDUCTOR_UNTRIED in decision
        self.kept_routed = winner == AS_ROUTED
        self.moved_to_inductor = winner in (WHOLE_ON_INDUCTOR, ON_INDUCTOR)
        self.inductor_led_eager = _inductor_led_eager(decision)
        reason = f"slower as a whole graph by measurement: {line}"
        if NEAR_TIE in decision:
            reason = f"{decision[NEAR_TIE]}: {line}"
        elif winner == WHOLE_ON_INDUCTOR:
            reason = f"compiled whole by inductor with the graph around it, by measurement: {line}"
        if winner == WHOLE_ON_INDUCTOR:
            run_whole_on_inductor(self.stitched, compiled.get(WHOLE_ON_INDUCTOR), reason, self.config)
            return
        if not (self.inductor_trial_follows and self.inductor_open):
            self.stitched.whole = None
        for runner in self.runners:
            if winner == ALL_EAGER and runner.chain[0] != "eager":
                runner.run_eager(reason)
            elif winner == ON_INDUCTOR and runner.chain[0] == CUTTING_ROUTE:
                runner.run_on("inductor", reason, compiled.get(runner.plan.name))


def _inductor_led_eager(decision: dict[str, Any]) -> bool:
    """Whether the check timed inductor faster than the graph all on eager."""
    eager = decision.get(ALL_EAGER)
    timed = [decision[name] for name in (WHOLE_ON_INDUCTOR, ON_INDUCTOR) if name in decision]
    if eager is None or not timed:
        return False
    return min(map(autotune.parse_seconds, timed)) < autotune.parse_seconds(eager)


def _winner(seconds: dict[str, float]) -> str:
    """The fastest candidate, but inductor where it came within ``INDUCTOR_TIE`` of
    the graph as routed."""
    best = min(seconds, key=lambda name: seconds[name])
    if best != AS_ROUTED:
        return best
    for name in (WHOLE_ON_INDUCTOR, ON_INDUCTOR):
        if name in seconds and seconds[name] <= INDUCTOR_TIE * seconds[AS_ROUTED]:
            return name
    return best
