"""ONNX export of one aten region, static or with dynamic axes.

A region of a dynamic-shape graph is exported once, with every symbolic input
dimension as an ONNX dynamic axis, instead of once per shape. Symbolic sizes
that Dynamo passes as separate ``SymInt`` inputs become ``sym_size`` reads of a
tensor input that carries the same size, so the ONNX model takes tensors only.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL, tensor_value
from .onnx_model import OnnxModel
from .onnx_ops import arguments_by_name, export_opset, onnx_registry, quiet_loggers
from .onnx_outputs import output_values


def export_region(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], frozen: frozenset[int] = frozenset()
) -> OnnxModel:
    """The ONNX model of an aten region, its large initializers kept beside the graph.

    Placeholders at the ``frozen`` positions become constants (buffers of the
    exported module) holding the values in ``example_inputs``. Symbolic
    dimensions of the other inputs become dynamic axes.
    """
    root = torch.nn.Module()
    graph = copy.deepcopy(gm.graph)
    placeholders = graph.find_nodes(op="placeholder")
    args, dynamic = [], []
    for i, node in enumerate(placeholders):
        value = example_inputs[i]
        value = value.detach() if isinstance(value, torch.Tensor) else value
        if i in frozen:
            name = f"frozen_{node.name}"
            root.register_buffer(name, value)
            with graph.inserting_before(node):
                constant = graph.get_attr(name)
            constant.meta.update(node.meta)
            node.replace_all_uses_with(constant)
            graph.erase_node(node)
        elif isinstance(value, torch.Tensor):
            args.append(value)
            dynamic.append(_dynamic_axes(node))
    _sizes_from_tensors(graph)
    _linear_from_transposed_constants(graph)
    _attention_rows_all_masked_as_torch(graph)
    _attention_with_grouped_heads(graph)
    _int64_indices(graph)
    _floor_divide_in_result_dtype(graph)
    module = torch.fx.GraphModule(root, graph)
    dynamic_shapes = tuple(dynamic) if any(dynamic) else None
    with _exporters_quiet(), torch.no_grad():
        program = _export(module, tuple(args), dynamic_shapes)
    _outputs_in_traced_dtypes(program.model, gm)
    return OnnxModel.from_ir(program.model)


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
            continue  # booleans: ORT's bool arrives as uint8 and is viewed back (onnxrt.py)
        want = from_torch_dtype(expected.dtype)
        if value.dtype is None or value.dtype == want:
            continue
        cast = ir.node("Cast", [value], {"to": want}, name=f"{value.name}_as_traced")
        model.graph.append(cast)
        result = cast.outputs[0]
        result.name, result.dtype, result.shape = f"{value.name}_as_traced", want, value.shape
        outputs[k] = result


# The exporter and the ONNX optimizer passes it runs log their progress and
# notes (onnx_ir: "Skipped deduplication of initializer ...") at WARNING; none
# of it is the user's to act on, and a failed export raises anyway.
_EXPORT_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


@contextlib.contextmanager
def _exporters_quiet() -> Iterator[None]:
    with quiet_loggers(*_EXPORT_LOGGERS), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def fed_positions(example_inputs: Sequence[Any], frozen: frozenset[int]) -> list[int]:
    """Positions of the region inputs that the exported model takes, in its input order."""
    return [i for i, v in enumerate(example_inputs) if i not in frozen and isinstance(v, torch.Tensor)]


def _dynamic_axes(node: torch.fx.Node) -> dict[int, Any]:
    value = node.meta.get(META_VAL)
    if not isinstance(value, torch.Tensor):
        return {}
    return {d: torch.export.Dim.DYNAMIC for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt)}


def _sizes_from_tensors(graph: torch.fx.Graph) -> None:
    """Replace each ``SymInt`` placeholder by ``sym_size`` of a tensor input of that size.

    ORT takes tensors only; Dynamo passes a dynamic size both as a tensor's
    dimension and as a separate integer input."""
    placeholders = graph.find_nodes(op="placeholder")
    if not placeholders:
        return  # every input was a weight, baked in: the model takes no input
    sources: dict[Any, tuple[torch.fx.Node, int]] = {}
    for node in placeholders:
        value = node.meta.get(META_VAL)
        if isinstance(value, torch.Tensor):
            for d, s in enumerate(value.shape):
                if isinstance(s, torch.SymInt):
                    sources.setdefault(s.node.expr, (node, d))
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


# Advanced indexing exports as GatherND / ScatterND, which take int64 indices only.
_INDEXING_OPS = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default)
# torch indexes with int64 or int32 tensors (uint8 and bool ones are masks).
_NARROW_INDEX_DTYPES = (torch.int32,)


def _int64_indices(graph: torch.fx.Graph) -> None:
    """``x[i]`` and ``x[i] = v`` with int32 indices ``i`` index with ``i`` as
    int64, as torch reads them. Exported as they were, ONNX Runtime
    rejected the model (GatherND takes int64 indices) and the whole region
    around the index fell back to eager."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _INDEXING_OPS:
            continue
        indices = list(node.args[1])
        for k, index in enumerate(indices):
            value = tensor_value(index)
            if value is None or value.dtype not in _NARROW_INDEX_DTYPES:
                continue
            indices[k] = _cast_before(graph, node, index, torch.int64)
        node.args = (node.args[0], indices, *node.args[2:])


