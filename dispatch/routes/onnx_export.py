"""ONNX export of one aten region, static or with dynamic axes.

A region of a dynamic-shape graph is exported once, with every symbolic input
dimension as an ONNX dynamic axis, instead of once per shape. Symbolic sizes
that Dynamo passes as separate ``SymInt`` inputs become ``sym_size`` reads of a
tensor input that carries the same size, so the ONNX model takes tensors only.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL, is_size_arithmetic
from .onnx_fusions import fusible_for_onnx_runtime
from .onnx_guards import shape_guards
from .onnx_model import OnnxModel
from .onnx_nan import flag_nan_inputs, nan_as_in_torch
from .onnx_outputs import output_values
from .onnx_rebake import Rebake
from .onnx_registry import exporters_quiet
from .onnx_rewrites import rewrite_for_onnx
from .onnx_translate import to_onnx_program


def export_region(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    frozen: frozenset[int] = frozenset(),
    flag_nan: bool = False,
) -> OnnxModel:
    """The ONNX model of an aten region, its large initializers kept beside the graph.

    Placeholders at the ``frozen`` positions become constants (buffers of the
    exported module) holding the values in ``example_inputs``. Symbolic
    dimensions of the other inputs become dynamic axes, and the model carries the
    guards on their sizes that the export took (``onnx_guards.py``). The ops that pass over
    NaN (``onnx_nan.py``) compute torch's result in the model, or with
    ``flag_nan`` are left as they are and flagged in a last output, ``NAN_SEEN``,
    where the model has one. Its ``for_other_weights`` bakes another set of
    weights into the same export without exporting again (``onnx_rebake.py``).
    """
    root = torch.nn.Module()
    graph = copy.deepcopy(gm.graph)
    placeholders = graph.find_nodes(op="placeholder")
    args, dynamic, positions, buffers = [], [], {}, {}
    for i, node in enumerate(placeholders):
        value = example_inputs[i]
        value = value.detach() if isinstance(value, torch.Tensor) else value
        if i in frozen:
            name = buffers[i] = f"frozen_{node.name}"
            root.register_buffer(name, value)
            with graph.inserting_before(node):
                constant = graph.get_attr(name)
            constant.meta.update(node.meta)
            node.replace_all_uses_with(constant)
            graph.erase_node(node)
        elif isinstance(value, torch.Tensor):
            # The parent graph named the placeholder after the node that feeds it
            # (``convert_element_type_default_1``); the export's decompositions
            # can name one of their own nodes the same, and the ONNX graph then
            # has a value that is both an input and an output: the export failed.
            node._rename(f"region_input_{i}")
            node.target = node.name
            args.append(value)
            dynamic.append(_dynamic_axes(node))
            positions[node.name] = i
    _sizes_from_tensors(graph)
    rewrite_for_onnx(graph)
    fusible_for_onnx_runtime(graph)
    module = torch.fx.GraphModule(root, graph)
    dynamic_shapes = tuple(dynamic) if any(dynamic) else None
    with exporters_quiet(), torch.no_grad():
        program = _export(module, tuple(args), dynamic_shapes)
    guards = shape_guards(program, positions) if dynamic_shapes is not None else ()
    finish = functools.partial(finished_model, gm, flag_nan, guards)
    model = finish(program.model)
    if buffers:
        model.for_other_weights = Rebake.of(program, buffers, finish)
    return model


def finished_model(
    gm: torch.fx.GraphModule, flag_nan: bool, guards: tuple[str, ...], model: Any
) -> OnnxModel:
    """The exporter's ``onnx_ir`` model of ``gm``, its outputs in ``gm``'s dtypes and
    its NaN handling in place, as an ``OnnxModel``."""
    _outputs_in_traced_dtypes(model, gm)
    if flag_nan:
        flag_nan_inputs(model)
    else:
        nan_as_in_torch(model)
    return OnnxModel.from_ir(model, guards)


def _outputs_in_traced_dtypes(model: Any, gm: torch.fx.GraphModule) -> None:
    """Cast each output of the ``onnx_ir`` model ``model`` whose element type is not
    the dtype ``gm`` traced for it to that dtype.

    torchlib sums a float16 tensor in float32 (ONNX Runtime's float16 ReduceSum
    accumulates in float16) and returns the float32 sum: a float16 model whose
    graph ended in ``sum`` returned float32 where eager returns float16. Torch
    sums float16 in float32 too and rounds once at the end, so the cast gives
    torch's values."""
    import onnx_ir as ir
    from onnx_ir.tensor_adapters import from_torch_dtype

    traced = output_values(gm)
    outputs = model.graph.outputs
    if len(traced) != len(outputs):
        return  # the session's output count check names this mismatch
    for k, (value, expected) in enumerate(zip(list(outputs), traced)):
        if not isinstance(expected, torch.Tensor) or expected.dtype == torch.bool:
            continue  # booleans: ORT's bool arrives as uint8 and is viewed back (onnx_session.py)
        want = from_torch_dtype(expected.dtype)
        if value.dtype is None or value.dtype == want:
            continue
        cast = ir.node("Cast", [value], {"to": want}, name=f"{value.name}_as_traced")
        model.graph.append(cast)
        result = cast.outputs[0]
        result.name, result.dtype, result.shape = f"{value.name}_as_traced", want, value.shape
        outputs[k] = result


