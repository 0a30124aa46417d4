"""A CPU inference graph, its routes against the graph as Dynamo traced it,
timed in place on the user's own calls.

A graph that does little work runs in tens of µs, where ONNX Runtime's call,
AOTAutograd's wrapper and the wake of a thread pool cost as much as the ops
save, and a graph timed alone misleads: on the zoo's data_dependent model each
graph ran faster on ORT alone, while in the model, between torch's indexing
ops, the model ran 300 µs a call on ORT against 220 for a backend that does
nothing. So once its regions have compiled and settled their thread counts, a
graph's calls alternate between the routed program and the Dynamo graph in
blocks, and the routed program stays only where its median period, from a
block's start to the next block's start, per call (``call_periods.py``: what
the calls cost the code after them, the pools they woke, counts), took under
``ROUTED_MARGIN`` of the traced graph's. Every call is a real call, run once, so
graphs that mutate their inputs or draw random numbers are timed as safely as
any other. Not timed: a forced route, eager not allowed, autotune. A graph
of symbolic sizes is timed too, each block of calls against the other sides'
blocks of its size class (``call_periods.py``): left to ORT untimed, a LLaMA-style
decoder called with four sequence lengths ran at 1.30-1.62x plain inductor's
time, and BERT at 1.13-1.24x. A round timed while other work held the CPUs
(``cpu_contention.py``) is thrown away and timed once more; the decision is
cached, unless the rounds it rests on were so timed.

A graph that ``graph_tuning`` timed whole on its first call is timed in place
too: that check's eager side runs the lowered aten regions, not the graph
Dynamo traced, and the two can differ by far (RAFT-small: 5117 ms against 170).
Inductor is then compiled in place where the traced graph led and the check
left inductor out (by its bar, or to this trial), or timed it ahead of all
eager; and where the routed program led, not far ahead of the traced graph,
and the check left inductor out: a graph timed in a loop of its own flatters ORT
(LLaMA-style decoder: 1.47 ms as routed in the check, 2.23 in place, where
plain inductor ran it in 1.59).

A graph that takes ``INDUCTOR_TRIAL_S`` or more a call on the faster side and
may be bound by its count of ops (ORT not far ahead of the traced graph, and
nearer still where its ORT regions are bound by convolutions, which inductor
runs as the traced graph does; many small ops or no matmul in its ORT regions;
or a traced higher-order op), or a faster one whose ORT regions are mostly
ops inductor fuses into loops, or one the traced graph led where inductor
would fuse some of its ops away (auto would run it at the floor), goes on: on
a later call the Dynamo graph is compiled as plain inductor compiles it
(``plain_inductor.py``), else the graph before its split, else its ORT regions
one by one (``trial_inductor.py``), and that is timed in turn against the
leader, each side judged by its better round (``trial_margins.inductor_wins``).
Where the check moved the graph to inductor, it compiled auto's lowered graph:
plain inductor's program of the Dynamo graph is then timed against whichever
led, and takes a near tie from the lowered one. The measurements behind each
rule are in ``benchmarks/README.md`` ("The in-place trial").

ORT and torch may round a value differently in its last bit, and Dynamo
guards the code after an ``.item()`` graph break on the exact value read: a
trial there can make Dynamo compile that code once more, for the other value.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import torch
import torch.fx

from . import autotune, trial_slot
from .cache import ArtifactCache, region_key, timing_context
from .call_periods import BLOCK_LENGTH, CallPeriods, call_size, in_timing_loop
from .config import Config
from .cpu_contention import NOT_CACHED, ContentionMeter
from .graph_tuning import (
    AS_ROUTED,
    INDUCTOR_UNTRIED,
    ON_INDUCTOR,
    WHOLE_ON_INDUCTOR,
    WholeGraphCheck,
)
from .inductor_bar import CUTTING_ROUTE
from .plain_inductor import PLAIN_INDUCTOR, plain_on_first_call
from .planner import availability
from .region import GraphPlan
from .routes import registry
from .routes.onnx_threads import TRIAL_BLOCKS as THREAD_TRIAL_BLOCKS
from .stitch import StitchedGraph
from .trial_inductor import InductorSide
from .trial_margins import (
    EXTRA_INDUCTOR_ROUNDS,
    INDUCTOR_OVER_TRACED_MARGIN,
    ROUTED_MARGIN,
    inductor_wins,
    runs_subgraphs,
    traced_won_note,
)
from .whole_inductor import run_whole_on_inductor

log = logging.getLogger("dispatch")

AS_TRACED = "as traced"
IN_PLACE = "in place"  # the key of this measurement in each region's ``measured``
# The routed program runs alone for its first calls: the first compiles its
# regions, and ORT regions then try their thread counts
# (onnx_threads.ThreadCountTrial) over this many calls, the last period ending
# as the next call starts.
ROUTED_FIRST_CALLS = 2 + 2 * BLOCK_LENGTH * THREAD_TRIAL_BLOCKS
TIMED_BLOCKS = 4  # timed blocks of each side (call_periods.BLOCK_LENGTH calls each)
#: a round's calls, with the call after it, that decides it
ROUND_CALLS = 2 * BLOCK_LENGTH * TIMED_BLOCKS + 1
# Rounds of a trial timed again because other work held the CPUs while they
# were timed (``cpu_contention``). Such a round misleads the process that
# applies it, not only the cache: beside two busy processes hf_resnet's trial
# read ORT at 5.05 ms, as traced 3.62 and plain inductor 3.09, and kept plain
# inductor (1075 µs a call on the quiet machine, against 360 on ORT; Xeon).
# With two busy processes through its first round alone (AMD EPYC, 2 cores),
# the round timed again read ORT at 460-615 µs and as traced 1.94-2.29 ms (four
# processes), and the decision was cached; before, it was taken on the busy
# round (3.22 against 5.66 ms) and the next process timed it again.
CONTENDED_RETIMES = 1
#: the calls one graph's trial takes at most: against the traced graph, then inductor's rounds
LONGEST_TRIAL_CALLS = ROUTED_FIRST_CALLS + ROUND_CALLS * (2 + EXTRA_INDUCTOR_ROUNDS + CONTENDED_RETIMES)
_KIND = "in-place-trial"
TRACED_WON = "traced won"  # a decision's note: why the routed program lost to the traced graph
#: a decision's note: the routed program ran on inductor (graph_tuning's check moved it there)
ROUTED_ON_INDUCTOR = "routed on inductor"


def in_place_trial(
    routed: Callable[..., Any],
    traced: torch.fx.GraphModule,
    stitched: Sequence[StitchedGraph],
    plans: Sequence[GraphPlan],
    config: Config,
    whole_check: WholeGraphCheck | None,
    mutated: frozenset[int] | None = None,
) -> Callable[..., Any]:
    """What Dynamo calls for an inference graph whose regions are not all eager:
    ``routed``, or an ``InPlaceTrial`` of it against the Dynamo graph ``traced``
    where the graph qualifies (module docstring; ``whole_check``: graph_tuning's,
    where it times the graph whole on its first call, and owns the unsplit
    graph; ``mutated``: the positions of the inputs ``traced`` updates in place,
    where AOTAutograd told them). A cached decision is applied at once."""
    if not _qualifies(plans, config):
        if whole_check is None:
            _free_unsplit(stitched)
        return routed
    inductor = config.allows("inductor") and availability(registry.get("inductor")).ok
    trial = InPlaceTrial(
        routed,
        traced,
        stitched,
        ArtifactCache(config.cache_dir),
        inductor=inductor,
        config=config,
        whole_check=whole_check,
        traced_runs_subgraphs=runs_subgraphs(traced),
        mutated=mutated,
    )
    if not trial.inductor_side.enabled and whole_check is None:
        _free_unsplit(stitched)
    settled = trial.settled()
    if settled is None and trial.inductor_side.enabled and whole_check is not None:
        whole_check.leave_inductor_to_trial()
    return settled or trial


def _free_unsplit(stitched: Sequence[StitchedGraph]) -> None:
    """Drop the copies of the graphs before their split: nothing compiles them whole."""
    for graph in stitched:
        graph.whole = None


def _qualifies(plans: Sequence[GraphPlan], config: Config) -> bool:
    if config.forced or config.autotune or not config.allows("eager"):
        return False
    return all(p.devices == {"cpu"} for p in plans)


class InPlaceTrial:
    """Runs a graph's calls on the routed program alone for ``ROUTED_FIRST_CALLS``,
    then on the traced graph and the routed program in turn, in blocks of calls
    timed by their periods (``call_periods.py``; as traced while another graph's
    trial holds the turn), and keeps the faster (``decide``); where that one is
    slow for its work, its graph compiled by inductor is timed against it in
    turn as well: the Dynamo graph as plain inductor compiles it
    (``plain_inductor.py``), where it compiles and matches, else the graph
    before its split, else its ORT regions."""

    def __init__(
        self,
        routed: Callable[..., Any],
        traced: torch.fx.GraphModule,
        stitched: Sequence[StitchedGraph],
        cache: ArtifactCache,
        clock: Callable[[], float] | None = None,
        inductor: bool = False,
        config: Config | None = None,
        whole_check: WholeGraphCheck | None = None,
        traced_runs_subgraphs: bool = False,
        mutated: frozenset[int] | None = None,
    ) -> None:
        self.sides = {AS_ROUTED: routed, AS_TRACED: traced.forward}
        self.traced = traced
        self.config = config or Config()
        self.whole_check = whole_check
        self.stitched = list(stitched)
        self.runners = [r for s in stitched for r in s.runners]
        self.inductor_side = InductorSide(
            traced, stitched, self.config, whole_check, mutated, traced_runs_subgraphs, inductor
        )
        self.cache = cache
        self.key = region_key(
            stitched[0].gm,
            *(s.gm.code for s in stitched[1:]),
            *(region_key(r.gm, tuple(r.chain)) for r in self.runners),
            IN_PLACE,
            timing_context(),
        )
        self.clock = clock or perf_counter
        # Runs while the sides are timed, not while the trial compiles or waits its turn.
        self.contention = ContentionMeter()
        self.round_began = self.contention.mark()  # where the round being timed began
        self.retimed = 0  # rounds timed again (``CONTENDED_RETIMES``)
        self.calls = 0
        self.timing = [AS_TRACED, AS_ROUTED]  # the sides timed in turn
        self.periods = CallPeriods(self.timing, self.clock)
        self.size = call_size(traced)  # where calls differ in work: what each weighs
        self.first_round: dict[str, float] = {}  # the medians of routed against traced
        self.rounds: dict[str, list[float]] = {}  # inductor's and the leader's medians, by round
        self.leader: str | None = None  # the faster of those two, once timed
        self.chosen: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def settled(self) -> Callable[..., Any] | None:
        """The winner, where the decision is cached (a warm start), else None."""
        decision = self.cache.get_json(_KIND, self.key)
        inductor = (ON_INDUCTOR, WHOLE_ON_INDUCTOR, PLAIN_INDUCTOR)
        winners = (*self.sides, *inductor) if self.inductor_side.enabled else tuple(self.sides)
        if decision is None or decision.get("winner") not in winners:
            return None
        self._apply(decision, cached=True)
        return self.chosen

    def __call__(self, *args: Any) -> Any:
        chosen = self.chosen
        if chosen is not None:
            return chosen(*args)
        with self._lock:  # the trial's calls run one at a time
            if self.chosen is not None:
                return self.chosen(*args)
            self.calls += 1
            if self.calls <= ROUTED_FIRST_CALLS or in_timing_loop():
                self._untimed()
                return self.sides[AS_ROUTED](*args)
            if not trial_slot.TRIAL_SLOT.take(self):
                # Waiting for its turn, the graph runs as a backend that does nothing
                # would run it: the graph whose turn it is measures its routes beside
                # that, not beside undecided ORT calls whose cost to the code around
                # them it would pay on both of its sides (``trial_slot.py``).
                self._untimed()
                return self.sides[AS_TRACED](*args)
            if ON_INDUCTOR in self.timing and ON_INDUCTOR not in self.sides:
                self._untimed()
                return self._compile_on_inductor(args)
            self.contention.resume()
            start = self.periods.start(self.size(args) if self.size is not None else None)
            if self.periods.counted() >= TIMED_BLOCKS:
                self.decide()
                if self.chosen is not None:
                    trial_slot.TRIAL_SLOT.release(self)
                    return self.chosen(*args)
                if ON_INDUCTOR in self.timing and ON_INDUCTOR not in self.sides:
                    # inductor's round starts with the call that compiles it
                    return self._compile_on_inductor(args)
                self._untimed()  # and another round with the next call
                return self.sides[self.leader or AS_ROUTED](*args)
            out = self.sides[self.periods.side](*args)
            self.periods.end(start)
            return out

    def _untimed(self) -> None:
        """This call is not timed: the block it breaks is not counted, nor its wait for a CPU."""
        self.periods.interrupt()
        self.contention.pause()

    def decide(self) -> None:
        """Keep the routed program where its median call took under its margin
        (``_routed_margin``) of the traced graph's, else the traced graph; where that leader took
        ``INDUCTOR_TRIAL_S`` or more, time its ORT regions on inductor against it
        first (the next calls). Store the decision."""
        if all(r.chain[0] == "eager" for r in self.runners):
            # Every region fell back on its first call: nothing left to compare.
            self.chosen = self.sides[AS_ROUTED]
            return
        if self._retimes_round():
            return
        seconds, _ = self.periods.seconds()
        if self.leader is None:
            self.first_round = seconds
            routed_won = seconds[AS_ROUTED] < self._routed_margin() * seconds[AS_TRACED]
            self.leader = AS_ROUTED if routed_won else AS_TRACED
            calls = self.periods.calls()
            share = calls[AS_ROUTED] / calls[AS_TRACED]
            if self.inductor_side.tried(self.leader, calls[self.leader], share):
                self.timing = [ON_INDUCTOR, self.leader]
                self.rounds = {ON_INDUCTOR: [], self.leader: [seconds[self.leader]]}
                self.periods.reset(self.timing)
                return
            self._finish(self.leader)
            return
        margin = self.inductor_side.margin(self.leader)
        self.rounds[ON_INDUCTOR].append(seconds[ON_INDUCTOR])
        self.rounds[self.leader].append(seconds[self.leader])
        faster = inductor_wins(self.rounds[ON_INDUCTOR], self.rounds[self.leader], margin)
        if faster is None:  # the round and the better rounds disagree: one more round
            self.periods.reset(self.timing)
            return
        self.first_round[self.leader] = min(self.rounds[self.leader])
        self._finish(
            ON_INDUCTOR if faster else self.leader, autotune.format_seconds(min(self.rounds[ON_INDUCTOR]))
        )

    def _retimes_round(self) -> bool:
        """Whether the round just timed is thrown away and timed again: other work
        held the CPUs while it was timed, and no round has been timed again yet.
        Its wait no longer counts against caching the decision."""
        contended = self.contention.contended(since=self.round_began)
        retime = contended and self.retimed < CONTENDED_RETIMES
        if retime:
            self.retimed += 1
            self.contention.discard(self.round_began)
            self.periods.reset(self.timing)
            log.info("graph in-place trial: a round timed while other work held the CPUs, timed again")
        self.round_began = self.contention.mark()
        return retime

    def _routed_margin(self) -> float:
        """What the routed program must win by: ``ROUTED_MARGIN`` where ORT regions
        wake their thread pools, else inductor's (the check moved them there)."""
        wakes_pools = any(r.chain[0] == CUTTING_ROUTE for r in self.runners)
        return ROUTED_MARGIN if wakes_pools else INDUCTOR_OVER_TRACED_MARGIN

    def _finish(self, winner: str, on_inductor: str | None = None) -> None:
        decision: dict[str, Any] = {side: autotune.format_seconds(s) for side, s in self.first_round.items()}
        label = self.inductor_side.label
        if on_inductor is not None:
            decision[label] = on_inductor
        decision["winner"] = label if winner == ON_INDUCTOR else winner
        if self.inductor_side.routed_on_inductor:
            decision[ROUTED_ON_INDUCTOR] = True
        if self.inductor_side.untried is not None:
            decision[INDUCTOR_UNTRIED] = self.inductor_side.untried
        if winner == AS_TRACED:
            routed_s, traced_s = self.first_round[AS_ROUTED], self.first_round[AS_TRACED]
            decision[TRACED_WON] = traced_won_note(routed_s, traced_s, self._routed_margin())
        if self.contention.contended():
            self._apply(decision, cached=False, note=self.contention.note())
            return
        self.cache.put_json(_KIND, self.key, decision)
        self._apply(decision, cached=False)

    def _compile_on_inductor(self, args: Sequence[Any]) -> Any:
        """This call, run as routed, untimed, and inductor's side compiled for its
        inputs (``trial_inductor.InductorSide.compile``); where nothing is left to
        compile, the leader wins, and the reasons are kept."""
        self.contention.pause()  # inductor's compile workers take the cores
        out, side, failed = self.inductor_side.compile(self.sides[AS_ROUTED], args)
        if side is not None:
            self.sides[ON_INDUCTOR] = side
        elif failed is not None:
            assert self.leader is not None
            self._finish(self.leader, failed)
            trial_slot.TRIAL_SLOT.release(self)
        return out

    def _apply(self, decision: dict[str, Any], cached: bool, note: str | None = None) -> None:
        on_inductor = bool(decision.get(ROUTED_ON_INDUCTOR))
        labels = {AS_ROUTED: f"{AS_ROUTED} on inductor" if on_inductor else AS_ROUTED}
        sides = (AS_ROUTED, AS_TRACED, PLAIN_INDUCTOR, WHOLE_ON_INDUCTOR, ON_INDUCTOR)
        line = ", ".join(f"{labels.get(side, side)} {decision[side]}" for side in sides if side in decision)
        line += f"; {decision[INDUCTOR_UNTRIED]}" if INDUCTOR_UNTRIED in decision else ""
        line += " (cached)" if cached else f", {NOT_CACHED} {note}" if note else ""
        winner = decision["winner"]
        program = self.inductor_side.forget()
        if winner == PLAIN_INDUCTOR:
            reason = (
                f"the graph compiled as plain inductor compiles it, faster in place by measurement: {line}"
            )
            if on_inductor:
                reason = (
                    "the graph compiled as plain inductor compiles it, in place of inductor's program "
                    f"of auto's lowered graph (a near tie goes to plain inductor), by measurement: {line}"
                )
            for runner in self.runners:
                runner.run.measured[IN_PLACE] = line
                # Moved to inductor by the check: the planned route's reason is replaced.
                moved = runner.chain[0] == "inductor" != runner.run.planned.route
                runner.run_on("inductor", reason)  # its ops run inside that program
                if moved:
                    runner.run.rejected[runner.run.planned.route] = reason
            for graph in self.stitched:  # the routed program no longer runs: its compiles go
                graph.whole, graph.forward = None, graph.split_forward
            plain = program if not cached and callable(program) else None
            self.chosen = plain or plain_on_first_call(self.traced, self.config, self.runners[0].plan.graph)
            log.info("graph in-place trial: %s won (%s)", winner, line)
            self.sides = {winner: self.chosen}
            return
        if winner == WHOLE_ON_INDUCTOR:
            for runner in self.runners:
                runner.run.measured[IN_PLACE] = line
            reason = f"compiled whole by inductor, faster in place by measurement: {line}"
            whole = program if not cached and callable(program) else None
            run_whole_on_inductor(self.stitched[0], whole, reason, self.config)
            log.info("graph in-place trial: %s won (%s)", winner, line)
            self.chosen = self.sides[AS_ROUTED]
            self.sides = {winner: self.chosen}
            return
        if self.whole_check is None or winner == AS_TRACED or not self.whole_check.pending:
            # Else the check owns the copy: a warm start applies this decision
            # before the check's first call, whose cached winner may compile it.
            _free_unsplit(self.stitched)
        compiled = program if isinstance(program, dict) else {}
        for runner in self.runners:
            runner.run.measured[IN_PLACE] = line
            if winner == AS_TRACED and runner.chain[0] != "eager":
                why = decision.get(TRACED_WON, "slower in place than the graph as traced")
                runner.run_eager(f"{why}, by measurement: {line}")
            elif winner == ON_INDUCTOR and runner.chain[0] == CUTTING_ROUTE:
                # From the cache, compiled on the region's next call (inductor's own cache serves it).
                reason = f"slower in place than on inductor, by measurement: {line}"
                runner.run_on("inductor", reason, compiled.get(runner.plan.name))
        log.info("graph in-place trial: %s won (%s)", winner, line)
        self.chosen = self.sides[AS_ROUTED if winner == ON_INDUCTOR else winner]
        self.sides = {winner: self.chosen}  # the loser's memory goes with it