def _floor_divide_in_result_dtype(graph: torch.fx.Graph) -> None:
    """``a // 2.0`` of an integer tensor ``a`` divides ``a`` cast to the result's
    float dtype, as torch's type promotion does first. torchlib could not
    convert the mixed form and the region around it fell back to eager."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.floor_divide.default:
            continue
        value, result = tensor_value(node.args[0]), tensor_value(node)
        if value is None or result is None or value.dtype == result.dtype:
            continue
        node.args = (_cast_before(graph, node, node.args[0], result.dtype), *node.args[1:])


def _cast_before(graph: torch.fx.Graph, node: torch.fx.Node, value: Any, dtype: torch.dtype) -> torch.fx.Node:
    """``value`` cast to ``dtype`` by a node inserted before ``node``."""
    with graph.inserting_before(node):
        return graph.call_function(torch.ops.aten._to_copy.default, (value,), {"dtype": dtype})


def _linear_from_transposed_constants(graph: torch.fx.Graph) -> None:
    """``addmm(b, x, t(W))`` and ``mm(x, t(W))`` of a baked weight ``W`` become ``linear``.

    AOTAutograd lowers ``nn.Linear`` to a matmul with the transposed weight. Exported
    so, the ONNX optimizer folds ``t(W)`` into a second, transposed copy of the
    weight (12 MB more peak memory on the 1024-wide MLP); ``linear`` exports as
    ``Gemm(transB=1)`` on ``W`` itself, as a direct export of the module does."""
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.addmm.default and len(node.args) == 3:
            bias, x, weight_t = node.args
            bias_value = tensor_value(bias)
            if bias_value is None or bias_value.dim() != 1:
                continue
        elif node.target is aten.mm.default:
            (x, weight_t), bias = node.args, None
        else:
            continue
        weight = _transposed_constant(weight_t)
        if weight is None:
            continue
        with graph.inserting_before(node):
            linear = graph.call_function(
                aten.linear.default, (x, weight) + ((bias,) if bias is not None else ())
            )
        linear.meta.update(node.meta)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        if not weight_t.users:
            graph.erase_node(weight_t)


# The fused attention ops that AOTAutograd leaves in an aten graph, and the name
# each gives its mask argument.
_FUSED_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu": "attn_mask",
    "_scaled_dot_product_flash_attention": None,
    "_scaled_dot_product_efficient_attention": "attn_bias",
    "_scaled_dot_product_cudnn_attention": "attn_bias",
}


def _attention_rows_all_masked_as_torch(graph: torch.fx.Graph) -> None:
    """A fused attention op with a mask gives zeros, as torch's kernels do, for a
    query whose keys are all masked: such a row's mask is lifted and its output
    multiplied by zero.

    ORT's translation takes the softmax of a row of -inf and returns NaN there:
    a left-padded LLaMA batch (its padding queries see no key) came back NaN
    where eager's output has none."""
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        mask_name = _FUSED_ATTENTION.get(node.target._opname)
        if mask_name is None:
            continue
        arguments = arguments_by_name(node)
        mask = arguments.get(mask_name)
        value = tensor_value(mask)
        if value is None or value.dim() < 2:
            continue
        with graph.inserting_before(node):
            if value.dtype == torch.bool:
                seen = graph.call_function(aten.any.dim, (mask, -1, True))
                lifted = graph.call_function(
                    aten.logical_or.default, (mask, graph.call_function(aten.logical_not.default, (seen,)))
                )
            else:
                allowed = graph.call_function(aten.ne.Scalar, (mask, float("-inf")))
                seen = graph.call_function(aten.any.dim, (allowed, -1, True))
                unseen = graph.call_function(aten.logical_not.default, (seen,))
                lifted = graph.call_function(aten.masked_fill.Scalar, (mask, unseen, 0.0))
        node.args, node.kwargs = (), {**arguments, mask_name: lifted}
        for user in list(node.users):
            if user.target is not operator.getitem or user.args[1] != 0:
                continue
            with graph.inserting_after(user):
                zeroed = graph.call_function(aten.mul.Tensor, (user, seen))
            user.replace_all_uses_with(zeroed, delete_user_cb=lambda n, keep=zeroed: n is not keep)


