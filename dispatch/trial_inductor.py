"""Inductor's side of the in-place trial (``graph_trial.py``): whether a graph
tries it, what it must win by, and what inductor compiles for it.

In order of preference, inductor compiles the Dynamo graph as plain inductor
does (``plain_inductor.py``; it needs the inputs the graph updates in place),
else the graph before its split (``whole_inductor.py``), else the graph's ORT
regions one by one. Where graph_tuning's check already moved the graph to
inductor (compiled from auto's lowered graph), plain inductor's program is the
only one tried: the others are what runs already.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

from .config import Config
from .graph_tuning import AS_ROUTED, ON_INDUCTOR, WHOLE_ON_INDUCTOR, WholeGraphCheck
from .inductor_bar import (
    CUTTING_ROUTE,
    FUSED_AWAY_OPS,
    conv_bound,
    fused_away_ops,
    many_small_ops,
    mostly_loops,
    without_matmuls,
)
from .plain_inductor import PLAIN_INDUCTOR, checked_plain_call
from .routes import CompiledFn
from .stitch import StitchedGraph, with_forward_swapped, with_region_inputs, with_regions_swapped
from .trial_margins import (
    CONV_BOUND_PAST_ROUTED_SHARE,
    INDUCTOR_OVER_ROUTED_MARGIN,
    INDUCTOR_OVER_TRACED_MARGIN,
    INDUCTOR_PAST_ROUTED_SHARE,
    INDUCTOR_TRIAL_S,
    PLAIN_OVER_LOWERED_MARGIN,
)
from .whole_inductor import cutting_regions_on_inductor, whole_graph_on_inductor


class InductorSide:
    """What inductor runs in the trial of one graph, once compiled (``program``:
    a callable for the graph, or the compiled ORT regions by name), and under
    which name (``label``)."""

    def __init__(
        self,
        traced: torch.fx.GraphModule,
        stitched: Sequence[StitchedGraph],
        config: Config,
        whole_check: WholeGraphCheck | None,
        mutated: frozenset[int] | None,
        traced_runs_subgraphs: bool,
        enabled: bool,
    ) -> None:
        self.traced = traced
        self.stitched = list(stitched)
        self.runners = [r for s in stitched for r in s.runners]
        self.config = config
        self.whole_check = whole_check
        #: the inputs the graph updates in place, where known: plain inductor is tried then (once)
        self.mutated = mutated
        #: the traced graph's time overstates its ops' (``trial_margins.runs_subgraphs``)
        self.traced_runs_subgraphs = traced_runs_subgraphs
        #: inductor may stand in for the ORT regions, where the graph is slow for its work
        self.enabled = enabled and any(r.chain[0] == CUTTING_ROUTE for r in self.runners)
        self.label = ON_INDUCTOR
        self.program: dict[str, CompiledFn] | CompiledFn | None = None
        #: why inductor was not compiled in place, where ``tried`` has a reason to show
        self.untried: str | None = None

    def forget(self) -> dict[str, CompiledFn] | CompiledFn | None:
        """``program``, dropped here: the trial has decided, and the winner keeps
        what it runs."""
        program, self.program = self.program, None
        return program

    @property
    def routed_on_inductor(self) -> bool:
        """Whether graph_tuning's check moved the routed program to inductor, compiled
        from auto's lowered graph: plain inductor's program is then the one to try."""
        return self.whole_check is not None and self.whole_check.moved_to_inductor

    def margin(self, leader: str) -> float:
        """What inductor's side must take under, as a share of ``leader``'s time."""
        if leader != AS_ROUTED:
            return INDUCTOR_OVER_TRACED_MARGIN
        return PLAIN_OVER_LOWERED_MARGIN if self.routed_on_inductor else INDUCTOR_OVER_ROUTED_MARGIN

    def _fuses_traced_leader(self, leader: str) -> bool:
        """Whether the traced graph led and inductor would fuse away ``FUSED_AWAY_OPS`` of its ops."""
        return leader != AS_ROUTED and fused_away_ops(self.runners) >= FUSED_AWAY_OPS

    def tried(self, leader: str, leader_s: float, routed_share: float) -> bool:
        """Whether inductor is compiled and timed against ``leader``, by the first
        round's median calls (the graph's own work, not the code after it): the
        leader's (``leader_s``), and the routed program's as a share of the traced
        graph's (``routed_share``)."""
        if not self.enabled:
            return False
        # Under the bar, tried only where mostly loops, then however far ORT leads,
        # or where the traced graph led and inductor would fuse some of its ops away.
        small = leader_s < INDUCTOR_TRIAL_S
        if small and not (mostly_loops(self.runners) or self._fuses_traced_leader(leader)):
            return False
        check = self.whole_check
        if check is not None:
            if check.moved_to_inductor:  # plain inductor against whichever led
                return self.mutated is not None
            if leader != AS_ROUTED:
                return check.inductor_open
            if not check.inductor_untimed:
                return False  # the check timed inductor behind the graph as routed
        if (
            small
            or self.traced_runs_subgraphs
            or many_small_ops(self.runners)
            or without_matmuls(self.runners)
        ):
            return True
        if routed_share < INDUCTOR_PAST_ROUTED_SHARE:
            return False
        if routed_share < CONV_BOUND_PAST_ROUTED_SHARE and conv_bound(self.runners):
            self.untried = (
                f"inductor not compiled in place: as routed took {routed_share:.2f} of the traced "
                f"graph's time, under {CONV_BOUND_PAST_ROUTED_SHARE} for ORT regions bound by "
                "convolutions, which inductor runs as the traced graph does"
            )
            return False
        return True

    def compile(
        self, routed: Callable[..., Any], args: Sequence[Any]
    ) -> tuple[Any, Callable[..., Any] | None, str | None]:
        """This call, run by ``routed``, untimed, and inductor's side compiled for
        its inputs: the result, the side (None where not compiled) and, where
        nothing is left to try, why (the leader then wins).

        The Dynamo graph is compiled as plain inductor would, where the inputs it
        updates are known; where that fails or differs, the next call's inputs
        are what the graph before its split is compiled for (or, where that
        fails, each ORT region, for the region's inputs), unless the graph so
        split runs on inductor already."""
        if self.mutated is not None:
            mutated, self.mutated = self.mutated, None  # tried once
            out, plain, why_not = checked_plain_call(routed, self.traced, args, mutated, self.config)
            if plain is not None:
                self.label, self.program = PLAIN_INDUCTOR, plain
                return out, plain, None
            for runner in self.runners:
                runner.run.measured[PLAIN_INDUCTOR] = str(why_not)
            if self.routed_on_inductor:
                self.label = PLAIN_INDUCTOR
                return out, None, str(why_not)
            return out, None, None  # the next call tries the graph as split
        out, region_args, graph_args = self._routed_recording_inputs(routed, args)
        if graph_args is not None:
            (stitched,) = self.stitched
            whole, why_not = whole_graph_on_inductor(stitched, graph_args, self.config)
            if whole is not None:
                self.program = whole
                self.label = WHOLE_ON_INDUCTOR
                return out, with_forward_swapped(stitched, whole, routed), None
            for runner in self.runners:
                if runner.chain[0] == CUTTING_ROUTE:
                    runner.run.measured[WHOLE_ON_INDUCTOR] = str(why_not)
        compiled, failed = cutting_regions_on_inductor(self.runners, region_args)
        if failed is not None:
            reason = failed.run.measured.get("inductor", "the region did not run")
            return out, None, f"not compiled: {failed.plan.name}: {reason}"
        self.program = compiled
        return out, with_regions_swapped(self.runners, compiled, routed), None

    def _routed_recording_inputs(
        self, routed: Callable[..., Any], args: Sequence[Any]
    ) -> tuple[Any, dict[str, Sequence[Any]], Sequence[Any] | None]:
        """This call, run by ``routed``, with the inputs of each region (by name) and,
        where the graph was kept unsplit, the inputs of the graph itself."""
        kept = [graph for graph in self.stitched if graph.whole is not None]
        if len(self.stitched) != 1 or not kept:
            out, region_args = with_region_inputs(self.stitched, lambda: routed(*args))
            return out, region_args, None
        (stitched,) = kept
        seen: list[Sequence[Any]] = []

        def recording(*graph_args: Any) -> Any:
            seen.append(graph_args)
            return stitched.split_forward(*graph_args)

        recorded = with_forward_swapped(stitched, recording, routed)
        out, region_args = with_region_inputs(self.stitched, lambda: recorded(*args))
        return out, region_args, seen[0] if seen else None
