"""Graphs whose baseline is inductor compile as plain inductor compiles them.

Where inductor leads the route order of a graph's device (CPU training, CUDA
inference and training, inductor forced by the user: ``inductor_lead.py``),
the Dynamo graph goes through inductor's own ``compile_fx``: one AOTAutograd
pass with inductor's decompositions and graph passes, parameters as static
inputs and, for CUDA inference, inductor's CUDA graph trees, as
``mode="reduce-overhead"`` captures.
Each aten graph is planned inside ``compile_fx``'s inner compile. A graph that
inductor takes whole goes to ``compile_fx_inner`` unchanged; only a graph with
a departure the plan records (an op inductor cannot lower, a data-dependent op
left out of the capture) is split and stitched as before.

Why: the inductor route compiled each region with ``torch._inductor.compile``,
which runs AOTAutograd a second time on an already-lowered graph. No parameter
was a static input there (0 of 268 on ResNet-50 against 267 under plain
inductor), the cudagraphs route captured region by region, and CPU training ran
1.12-1.44x slower than plain inductor in the zoo.

AOTAutograd's own cache serves warm starts of these compiles, keyed by
``auto``'s settings, with each graph's plan stored beside it
(``served_plans.py``); it stays off under a kernel trial, whose stored decision
is read in the inner compile.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule, _make_graph_module

from .cache import inductor_cache, trusted_root
from .capture_check import CaptureCheck, CaptureRecord
from .config import Config
from .errors import DispatchError, error_line
from .inductor_lead import CUDAGRAPHS, INDUCTOR, InductorLead
from .inductor_start import prepare_inductor
from .inspect import (
    GRAPH_BACKWARD,
    GRAPH_FORWARD,
    GRAPH_INFERENCE,
    compute_nodes,
    graph_facts,
)
from .kernel_trial import (
    FAMILIES,
    KernelTrial,
    TrialRecord,
    candidate_families,
    families_of,
    kernel_decompositions,
    stored_chosen,
    stored_decision,
    stored_kernels,
    stored_measured,
    trial_key,
)
from .partition import describe_region
from .planner import check_forced_route, choose_routes, route_order
from .record import GraphRecord, recorder
from .region import GraphPlan, Region
from .routes import registry
from .routes.cudagraphs import PoolOutputs
from .served_plans import ServedPlans, fingerprint_pass, graph_key, publish, settings_fingerprint
from .stitch import COMPILE_LOCK, FallbackWarning

if TYPE_CHECKING:
    from .backend import _GraphCompiler

log = logging.getLogger("dispatch")


def compile_as_inductor(
    compiler: _GraphCompiler, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], lead: InductorLead
) -> Callable[..., Any]:
    """``gm`` through ``compile_fx``, each aten graph planned by ``compiler``'s config."""
    if not lead.trial:
        return _compile_fx_served(compiler, gm, example_inputs, lead)
    inner = PlanningInnerCompile(compiler, lead.capture, lead.trial)
    original = copy.deepcopy(gm)  # compile_fx takes ownership of its graph
    compiled = _compile_fx(gm, example_inputs, inner, lead)
    if len(inner.records) != 1 or inner.records[0] is None:
        return compiled  # no trial, or the graph was split: its regions are measured as such
    return _with_kernel_trial(compiler.config, original, example_inputs, lead, compiled, inner.records[0])