def _attention_with_grouped_heads(graph: torch.fx.Graph) -> None:
    """A fused attention op whose key has fewer heads than its query becomes
    ``scaled_dot_product_attention(..., enable_gqa=True)``.

    The CPU and CUDA attention kernels take grouped-query attention (LLaMA's
    ``num_key_value_heads``) as it comes, but torchlib translates these ops
    without repeating the key and value heads: ORT then refuses the model
    ("MatMul: Incompatible dimensions"), and the region fell back to eager.
    torchlib's translation of ``scaled_dot_product_attention`` repeats them
    where ``enable_gqa`` asks. Only the attention output may be used: the
    rewritten op has no log-sum-exp."""
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = node.target._opname
        if name not in _FUSED_ATTENTION:
            continue
        arguments = arguments_by_name(node)
        query, key, value = (arguments[n] for n in ("query", "key", "value"))
        q, k = tensor_value(query), tensor_value(key)
        if q is None or k is None or q.dim() != 4 or k.dim() != 4:
            continue
        if q.shape[1] == k.shape[1]:
            continue
        users = list(node.users)
        if not all(u.target is operator.getitem and u.args[1] == 0 for u in users):
            continue
        mask_name = _FUSED_ATTENTION[name]
        with graph.inserting_before(node):
            attention = graph.call_function(
                aten.scaled_dot_product_attention.default,
                (query, key, value, arguments.get(mask_name) if mask_name else None),
                {
                    "dropout_p": arguments.get("dropout_p", 0.0),
                    "is_causal": arguments.get("is_causal", False),
                    "scale": arguments.get("scale"),
                    "enable_gqa": True,
                },
            )
        attention.meta[META_VAL] = node.meta[META_VAL][0]
        for user in users:
            user.replace_all_uses_with(attention)
            graph.erase_node(user)
        graph.erase_node(node)


def _transposed_constant(node: Any) -> torch.fx.Node | None:
    """``W`` where ``node`` is ``t(W)`` or ``permute(W, [1, 0])`` of a baked 2-D constant."""
    aten = torch.ops.aten
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.kwargs:
        return None
    if node.target is aten.t.default or (
        node.target is aten.permute.default and node.args[1] in ([1, 0], (1, 0))
    ):
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and source.op == "get_attr":
            return source
    return None


def _export(module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any) -> Any:
    """``torch.onnx.export`` of ``module``, traced by non-strict ``torch.export``.

    We trace ourselves because the exporter may try strict (Dynamo) export
    first, and that calls ``torch._dynamo.reset()``: every function the user
    compiled would lose its cache and recompile, static again. The aten region
    needs no Dynamo anyway. The exporter's own implementation takes the
    registry we build once per process (the public function rebuilds it on
    every call); should that private signature change, the public one is used."""
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    try:
        from torch.onnx._internal.exporter import _core as core
    except ImportError:
        core = None  # type: ignore[assignment]
    if core is not None:
        try:
            return core.export(
                program,
                args,
                None,
                registry=onnx_registry(),
                optimize=True,
                verbose=False,
                report=False,
                opset_version=export_opset(),
            )
        except TypeError:
            pass
    return torch.onnx.export(
        program, args, dynamo=True, optimize=True, verbose=False, report=False, opset_version=export_opset()
    )
