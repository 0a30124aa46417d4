"""``dispatch.lower``: a model as a routed program that runs without tracing.

    program = dispatch.lower(model, (x,), dynamic_shapes=({0: Dim("batch")},))
    program(x)                         # no Dynamo, no guards
    program.save("model.dispatch")     # one file; dispatch.load() reads it back

``torch.export`` makes one aten graph of the model; the planner, routes,
options and environment variables are ``auto``'s. Each region is then lowered
by its route (``Route.preprocess``: bytes) and loaded back from those bytes
(``Route.load``), on the model's real inputs, in graph order: what runs in
this process is what a saved file runs in another. A route that fails to
lower or to run a region falls back for that region alone, with one warning,
as under ``auto``.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .autotune import check_close
from .cache import ArtifactCache, inductor_cache, using
from .config import Config
from .errors import LoweringError, error_line
from .inspect import GRAPH_INFERENCE, META_STATIC, META_VAL, first_device, marked_static_positions, op_name
from .planner import plan_graph
from .program import LoweredProgram, LoweredRegion, ProgramSignature
from .program_inputs import InputSpec, InputSpecs
from .region import Region
from .routes import RegionProgram, registry
from .stitch import COMPILE_LOCK, RegionRunner


def lower(
    model: torch.nn.Module,
    args: Sequence[Any] | Any,
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    **options: Any,
) -> LoweredProgram:
    """``model`` exported, planned and lowered region by region; see the module docstring.

    ``options`` are ``auto``'s (``routes``, ``strict``, ``verify``, ...), and the
    ``DISPATCH_*`` environment variables override them as they do for ``auto``."""
    from .backend import configure_logging, onnxrt_may_run

    config = Config.resolve(options)
    configure_logging(config.log_level)
    if not isinstance(model, torch.nn.Module):
        raise LoweringError(
            f"dispatch.lower takes an nn.Module, got {type(model).__name__}. "
            "Instead: wrap the function in a module whose forward calls it"
        )
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    flat, _ = pytree.tree_flatten((args, kwargs))
    with (
        COMPILE_LOCK,
        using(ArtifactCache(config.cache_dir)),
        inductor_cache(config.cache_dir),
        torch.no_grad(),
    ):
        exported = _export(model, args, kwargs, dynamic_shapes, onnxrt_may_run(config, flat))
        gm = exported.graph_module
        weights, names = _weights_and_names(exported, model)
        user = [p for p in gm.graph.find_nodes(op="placeholder")][len(weights) :]
        flat_inputs = [*weights.values(), *_user_inputs(exported, args, kwargs, len(user))]
        graph_plan, split = plan_graph(gm, GRAPH_INFERENCE, config, 0, names)
        regions = _lower_regions(split, graph_plan.regions, flat_inputs, config)
    signature = ProgramSignature(
        _input_specs(exported, user),
        exported.call_spec.in_spec,
        exported.call_spec.out_spec,
        tuple(_kwarg_names(exported.call_spec.in_spec)),
    )
    return LoweredProgram.assemble(split, regions, weights, signature)


def _export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    for_onnx: bool,
) -> torch.export.ExportedProgram:
    from .decompositions import onnx_friendly

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            exported = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
            # ONNX Runtime's regions take torch-level ops (linear exports as one Gemm);
            # the other routes take core aten, as AOTAutograd gives them under auto.
            table = onnx_friendly() if for_onnx else torch.export.default_decompositions()
            exported = exported.run_decompositions(table)
    except Exception as error:
        detail = error_line(error, 400)
        hint = ""
        if "cache_utils" in detail:  # a transformers decoder returning its KV cache object
            hint = "pass use_cache=False (or set model.config.use_cache = False) so that no cache object is returned, or "
        raise LoweringError(
            f"torch.export could not export {type(model).__name__}: {detail}. Instead: {hint}"
            "use torch.compile(model, backend='auto'), which runs models with graph breaks; lower needs one graph"
        ) from error
    return exported


def _weights_and_names(
    exported: torch.export.ExportedProgram, model: torch.nn.Module
) -> tuple[dict[str, torch.Tensor], dict[int, str]]:
    """The parameters, buffers and constants the graph takes before the user's
    inputs (by placeholder name), and every input's name for ``explain``-style
    reports. Raises where the program would change state when it runs."""
    from torch.export.graph_signature import InputKind, OutputKind

    signature = exported.graph_signature
    for out in signature.output_specs:
        if out.kind != OutputKind.USER_OUTPUT:
            what = out.kind.name.lower().replace("_", " ")
            raise LoweringError(
                f"{type(model).__name__} updates {out.target} when it runs ({what}); a lowered program "
                "runs inference and changes no state. Instead: call model.eval(), or keep the update "
                "outside forward"
            )
    weights: dict[str, torch.Tensor] = {}
    names: dict[int, str] = {}
    for i, spec in enumerate(signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            names[i] = spec.arg.name
            continue
        names[i] = spec.target or spec.arg.name
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            table = exported.state_dict if spec.target in exported.state_dict else exported.constants
            value = table[spec.target]
            if not isinstance(value, torch.Tensor):
                raise LoweringError(f"{spec.target} is a {type(value).__name__}; lower saves tensors only")
            weights[spec.arg.name] = value.detach()
        else:
            raise LoweringError(
                f"input {spec.arg.name} of the exported program is a {spec.kind.name.lower()}; "
                "dispatch.lower takes tensors, parameters and buffers only"
            )
    if list(weights) != [p.name for p in exported.graph.find_nodes(op="placeholder")][: len(weights)]:
        raise LoweringError("the exported program's parameters do not come before its inputs")
    for i, node in enumerate(exported.graph_module.graph.find_nodes(op="placeholder")):
        if i < len(weights):
            node.meta[META_STATIC] = True
    return weights, names


def _user_inputs(
    exported: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any], count: int
) -> list[Any]:
    ordered = {k: kwargs[k] for k in _kwarg_names(exported.call_spec.in_spec) if k in kwargs}
    flat, _ = pytree.tree_flatten((args, ordered))
    if len(flat) != count:
        raise LoweringError(f"the exported program takes {count} inputs, the call gave {len(flat)}")
    return flat


def _kwarg_names(in_spec: pytree.TreeSpec) -> list[str]:
    """The keyword arguments' names, in the order the exported program flattens them."""
    kwargs_spec = in_spec.child(1)
    return list(kwargs_spec.context or [])