def _compile_fx_served(
    compiler: _GraphCompiler, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], lead: InductorLead
) -> Callable[..., Any]:
    """``_compile_fx`` with AOTAutograd's cache on: where it serves the graph, the
    inner compile does not run and the plans stored beside the entry are published.
    Without a cache of ours to store plans in, AOTAutograd's stays off too: every
    hit would have to be compiled again."""
    config = compiler.config
    fingerprint = settings_fingerprint(config)
    key = graph_key(gm, example_inputs, fingerprint)
    check = None
    if (lead.capture or lead.cpu_check) and CaptureCheck.wanted(config):
        route = CUDAGRAPHS if lead.capture else INDUCTOR
        check = CaptureCheck(config, gm, key, compiler.graph_index, route, lead.training)
    if check is not None and (eager := check.stored_eager()) is not None:
        return eager  # a warm start where the graph as traced won: nothing compiles
    if not trusted_root(config.cache_dir):
        inner = PlanningInnerCompile(compiler, lead.capture, check=check)
        return _checked(check, _compile_fx(gm, example_inputs, inner, lead))
    served = ServedPlans(config, key, compiler.graph_index)
    stored = served.stored()
    spare = copy.deepcopy(gm) if stored is None else None  # compile_fx takes ownership of its graph
    inner = PlanningInnerCompile(compiler, lead.capture, served=served, check=check)
    compiled = _compile_fx(gm, example_inputs, inner, lead, fingerprint=fingerprint)
    if inner.calls:
        return _checked(check, compiled)
    if stored is not None:
        publish(stored if check is None else check.settled(stored))
        return compiled
    # An entry with no plan beside it (our cache cleared, inductor's kept): compile
    # again without the cache, so that the graph is planned.
    assert spare is not None
    log.info("graph %d: AOTAutograd's cache holds no plan of ours; compiling it again", compiler.graph_index)
    inner = PlanningInnerCompile(compiler, lead.capture, served=served, check=check)
    return _checked(check, _compile_fx(spare, example_inputs, inner, lead))


def _checked(check: CaptureCheck | None, compiled: Callable[..., Any]) -> Callable[..., Any]:
    return compiled if check is None else check.wrap(compiled)


def _compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    inner: Callable[..., Any],
    lead: InductorLead,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    fingerprint: str | None = None,
) -> Callable[..., Any]:
    """Inductor's ``compile_fx`` of ``gm`` with ``inner`` as its inner compile;
    AOTAutograd's cache serves it only where ``fingerprint`` keys its entries."""
    from torch._inductor.compile_fx import compile_fx

    prepare_inductor(example_inputs)
    patches: dict[str, Any] = {"triton.cudagraphs": lead.capture}
    if fingerprint is not None:
        patches["post_grad_custom_post_pass"] = fingerprint_pass(fingerprint)
    # On only where the user left it on; bundled entries would assert on a stitched
    # program instead of skipping it.
    enabled = fingerprint is not None and torch._functorch.config.enable_autograd_cache
    cache = {"enable_autograd_cache": enabled, "bundled_autograd_cache": False}
    with torch._functorch.config.patch(cache):
        compiled = compile_fx(
            gm,
            list(example_inputs),
            inner_compile=inner,
            config_patches=patches,
            decompositions=decompositions,
        )
    assert callable(compiled), "compile_fx returns a callable outside ahead-of-time compilation"
    return compiled


def _with_kernel_trial(
    config: Config,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    lead: InductorLead,
    plain: Callable[..., Any],
    record: TrialRecord,
) -> Callable[..., Any]:
    """``plain``, or a ``KernelTrial`` of it against ``gm`` compiled with kernel
    families of kernels/ decomposed into it (``kernel_trial.py``); on a warm
    start, the program the stored decision names."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner(graph: torch.fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        with COMPILE_LOCK, inductor_cache(config.cache_dir):
            pool_outputs = PoolOutputs(graph)  # before inductor's passes rewrite the graph
            return _served(compile_fx_inner(graph, inputs, **kwargs), record.region, config, pool_outputs)

    def inlined(families: Sequence[str]) -> tuple[Callable[..., Any], list[str]]:
        used: list[str] = []
        graph = copy.deepcopy(gm)  # compile_fx takes ownership of its graph
        return _compile_fx(graph, example_inputs, inner, lead, kernel_decompositions(used, families)), used

    key = trial_key(gm, example_inputs)
    stored = stored_decision(config.cache_dir, key)
    if stored is not None:
        return _stored_choice(stored, plain, record, inlined)
    try:
        every, used = inlined(FAMILIES)
    except Exception as error:  # the plain graph serves; explain says why
        record.settle([], (), {}, f"kernels/ inlined failed to compile: {error_line(error)}")
        return plain
    if not used:
        return plain  # no softmax or layer norm that the kernels take
    candidates = {families_of(used): every}
    for families in candidate_families(used)[1:]:
        try:
            candidates[families] = inlined(families)[0]
        except Exception as error:  # that family alone is not tried
            log.info("kernels/ %s inlined failed to compile: %s", ", ".join(families), error_line(error))
    return KernelTrial(plain, candidates, used, record, config.cache_dir, key)


def _stored_choice(
    stored: dict[str, Any],
    plain: Callable[..., Any],
    record: TrialRecord,
    inlined: Callable[[Sequence[str]], tuple[Callable[..., Any], list[str]]],
) -> Callable[..., Any]:
    """The program a stored decision names: inductor's own, where every family lost
    (nothing more is compiled), or the graph with the families that won."""
    chosen, measured = stored_chosen(stored), stored_measured(stored)
    if not chosen:
        record.settle(stored_kernels(stored), (), measured)
        return plain
    try:
        program, used = inlined(chosen)
    except Exception as error:  # no times: they were taken of a program that no longer compiles
        record.settle(
            stored_kernels(stored), (), {}, f"kernels/ inlined failed to compile: {error_line(error)}"
        )
        return plain
    record.settle(used, chosen, measured)
    return program


def _served(compiled: Any, region: Region, config: Config, pool_outputs: PoolOutputs) -> Any:
    """What serves inductor's compile of ``region``: its outputs copied out of the
    CUDA graph's pool where it is captured, unless the user asked for reduce-overhead."""
    if region.route == CUDAGRAPHS and not config.reduce_overhead:
        return _outputs_survive(compiled, pool_outputs)
    return compiled


