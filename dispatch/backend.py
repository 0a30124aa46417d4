"""The ``auto`` backend: inspect -> partition -> plan -> compile -> stitch.

    model = torch.compile(model, backend="auto", options={"routes": ["onnxrt", "eager"]})

Dynamo hands ``auto`` one FX graph at a time; AOTAutograd lowers it to aten
(an inference graph, or a forward and a backward graph when gradients are
needed); each aten graph is planned, split into region submodules and stitched
back with a ``RegionRunner`` per region. Regions compile on their first call,
on real inputs. A graph whose baseline is inductor (its route order starts with
inductor) goes through inductor's own ``compile_fx`` instead, planned inside
it (``inductor_baseline.py``). An inference graph whose regions are all eager
runs as Dynamo traced it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._functorch.aot_autograd import make_boxed_func

from . import fork_safety  # noqa: F401  (registers its after-fork hook)
from .aot import aot_compile
from .aten_cache import GraphSource, aten_graph_key, load_aten_graph, read_back, save_aten_graph
from .cache import ArtifactCache, current_cache, inductor_cache, using
from .config import Config
from .decompositions import onnx_friendly
from .errors import ConfigError, DispatchError
from .graph_trial import in_place_trial
from .graph_tuning import WholeGraphCheck, whole_graph_check
from .inductor_baseline import compile_as_inductor
from .inductor_lead import inductor_lead
from .inspect import (
    GRAPH_BACKWARD,
    GRAPH_FORWARD,
    GRAPH_INFERENCE,
    input_names,
    mark_static_inputs,
    needs_gradients,
    static_input_positions,
)
from .planner import availability, plan_graph
from .record import GraphRecord, recorder
from .region import Region, region_table
from .routes import registry
from .stitch import COMPILE_LOCK, StitchedGraph, stitch, unsplit_copy
from .update_step import mutated_inputs

log = logging.getLogger("dispatch")


def auto(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    **unexpected: Any,
) -> Callable[..., Any]:
    """The ``torch.compile`` backend. ``options`` as in ``torch.compile(..., options=)``.

    Errors of ours surface when the compiled function is called, with their own
    type: raised here, Dynamo would wrap them in ``BackendCompilerFailed``.
    """
    try:
        if unexpected:
            raise ConfigError(
                f"backend 'auto' takes only options=; got {sorted(unexpected)} "
                f"(torch.compile's mode= is for inductor: use options={{'routes': [...]}})"
            )
        config = Config.resolve(options)
    except DispatchError as error:
        return _raiser(error)
    configure_logging(config.log_level)
    training = needs_gradients(example_inputs)
    with COMPILE_LOCK, using(ArtifactCache(config.cache_dir)), inductor_cache(config.cache_dir, training):
        return _compile(gm, example_inputs, config)


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> Callable[..., Any]:
    inputs = DynamoInputs.of(gm, example_inputs)
    lead = inductor_lead(config, gm, example_inputs)
    if lead is not None:
        compiler = _GraphCompiler(config, recorder.next_graph_index(), plan_only=False, inputs=inputs)
        return compile_as_inductor(compiler, gm, example_inputs, lead)
    decompositions = onnx_friendly() if onnxrt_may_run(config, example_inputs) else None
    compiler = _GraphCompiler(
        config,
        recorder.next_graph_index(),
        plan_only=False,
        inputs=inputs,
        decompositions=decompositions,
    )
    return compiler.aot(gm, example_inputs)


auto.__name__ = "auto"


@dataclass(frozen=True)
class DynamoInputs:
    """What the compiler knows of a Dynamo graph's inputs: which are parameters or
    buffers, the user's names for them, how many parameters AOTAutograd lifts
    in front of them, and how many there are. Empty for ``plan``."""

    static: frozenset[int] = frozenset()
    names: Mapping[int, str] = field(default_factory=dict)
    lifted: int = 0
    count: int = 0

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> DynamoInputs:
        lifted = sum(1 for _ in gm.parameters()) + sum(1 for _ in gm.buffers())
        return cls(static_input_positions(gm), input_names(gm), lifted, len(example_inputs))


class _GraphCompiler:
    """Plans (and, unless ``plan_only``, stitches) the aten graphs of one Dynamo graph."""

    def __init__(
        self,
        config: Config,
        graph_index: int,
        plan_only: bool,
        inputs: DynamoInputs | None = None,
        decompositions: dict[Any, Callable[..., Any]] | None = None,
    ) -> None:
        self.config = config
        self.graph_index = graph_index
        self.plan_only = plan_only
        self.inputs = inputs or DynamoInputs()
        self.decompositions = decompositions
        self.plans: list = []
        #: the program and its input count, where AOTAutograd's wrapper would do nothing
        self.direct: tuple[Callable[..., Any], int] | None = None
        self.source_wanted = False  # keep the inference graph's source, to store it
        self.source: GraphSource | None = None
        self.stitched: list[StitchedGraph] = []  # the programs this compiler stitched
        #: graph_tuning's check, where it times the inference graph whole on its first call
        self.whole_check: WholeGraphCheck | None = None
        #: the positions of the Dynamo graph's inputs its inference graph updates in
        #: place, where AOTAutograd traced it here (not for a stored aten graph)
        self.mutated: frozenset[int] | None = None

    def with_config(self, config: Config) -> _GraphCompiler:
        """This compiler, for the same graph, under other settings."""
        return _GraphCompiler(config, self.graph_index, self.plan_only, self.inputs, self.decompositions)

    def aot(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        cache = None if self.plan_only else current_cache()
        key = None
        if cache is not None:
            key = aten_graph_key(gm, example_inputs, self.inputs.static, self.decompositions is not None)
        if cache is not None and key is not None:
            cached = load_aten_graph(cache, key)
            if cached is not None:
                from_cache = self._from_cached(cached, example_inputs)
                if from_cache is not None:
                    return self._finished(gm, from_cache)
            self.source_wanted = True
        wrapped = aot_compile(
            gm,
            list(example_inputs),
            fw_compiler=functools.partial(self.compile, kind=GRAPH_FORWARD),
            bw_compiler=functools.partial(self.compile, kind=GRAPH_BACKWARD),
            inference_compiler=functools.partial(self.compile, kind=GRAPH_INFERENCE),
            decompositions=self.decompositions,
        )
        direct = self.direct
        # AOTAutograd's runtime wrapper has nothing to do for this graph (no
        # mutation, no alias, no subclass, no autocast): skip its per-call cost.
        identity = (
            direct is not None
            and not any(True for _ in gm.parameters())
            and not any(True for _ in gm.buffers())
            and direct[1] == len(example_inputs)
        )
        if identity and cache is not None and key is not None and self.source is not None:
            save_aten_graph(cache, key, self.source)
        return self._finished(gm, direct[0] if identity and direct is not None else wrapped)

    def _may_cut(self) -> bool:
        return not self.plan_only and self.config.allows("onnxrt") and self.config.allows("inductor")

    def _finished(self, gm: torch.fx.GraphModule, program: Callable[..., Any]) -> Callable[..., Any]:
        """What Dynamo calls for an inference graph: ``program``, or the Dynamo graph
        itself where every region is eager, at the cost of a backend that does
        nothing (torch-level ops, not their aten decompositions; no stitching).
        Regions planned eager hand over at once; regions that fell back to eager
        on their first call, from the second call. A CPU graph is then timed in
        place against the Dynamo graph (``graph_trial.py``), after the whole-graph
        check (``graph_tuning.py``) where that times it first."""
        if not self.stitched or not all(p.kind == GRAPH_INFERENCE for p in self.plans):
            return program
        if _all_eager(r for p in self.plans for r in p.regions):
            return gm.forward
        routed = _settling(program, gm.forward, self.stitched)
        return in_place_trial(
            routed, gm, self.stitched, self.plans, self.config, self.whole_check, self.mutated
        )

    def _from_cached(
        self, aten: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any] | None:
        """What ``aot`` returns, from a stored inference graph instead of AOTAutograd's trace.

        None where planning it raised: nothing was published, and the traced path
        returns that error as it always has."""
        from torch._dynamo.utils import counters

        self.compile(aten, example_inputs, kind=GRAPH_INFERENCE, wrapper_is_identity=True)
        if self.direct is None:
            return None
        counters["aot_autograd"]["total"] += 1  # as aot_compile counts (DDP's optimizer reads it)
        counters["aot_autograd"]["ok"] += 1
        return self.direct[0]

    def compile(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        kind: str,
        wrapper_is_identity: bool = False,
        static: frozenset[int] | None = None,
    ) -> Callable[..., Any]:
        """Plan and stitch one aten graph. ``static``: the positions of its
        parameters and buffers, where AOTAutograd's caller knows them (inductor's
        ``compile_fx`` does); else they are found from the Dynamo graph's."""
        if kind == GRAPH_INFERENCE and self.source_wanted:
            stored = read_back(gm)  # before planning marks the graph
            if stored is not None:
                gm, self.source = stored
        placeholders = gm.graph.find_nodes(op="placeholder")
        names: dict[int, str] = {}
        lifted = self.inputs.lifted
        if kind != GRAPH_BACKWARD and len(placeholders) == lifted + self.inputs.count:
            names = {lifted + i: name for i, name in self.inputs.names.items()}
            if kind == GRAPH_INFERENCE and static is None:
                mutated = mutated_inputs()
                mark_static_inputs(gm, self.inputs.static, lifted, mutated)
                if all(i >= lifted for i in mutated):  # else a lifted buffer: not among Dynamo's inputs
                    self.mutated = frozenset(i - lifted for i in mutated)
        if kind == GRAPH_INFERENCE and static is not None:
            mark_static_inputs(gm, static, 0, mutated_inputs())
        # Kept unsplit where inductor may stand in for a graph that ORT regions
        # and eager work cut (graph_tuning compiles it whole).
        whole = unsplit_copy(gm) if kind == GRAPH_INFERENCE and self._may_cut() else None
        try:
            graph_plan, split = plan_graph(gm, kind, self.config, self.graph_index, names)
        except DispatchError as error:
            if self.plan_only:
                raise
            # Raised at call time: an error raised while Dynamo compiles would reach
            # the user wrapped in BackendCompilerFailed instead of its own type.
            return make_boxed_func(_raiser(error))
        self.plans.append(graph_plan)
        if self.plan_only:
            return gm
        log.info(
            "graph %d (%s): %s",
            self.graph_index,
            kind,
            ", ".join(f"{r.name} -> {r.route}" for r in graph_plan.regions) or "no compute ops",
        )
        log.debug("graph %d (%s) regions:\n%s", self.graph_index, kind, region_table(graph_plan.regions))
        stitched = stitch(split, graph_plan, self.config, whole)
        self.stitched.append(stitched)
        recorder.publish(GraphRecord(graph_plan, stitched))
        program: Callable[..., Any] = stitched
        if kind == GRAPH_INFERENCE:
            check = whole_graph_check(stitched, graph_plan, self.config)
            self.whole_check = check
            program = check or stitched
        if kind == GRAPH_INFERENCE and (wrapper_is_identity or _wrapper_is_identity()):
            self.direct = (program, stitched.inputs)
        return make_boxed_func(program)