def _input_specs(exported: torch.export.ExportedProgram, user: list[torch.fx.Node]) -> InputSpecs:
    specs = []
    for node in user:
        value = node.meta.get(META_VAL)
        if isinstance(value, torch.Tensor):
            specs.append(
                InputSpec(
                    node.name,
                    str(value.dtype).removeprefix("torch."),
                    str(value.device),
                    tuple(int(s) if isinstance(s, int) else str(s) for s in value.shape),
                )
            )
        elif value is None or type(value) in (bool, int, float, str):
            specs.append(InputSpec(node.name, value=value))
        else:
            raise LoweringError(
                f"input {node.name} is a {type(value).__name__}; lower takes tensors and constants"
            )
    # Only the symbols of input dimensions: run_decompositions can leave others
    # behind (two, unbounded, for a transposed input with static shapes).
    named = {d for spec in specs for d in spec.shape or () if isinstance(d, str)}
    ranges = {}
    for symbol, bounds in exported.range_constraints.items():
        if str(symbol) in named:
            # torch's int_oo says is_finite; float() tells it from a bound
            upper = None if math.isinf(float(bounds.upper)) else int(bounds.upper)
            ranges[str(symbol)] = (max(0, int(bounds.lower)), upper)
    return InputSpecs(specs, ranges)


def _lower_regions(
    split: torch.fx.GraphModule, planned: list[Region], inputs: list[Any], config: Config
) -> dict[str, LoweredRegion]:
    """Every region lowered and loaded by its route, run once on its real inputs
    (in graph order, so each region sees the inputs the program will give it)."""
    by_name = {r.name: r for r in planned}
    env: dict[torch.fx.Node, Any] = {}
    remaining = iter(inputs)
    lowered: dict[str, LoweredRegion] = {}
    for node in split.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(remaining)
            continue
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        if node.op == "call_module":
            sub = split.get_submodule(node.target)
            assert isinstance(sub, torch.fx.GraphModule)
            lowered[node.target], env[node] = _lower_region(sub, by_name[node.target], args, config)
        elif node.op == "call_function":
            env[node] = node.target(*args, **kwargs)
    return lowered


def _lower_region(
    gm: torch.fx.GraphModule, region: Region, args: tuple[Any, ...], config: Config
) -> tuple[LoweredRegion, Any]:
    runner = RegionRunner(gm, region, config)  # the chain, the fallbacks and their warnings
    while True:
        run = runner.run
        route = registry.get(run.route)
        specs: dict[str, Any] = {
            "device": str(first_device(args)),
            "static": marked_static_positions(gm),
            "outputs_survive": not config.reduce_overhead,
        }
        if route.wraps:
            specs["inner"] = run.inner_route
        try:
            result = route.preprocess(RegionProgram(gm, args), specs)
            # The real inputs let a route check its first call against torch (onnxrt).
            fn = route.load(result.processed_bytes, RegionProgram(gm, args), result.specs)
            fed = tuple(None if i in result.baked else a for i, a in enumerate(args))
            out = fn(*fed)
            if config.verify and run.route != "eager":
                check_close(gm(*args), out)
        except Exception as error:
            if run.route == "eager":
                raise  # eager is the reference: its error is the user's to see
            runner.next_route("lower", error)
            continue
        record = run.outcome()
        return LoweredRegion(record, gm, result, fn, [node_source(n) for n in _ops(gm)]), out


def _ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def node_source(node: torch.fx.Node) -> dict[str, Any]:
    """Where an aten node came from: the module path in the model, and the file and
    line of the model's code (the innermost frame outside torch, else the innermost)."""
    stack = node.meta.get("nn_module_stack") or {}
    module = list(stack.values())[-1][0] if stack else ""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    outside = [f for f in frames if not f[0].startswith(torch_dir)]
    file, line = (outside or frames or [("", "0")])[-1]
    return {"node": node.name, "op": op_name(node), "module": module, "file": file, "line": int(line)}