class PlanningInnerCompile:
    """``compile_fx``'s inner compile: plan the aten graph, then hand it to
    ``compile_fx_inner`` whole, or split and stitch it where the plan departs."""

    def __init__(
        self,
        compiler: _GraphCompiler,
        capture: bool,
        trial: bool = False,
        served: ServedPlans | None = None,
        check: CaptureCheck | None = None,
    ) -> None:
        self.compiler = compiler
        self.capture = capture
        self.trial = trial
        #: times a graph compiled whole (captured on CUDA; a training step on CPU)
        #: against the graph as traced (``capture_check.py``)
        self.check = check
        #: where the plans of graphs compiled whole are stored, for AOTAutograd's cache hits
        self.served = served
        self.calls = 0
        #: per aten graph compiled whole, the record a kernel trial updates (None: no trial)
        self.records: list[TrialRecord | None] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx_inner

        self.calls += 1
        compiler, config = self.compiler, self.compiler.config
        if kwargs.get("is_inference"):
            kind = GRAPH_INFERENCE
        elif kwargs.get("is_backward"):
            kind = GRAPH_BACKWARD
        else:
            kind = GRAPH_FORWARD
        static = frozenset(kwargs.get("static_input_idxs") or ())
        # A backward graph compiles on the first backward call, outside ``auto``'s scope.
        with COMPILE_LOCK, inductor_cache(config.cache_dir, training=kind != GRAPH_INFERENCE):
            try:
                plan = whole_graph_plan(gm, kind, config, compiler.graph_index)
            except DispatchError:
                plan = None  # the stitched path plans again and turns the error into a raiser
            if plan is None:
                return compiler.compile(gm, example_inputs, kind, static=static)
            # All three taken before inductor's passes rewrite the graph in place.
            pool_outputs = PoolOutputs(gm)
            timeable = self.check is not None and self.check.times(gm, kind)
            spare = _graph_copy(gm)  # what the fallback plans if inductor fails after its passes
            try:
                compiled = compile_fx_inner(gm, example_inputs, **kwargs)
            except Exception as error:
                if config.strict:
                    raise
                fallback = _without_inductor(plan, config, error)
                return compiler.with_config(fallback).compile(spare, example_inputs, kind, static=static)
        wanted = self.capture and kind == GRAPH_INFERENCE
        region = _with_capture(plan.regions[0], kwargs.get("cudagraphs"), compiled, wanted)
        plan = replace(plan, regions=[region])
        record = TrialRecord(region) if self.trial and kind == GRAPH_INFERENCE else None
        self.records.append(record)
        outcome: TrialRecord | CaptureRecord | None = record
        if timeable and self.check is not None and region.route == self.check.route:
            outcome = self.check.record_for(plan)  # None where a size is symbolic
        recorder.publish(GraphRecord(plan, outcome))
        if self.served is not None:
            self.served.add(plan)
        log.info(
            "graph %d (%s): %s -> %s (inductor's own compile)", plan.graph, kind, region.name, region.route
        )
        return _served(compiled, region, config, pool_outputs)