def configure_logging(level: str) -> None:
    """``DISPATCH_LOG=info`` prints even where the application configured no logging."""
    log.setLevel(level.upper())
    if level != "warning" and not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("dispatch: %(message)s"))
        log.addHandler(handler)


def onnxrt_may_run(config: Config, example_inputs: Sequence[Any]) -> bool:
    """Whether this graph is CPU inference that the onnxrt route is allowed to take."""
    if needs_gradients(example_inputs):
        return False
    if not config.allows("onnxrt") or not all(
        t.device.type == "cpu" for t in example_inputs if isinstance(t, torch.Tensor)
    ):
        return False
    return availability(registry.get("onnxrt")).ok


def _wrapper_is_identity() -> bool:
    """True where AOTAutograd's runtime wrapper would pass inputs and outputs through
    unchanged: no input mutation, no output alias, no subclass, no RNG state, no
    effect tokens, and no autocast to switch off around the graph."""
    from torch._functorch._aot_autograd.schemas import OutputType
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None or torch.is_autocast_enabled() or torch.is_autocast_enabled("cpu"):
        return False
    return (
        not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
        and all(o.output_type == OutputType.non_alias for o in meta.output_info)
        and meta.num_intermediate_bases == 0
        and not meta.tokens
        and not meta.is_rng_op_functionalized
        and all(_plain(m) for m in meta.subclass_inp_meta)
        and all(_plain(m) for m in getattr(meta, "subclass_fw_graph_out_meta", ()) or ())
    )


def _plain(meta: object) -> bool:
    from torch._functorch._aot_autograd.schemas import PlainTensorMeta

    return isinstance(meta, (int, PlainTensorMeta))


def _all_eager(regions: Iterable[Region]) -> bool:
    return all(r.route == "eager" for r in regions)


def _settling(
    program: Callable[..., Any], traced: Callable[..., Any], stitched: list[StitchedGraph]
) -> Callable[..., Any]:
    """``program`` until its first call has compiled every region; from then on
    the Dynamo graph itself where every region ended up eager (a route failed
    on its first call: an export that fails, a compile that crashes)."""
    current: Callable[..., Any]

    def first(*args: Any) -> Any:
        nonlocal current
        out = program(*args)
        current = traced if _all_eager(r for graph in stitched for r in graph.outcome()) else program
        return out

    current = first

    def run(*args: Any) -> Any:
        return current(*args)

    return run


def _raiser(error: DispatchError) -> Callable[..., Any]:
    def raise_planned_error(*args: Any) -> Any:
        raise error

    return raise_planned_error