def fed_positions(example_inputs: Sequence[Any], frozen: frozenset[int]) -> list[int]:
    """Positions of the region inputs that the exported model takes, in its input order."""
    return [i for i, v in enumerate(example_inputs) if i not in frozen and isinstance(v, torch.Tensor)]


def _dynamic_axes(node: torch.fx.Node) -> dict[int, Any]:
    value = node.meta.get(META_VAL)
    if not isinstance(value, torch.Tensor):
        return {}
    return {d: torch.export.Dim.DYNAMIC for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt)}


def size_without_tensor(nodes: Collection[torch.fx.Node]) -> str | None:
    """Where the region made of ``nodes`` would take a size input that is no
    dimension of one of its tensor inputs, why ONNX Runtime cannot run it (the
    check ``_sizes_from_tensors`` makes at export, made at plan time); else None."""
    for node in _sizes_without_tensor(nodes):
        return (
            f"its size input {node.name} = {node.meta[META_VAL]} is no dimension of a tensor input "
            "of the region, and ONNX Runtime takes tensors only"
        )
    return None


def reading_sizes_without_tensor(nodes: Collection[torch.fx.Node]) -> set[torch.fx.Node]:
    """The nodes of a region that ``size_without_tensor`` refuses which read such a
    size: directly, or through size arithmetic on it. Left to another route, they
    hand the region tensors, which ORT takes, and the rest of the region can run
    there. Transformers' sliding-window caches keep a Python int
    (``cumulative_length``) that Dynamo makes a size input of every decoding step;
    in Mistral and Gemma 2 only the mask's position offsets and the cache's next
    length read it, and refusing the whole region ran their decoding steps eagerly."""
    inside = set(nodes)
    reading: set[torch.fx.Node] = set()
    pending = [u for n in _sizes_without_tensor(nodes) for u in n.users if u in inside]
    while pending:
        node = pending.pop()
        if node in reading:
            continue
        reading.add(node)
        if is_size_arithmetic(node):  # a size made of it: its readers read it too
            pending.extend(u for u in node.users if u in inside)
    return reading


def _sizes_without_tensor(nodes: Collection[torch.fx.Node]) -> list[torch.fx.Node]:
    """The size inputs of the region made of ``nodes`` that no dimension of its tensor inputs holds."""
    inside = set(nodes)
    outside = {a for n in nodes for a in n.all_input_nodes if a not in inside}
    dims = _dimension_sources(outside)
    return [
        n
        for n in outside
        if isinstance(value := n.meta.get(META_VAL), torch.SymInt) and value.node.expr not in dims
    ]


def _dimension_sources(nodes: Iterable[torch.fx.Node]) -> dict[Any, tuple[torch.fx.Node, int]]:
    """Each symbolic size that a dimension of a tensor among ``nodes`` holds (by its
    expression) -> the first such tensor and dimension."""
    sources: dict[Any, tuple[torch.fx.Node, int]] = {}
    for node in nodes:
        value = node.meta.get(META_VAL)
        if isinstance(value, torch.Tensor):
            for d, s in enumerate(value.shape):
                if isinstance(s, torch.SymInt):
                    sources.setdefault(s.node.expr, (node, d))
    return sources


def _sizes_from_tensors(graph: torch.fx.Graph) -> None:
    """Replace each ``SymInt`` placeholder by ``sym_size`` of a tensor input of that size.

    ORT takes tensors only; Dynamo passes a dynamic size both as a tensor's
    dimension and as a separate integer input."""
    placeholders = graph.find_nodes(op="placeholder")
    if not placeholders:
        return  # every input was a weight, baked in: the model takes no input
    sources = _dimension_sources(placeholders)
    # The partitioner may leave ops between placeholders: inputs first, so that
    # the sizes read from them precede every use.
    previous = None
    for node in placeholders:
        if previous is None:
            head = next(iter(graph.nodes))
            if node is not head:
                head.prepend(node)
        else:
            previous.append(node)
        previous = node
    last_input = placeholders[-1]
    for node in placeholders:
        value = node.meta.get(META_VAL)
        if not isinstance(value, torch.SymInt):
            continue
        source = sources.get(value.node.expr)
        if source is None:
            raise RuntimeError(
                f"onnxrt: the size input {node.name} = {value} is no dimension of a tensor input; "
                "ONNX Runtime takes tensors only"
            )
        with graph.inserting_after(last_input):
            size = graph.call_function(torch.ops.aten.sym_size.int, source)
        size.meta[META_VAL] = value
        node.replace_all_uses_with(size)
        graph.erase_node(node)


def _export(module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any) -> Any:
    """``torch.onnx.export`` of ``module``, traced by non-strict ``torch.export``.

    We trace ourselves because the exporter may try strict (Dynamo) export
    first, and that calls ``torch._dynamo.reset()``: every function the user
    compiled would lose its cache and recompile, static again. The aten region
    needs no Dynamo anyway. The exporter's steps after the trace are
    ``onnx_translate.py``'s: with the registry built once per process, and
    without decompositions where they would change nothing."""
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    return to_onnx_program(program, args)