def _graph_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with a graph of its own: new nodes, each with a shallow copy of its
    ``meta`` (the fake values are shared, not copied: ``copy.deepcopy`` would copy
    every one of them), over the same parameters and submodules: 4.8 ms for a
    training graph of hf_bert's (390 nodes), 20 ms with its code made at once."""
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    copied: Any = graph.graph_copy(gm.graph, {}, return_output_node=True)
    if copied is not None:
        value, output = copied
        graph.output(value, type_expr=output.type).meta = copy.copy(output.meta)
    # Lazy: its Python code is generated only if the fallback runs it.
    spare = _make_graph_module(gm, graph, class_name=type(gm).__name__, graph_module_cls=_LazyGraphModule)
    spare.meta = copy.copy(gm.meta)
    return spare


def whole_graph_plan(
    gm: torch.fx.GraphModule, kind: str, config: Config, graph_index: int
) -> GraphPlan | None:
    """The plan of one inductor region that covers ``gm``, or None where the plan
    departs from inductor for some node (that plan is made again when the graph is split)."""
    facts = graph_facts(gm, kind)
    check_forced_route(config, facts)
    choices = choose_routes(gm, facts, config)
    nodes = compute_nodes(gm)
    if not nodes:
        return None
    if any(choices[n].chain[:1] != [INDUCTOR] for n in nodes):
        return None
    places = {choices[n].place for n in nodes}
    if len(places) != 1:
        return None
    (place,) = places
    device = choices[nodes[0]].device
    region = describe_region(nodes, choices, INDUCTOR, device, graph_index, kind)
    region = replace(region, name=f"{INDUCTOR}_{place.replace(':', '')}_0")
    return GraphPlan(
        graph_index,
        kind,
        facts.devices,
        facts.dynamic,
        facts.node_count,
        {device: route_order(device, kind, config, facts.bfloat16, facts.update_step)[0]},
        [region],
        facts.dynamic_dims,
    )


def _with_capture(region: Region, cudagraphs: Any, compiled: Any, wanted: bool) -> Region:
    """The region as inductor compiled it: captured by its CUDA graph trees, or why not."""
    if not wanted:
        return region
    reason = getattr(compiled, "disabled_cudagraphs_reason", None)
    if cudagraphs is not None and not bool(getattr(cudagraphs, "value", cudagraphs)):
        reason = reason or "inductor did not capture this graph"
    if reason is not None:
        return replace(region, rejected={**region.rejected, CUDAGRAPHS: f"inductor: {reason}"})
    rejected = {k: v for k, v in region.rejected.items() if k != CUDAGRAPHS}
    return replace(region, route=CUDAGRAPHS, inner_route=INDUCTOR, rejected=rejected)


def _outputs_survive(
    compiled: Callable[[list[Any]], Any], pool_outputs: PoolOutputs
) -> Callable[[list[Any]], list[Any]]:
    """Outputs of inductor's CUDA graph live in its pool and are overwritten by
    the next replay: copy them out, as the cudagraphs route does."""

    def run(args: list[Any]) -> list[Any]:
        return pool_outputs.survive(compiled, args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _without_inductor(plan: GraphPlan, config: Config, error: Exception) -> Config:
    """Settings for planning ``plan``'s graph again on the rule's other routes,
    after inductor failed to compile it; warns once for the graph."""
    region = plan.regions[0]
    detail = error_line(error, 300)
    # Wrapping routes stay out: a routes list of ("eager", "cudagraphs") would force cudagraphs.
    others = tuple(
        r for order in plan.route_order.values() for r in order if r != INDUCTOR and not registry.get(r).wraps
    ) or ("eager",)
    sources = {**dict(config.sources), "routes": f"compile failed: {detail}"}
    warnings.warn(
        f"dispatch: route 'inductor' failed to compile graph {region.graph} ({region.kind}, "
        f"{region.node_count} ops on {', '.join(sorted(region.devices))}): {detail}; "
        "this graph is planned again without inductor",
        FallbackWarning,
        stacklevel=2,
    )
    return replace(config, routes=others, sources=tuple(sources.items()))
