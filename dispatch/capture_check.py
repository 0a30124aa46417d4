"""A graph that inductor compiled whole, timed on its first call
against the graph as Dynamo traced it: a small captured graph on CUDA, a
bfloat16 graph on CPU, a CPU training step.

Replaying a graph under CUDA graph trees has a host cost of its own: the trees'
bookkeeping, a copy of each input that is not static into the graph's memory,
and auto's copy of the outputs out of its pool. A graph of a few kernels saves
less than that in launches. On an H200 in bfloat16
(``benchmarks/results/zoo-cuda-bfloat16-20261126-060018.md``), the zoo's
graph_break (three Dynamo graphs of 9, 1 and 3 aten ops around a ``print`` and
an ``.item()`` branch) ran 170 µs a step eagerly, 269 µs under
``mode="reduce-overhead"`` and 339 µs under auto; data_dependent (three graphs
around ``nonzero``) 356, 452 and 471 µs.

So a captured inference graph whose second eager run (the first loads
kernels) takes under ``TIMED_BELOW_S`` is timed on its first call: captured
against as traced, in turn, the device synchronised (``autotune.measure``,
each checked against eager first). It runs as the faster from then on. Above
that time the capture's fixed cost is a few per cent at most, and the graph
stays captured untimed. Not timed: a forced route, eager not allowed, a
symbolic size (one shape's timing need not hold for others), a graph that
mutates or draws random numbers (``can_time``). The decision is cached: a
warm start where eager won compiles nothing for the graph.

CPU inference in bfloat16 leads with inductor too (ONNX Runtime's CPU
provider runs no bfloat16), uncaptured, and there inductor's whole graph is
checked the same way against the graph as traced. Inductor won on the
transformers and on hf_resnet, but lost where oneDNN's bfloat16 convolutions
serve eager better than inductor's code: timm's ResNet-18 (2 images of 64^2, AMD
EPYC, AVX-512, 2 cores) ran 5.45 ms a call under inductor against 4.09
eagerly. A CPU graph runs no capture with a fixed cost, so it is timed
whatever its size up to ``CPU_TIMED_BELOW_S`` a call, where the check's
thirty-odd calls a side still cost little beside inductor's compile. A CPU
graph whose first eager run already takes ``FIRST_RUN_DECIDES`` times its bar
is not run a second time.

CPU training leads with inductor as well, and there a step is what is timed:
the forward, then the backward of its outputs into ``.grad`` (put back
afterwards), for steps up to ``TRAINING_TIMED_BELOW_S`` eagerly.
Inductor lost there too: timm's ResNet-18 trained at 63.8 ms a step under
inductor against 24.8 eagerly (same machine, ``nox -s zoo``'s worker): its
channels-last convolutions hand back gradients that the parameters' layout
makes autograd copy. A training forward updates buffers (batch norm's running
statistics) outside its aten graph, so every tensor input that does not
require grad is kept before the timed steps and put back after them: the first
call then updates them once, as eagerly. A forward that draws random numbers
(dropout; timm's classifiers train with it) is timed with the caller's CPU
generator put back afterwards, so that the first call draws what it would
have drawn without the check; its outputs are not compared with eager's (the
masks differ). Inductor keeps a training step only where it is
``TRAINING_MARGIN`` faster.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from . import autotune
from .cache import ArtifactCache, timing_context
from .config import Config
from .cpu_contention import NOT_CACHED
from .inspect import GRAPH_BACKWARD, GRAPH_INFERENCE
from .record import GraphRecord, recorder
from .region import GraphPlan, Region
from .training_step import (
    detached_activations,
    kept_gradients,
    kept_inputs,
    training_step,
    undoable_mutations,
)

log = logging.getLogger("dispatch")

CAPTURED = "captured"  # the compiled side's name on CUDA
INDUCTOR = "inductor"  # ... and on CPU, where nothing is captured
AS_TRACED = "as traced (eager)"
WHOLE_GRAPH = "whole graph"  # the key of this measurement in the region's ``measured``
CUDAGRAPHS = "cudagraphs"
#: a graph whose second eager run takes longer is kept captured without timing
TIMED_BELOW_S = 1e-3
#: ... and on CPU, kept on inductor without timing
CPU_TIMED_BELOW_S = 50e-3
#: ... and for a CPU training step (forward and backward). A step of timm's
#: ResNet-18 (2 images of 64²) took 21-37 ms eagerly on an AVX-512 machine and
#: 90-120 ms on an AVX2 one, where inductor's step took 180 ms: at a bar of
#: 100 ms the slower machine kept inductor untimed. Timing costs about 20 steps
#: (``autotune.LONG_CALL_BATCHES``), once per graph (the decision is stored),
#: beside a training compile of tens of seconds.
TRAINING_TIMED_BELOW_S = 1.0
#: a CPU graph whose first eager run takes this many times its bar is not run
#: again to learn its second run's time: a CPU first run warms little (no kernels
#: to load), and a bfloat16 ResNet-18 of 8 images of 224² took 9.4 s a run
#: eagerly on an AVX2 machine without bfloat16 instructions (inductor 2.9 s)
FIRST_RUN_DECIDES = 4
#: a training step stays on inductor only where it took under this share of the
#: step as traced: within it the two are a tie that the check's few steps cannot
#: split (hf_bert measured 2.98 against 3.08 ms in its check, and ran 3.43
#: against 3.02 a step in the zoo's processes), and the graph as traced is what
#: a backend that does nothing costs
TRAINING_MARGIN = 0.95
#: timed batches this long: a graph this small runs hundreds of calls in each
BATCH_S = 5e-3
_KIND = "capture-check"


class CaptureRecord:
    """The checked region of a graph under this check, as ``explain`` reads it."""

    def __init__(self, region: Region) -> None:
        self.region = region

    def outcome(self) -> list[Region]:
        return [self.region]

    def settle(self, measured: dict[str, str], winner: str) -> None:
        self.region = decided(self.region, measured, winner)
        log.info("graph %d: %s (%s)", self.region.graph, self.region.route, _line(measured))


def decided(region: Region, measured: dict[str, str], winner: str) -> Region:
    """``region`` (captured, or on inductor on CPU) with the check's times, moved to
    eager where that won."""
    line = _line(measured)
    if winner != AS_TRACED:
        return replace(region, measured={**region.measured, WHOLE_GRAPH: line}) if measured else region
    if region.kind == GRAPH_INFERENCE:
        slower = f"slower as a whole graph by measurement: {line}"
    else:
        slower = (
            f"not {1 - TRAINING_MARGIN:.0%} faster than as traced over a training step "
            f"(forward and backward) by measurement: {line}"
        )
    if region.route == CUDAGRAPHS:
        rejected = {**region.rejected, CUDAGRAPHS: slower, INDUCTOR: f"captured, {slower}"}
    else:
        rejected = {**region.rejected, region.route: slower}
    return replace(
        region,
        route="eager",
        inner_route=None,
        planned_route=region.route,
        rejected=rejected,
        measured={**region.measured, WHOLE_GRAPH: line},
    )


def _line(measured: dict[str, str]) -> str:
    # The compiled side first, whatever order a stored decision's JSON kept.
    names = sorted(measured, key=lambda name: (name == NOT_CACHED, name == AS_TRACED))
    return ", ".join(f"{name} {measured[name]}" for name in names)


class CaptureCheck:
    """One Dynamo graph's check: made before ``compile_fx`` (which may rewrite the
    graph), given the checked aten graph by the inner compile (``record_for``),
    and wrapped around the compiled program (``wrap``). ``route``: the route whose
    region is checked, ``cudagraphs`` (inductor's capture, on CUDA) or
    ``inductor`` (on CPU)."""

    def __init__(
        self,
        config: Config,
        gm: torch.fx.GraphModule,
        key: str,
        graph_index: int,
        route: str = CUDAGRAPHS,
        training: bool = False,
    ) -> None:
        self.cache = ArtifactCache(config.cache_dir)
        #: the graph's key (``served_plans.graph_key``) under this process's timing context
        self.key = hashlib.sha256(f"{key}|{timing_context()}".encode()).hexdigest()
        self.graph_index = graph_index
        self.route = route
        #: a step (forward and backward) is timed, not a call
        self.training = training
        #: the compiled side's name in the times
        self.label = CAPTURED if route == CUDAGRAPHS else route
        #: the longest eager call (or step) timed
        self.timed_below_s = (
            TRAINING_TIMED_BELOW_S
            if training
            else TIMED_BELOW_S
            if route == CUDAGRAPHS
            else CPU_TIMED_BELOW_S
        )
        self.as_traced = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # shares gm's tensors
        stored = self.cache.get_json(_KIND, self.key)
        #: the decision a former process stored for this graph, read once
        self.stored: dict[str, Any] | None = stored if isinstance(stored, dict) else None
        #: the checked aten graphs' plans (an inference graph, or a forward then its
        #: backward) and their records
        self.plans: list[GraphPlan] = []
        self.records: list[CaptureRecord] = []
        #: a checked training graph draws random numbers (dropout): the two sides'
        #: outputs cannot match, and the caller's generator is put back after timing
        self.draws = False

    @staticmethod
    def wanted(config: Config) -> bool:
        """Whether a check times anything under ``config``: not where the user forced a
        route or left eager out (the graph as traced could not win)."""
        return not config.forced and config.allows("eager")

    def stored_eager(self) -> Callable[..., Any] | None:
        """On a warm start where eager won: the graph as traced, its stored plan
        published; None otherwise (the graph compiles)."""
        stored = self.stored
        if not stored or stored.get("winner") != AS_TRACED:
            return None
        try:
            entries = stored["plans"] if "plans" in stored else [stored["plan"]]  # one plan: before training
            plans = [GraphPlan.from_dict(p, self.graph_index) for p in entries]
        except (KeyError, TypeError, ValueError):  # an old or altered entry: a miss
            return None
        for plan in plans:
            recorder.publish(GraphRecord(plan, None))
        return self.as_traced.forward

    def settled(self, plans: list[GraphPlan]) -> list[GraphPlan]:
        """``plans`` that AOTAutograd's cache served (stored before this check ran),
        their checked region given the stored decision's times: a warm start's
        ``explain`` shows them as the cold start's did."""
        stored = self.stored
        if not stored or not stored.get("measured"):
            return plans
        winner = stored.get("winner", self.label)
        return [
            plan
            if plan.dynamic or len(plan.regions) != 1 or plan.regions[0].route != self.route
            else replace(plan, regions=[decided(plan.regions[0], stored["measured"], winner)])
            for plan in plans
        ]

    def times(self, aten: torch.fx.GraphModule, kind: str) -> bool:
        """Whether this check times ``aten``, an aten graph of ``kind`` that inductor
        compiles whole: an inference graph that ``can_time``; for training, a forward
        or backward graph of a Dynamo graph whose mutations the check can undo
        (``undoable_mutations``), random numbers drawn or not (a graph that draws
        sets ``draws``: its outputs are then not compared with eager's)."""
        if not self.training:
            return kind == GRAPH_INFERENCE and can_time(aten)
        if kind == GRAPH_INFERENCE or not undoable_mutations():
            return False
        self.draws = self.draws or draws_random_numbers(aten)
        return True

    def record_for(self, plan: GraphPlan) -> CaptureRecord | None:
        """The record of ``plan``'s checked region, whose aten graph ``can_time``
        allowed; None where a size is symbolic (one shape's timing need not hold for
        the others), and for a backward whose forward is not checked. A stored
        decision settles the record at once."""
        if plan.dynamic or (plan.kind == GRAPH_BACKWARD and not self.records):
            return None
        record = CaptureRecord(plan.regions[0])
        self.plans.append(plan)
        self.records.append(record)
        if self.stored:
            record.settle(self.stored.get("measured", {}), self.stored.get("winner", self.label))
        return record

    def wrap(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled``, timed against the graph as traced on its first call; as it is
        where nothing was captured (on CUDA), the graph is not timed, or the decision was stored."""
        if not self.records or self.stored is not None:
            return compiled
        return _FirstCallCheck(self, compiled)

    def decide(self, compiled: Callable[..., Any], args: Sequence[Any]) -> Callable[..., Any]:
        """Run the check on the first call's ``args``; the program that serves from now on."""
        assert self.records
        eager = self.as_traced.forward
        programs = {self.label: compiled, AS_TRACED: eager}
        leaves: list[torch.Tensor] = []  # what a training step's backward fills
        kept: list[Any] = []  # what its forward may update
        timed_args = list(args)
        if self.training:
            timed_args = detached_activations(args)
            leaves = [a for a in timed_args if isinstance(a, torch.Tensor) and a.requires_grad]
            leaves += [p for p in self.as_traced.parameters() if p.requires_grad]  # a graph's own
            kept = [*args, *self.as_traced.buffers()]  # buffers too, where Dynamo did not lift them
            programs = {name: training_step(program, leaves) for name, program in programs.items()}
        with (
            kept_inputs(kept),
            kept_gradients(leaves),
            torch.random.fork_rng(devices=[], enabled=self.training),
        ):
            tuning = self._measure(programs, timed_args)
        if tuning is None:
            self._store(self.label, {})
            return compiled
        if self.label not in tuning.seconds:
            # The compiled program failed or differs from eager: it keeps serving, as
            # it would without this check, and the user sees its error on the call.
            reason = tuning.reasons.get(self.label)
            log.info("graph %d: %s not timed: %s", self.graph_index, self.label, reason)
            return compiled
        measured = {name: autotune.format_seconds(s) for name, s in tuning.seconds.items()}
        winner = AS_TRACED if tuning.best == AS_TRACED else self.label
        if self.training and tuning.seconds[self.label] >= TRAINING_MARGIN * tuning.seconds[AS_TRACED]:
            winner = AS_TRACED
        if tuning.not_cached is not None:
            measured[NOT_CACHED] = tuning.not_cached
        for record in self.records:
            record.settle(measured, winner)
        if tuning.not_cached is None:  # after ``settle``: the stored plans hold the settled regions
            self._store(winner, measured)
        return eager if winner == AS_TRACED else compiled

    def _measure(
        self, programs: dict[str, Callable[..., Any]], args: Sequence[Any]
    ) -> autotune.Tuning | None:
        """Both programs timed on ``args``; None where the graph as traced runs too
        long for the check to pay."""
        eager = programs[AS_TRACED]
        sync = autotune.synchronizer(args)
        start = time.perf_counter()
        expected = autotune.flat_outputs(eager(*args))  # a first call loads kernels, warms caches
        sync()
        first_s = time.perf_counter() - start
        # Uncaptured checks are the CPU ones (inductor_baseline.py: ``cpu_check``).
        if self.route != CUDAGRAPHS and first_s >= FIRST_RUN_DECIDES * self.timed_below_s:
            return None
        start = time.perf_counter()
        eager(*args)
        sync()
        step_s = time.perf_counter() - start
        if step_s >= self.timed_below_s:
            return None
        with _disable_current_modes():  # a mode the caller runs under is not timed
            return autotune.measure(
                list(programs),
                lambda name: lambda *a: autotune.flat_outputs(programs[name](*a)),
                lambda: expected,
                args,
                batch_s=BATCH_S,
                compare=not self.draws,
            )

    def _store(self, winner: str, measured: dict[str, str]) -> None:
        plans = [replace(p, regions=[r.region]) for p, r in zip(self.plans, self.records, strict=True)]
        entry = {"winner": winner, "measured": measured, "plans": [p.to_dict() for p in plans]}
        self.cache.put_json(_KIND, self.key, entry)


class _FirstCallCheck:
    """The compiled program until its first call has decided, then the winner."""

    def __init__(self, check: CaptureCheck, compiled: Callable[..., Any]) -> None:
        self.check = check
        self.compiled: Callable[..., Any] | None = compiled
        self.chosen: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if self.chosen is None:
            with self._lock:
                if self.chosen is None:
                    assert self.compiled is not None
                    try:
                        self.chosen = self.check.decide(self.compiled, args)
                    except Exception as error:  # the check never breaks the graph
                        log.info("graph %d: capture check failed: %s", self.check.graph_index, error)
                        self.chosen = self.compiled
                    self.compiled = None  # the loser's program is not kept alive
        return self.chosen(*args)


def can_time(aten: torch.fx.GraphModule) -> bool:
    """False where an aten graph mutates (an input: a timed call would do so again)
    or draws random numbers (timing would move the caller's generator on)."""
    mutates = any(
        isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable
        for node in aten.graph.nodes
    )
    return not mutates and not draws_random_numbers(aten)


def draws_random_numbers(aten: torch.fx.GraphModule) -> bool:
    """Whether an aten graph has an op that draws from a generator."""
    return any(
        isinstance(node.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in node.target.tags
        and _draws(node, node.target)
        for node in aten.graph.nodes
    )


def _draws(node: torch.fx.Node, target: torch._ops.OpOverload) -> bool:
    """Whether a seeded op draws: every attention kernel is tagged seeded for its
    dropout, which at a ``dropout_p`` of 0 (inference) draws nothing. Without this,
    no transformer's graph was ever timed."""
    arguments = target._schema.arguments
    k = next((k for k, a in enumerate(arguments) if a.name == "dropout_p"), None)
    if k is None:
        return True
    if "dropout_p" in node.kwargs:
        p = node.kwargs["dropout_p"]
    else:
        p = node.args[k] if k < len(node.args) else arguments[k].default_value
    return not isinstance(p, (int, float)) or p != 0
