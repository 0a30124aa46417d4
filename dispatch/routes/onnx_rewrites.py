"""Rewrites of an aten region before its ONNX export, each where torchlib's
translation of an op is missing, refused by ONNX Runtime, or not torch's: the
region would otherwise fall back to eager, or compute something else."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL, tensor_value
from .onnx_ops import AS_STRIDED, SORTS, arguments_by_name, as_strided_storage


def rewrite_for_onnx(graph: torch.fx.Graph) -> None:
    """Every rewrite below, in place, on a region whose baked weights are already
    ``get_attr`` constants."""
    _linear_from_transposed_constants(graph)
    _attention_rows_all_masked_as_torch(graph)
    _attention_with_grouped_heads(graph)
    _int64_indices(graph)
    _floor_divide_in_result_dtype(graph)
    _clamps_as_max_or_min(graph)
    _reductions_over_every_dim_name_them(graph)
    _symbolic_scalars_as_tensors(graph)
    _stable_sorts_as_topk(graph)
    _as_strided_over_storage_order(graph)


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


_ONE_SIDED_CLAMPS = (
    torch.ops.aten.clamp_min.default,
    torch.ops.aten.clamp_max.default,
    torch.ops.aten.clamp.default,
)
# With a tensor bound, torchlib exports Max/Min, except for a 0-dim bound: Clip.
_TENSOR_CLAMPS = {
    torch.ops.aten.clamp_min.Tensor: torch.ops.aten.maximum.default,
    torch.ops.aten.clamp_max.Tensor: torch.ops.aten.minimum.default,
}


def _clamps_as_max_or_min(graph: torch.fx.Graph) -> None:
    """A float clamp with one bound, a number or a tensor, becomes ``maximum`` or
    ``minimum`` with that bound (ONNX ``Max``/``Min``, which keep infinities and
    NaN as torch does). torchlib exported it as a one-sided ``Clip``, which clips
    at the float's largest finite value: ``clamp_min(inf, 0.1)`` came back as 3.4e38."""
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (*_ONE_SIDED_CLAMPS, *_TENSOR_CLAMPS):
            continue
        like = tensor_value(node.args[0])
        if like is None or not like.is_floating_point():
            continue
        if node.target in _TENSOR_CLAMPS:
            node.target = _TENSOR_CLAMPS[node.target]
            continue
        arguments = arguments_by_name(node)
        if node.target is aten.clamp.default:
            low, high = arguments.get("min"), arguments.get("max")
        elif node.target is aten.clamp_min.default:
            low, high = node.args[1], None
        else:
            low, high = None, node.args[1]
        bound = low if high is None else high
        if (low is None) == (high is None) or not isinstance(bound, (int, float)):
            continue
        with graph.inserting_before(node):
            limit = graph.call_function(
                aten.full.default, ([], bound), {"dtype": like.dtype, "device": like.device}
            )
            op = aten.maximum.default if high is None else aten.minimum.default
            clamped = graph.call_function(op, (node.args[0], limit))
        node.replace_all_uses_with(clamped)
        graph.erase_node(node)


def _reductions_over_every_dim_name_them(graph: torch.fx.Graph) -> None:
    """``amax(x)`` and ``amin(x)`` (no dims: every dim) name every dim. torchlib's
    translation requires the argument, and the region around the op fell back to eager."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (
            torch.ops.aten.amax.default,
            torch.ops.aten.amin.default,
        ):
            continue
        value = tensor_value(node.args[0])
        arguments = arguments_by_name(node)
        if value is None or arguments.get("dim") not in (None, [], ()):
            continue
        node.args, node.kwargs = (
            (node.args[0], list(range(value.dim())), bool(arguments.get("keepdim", False))),
            {},
        )


# Each op with a Scalar operand, and its overload that takes a tensor there.
_TENSOR_OVERLOADS = {
    torch.ops.aten.mul.Scalar: torch.ops.aten.mul.Tensor,
    torch.ops.aten.div.Scalar: torch.ops.aten.div.Tensor,
    torch.ops.aten.add.Scalar: torch.ops.aten.add.Tensor,
    torch.ops.aten.sub.Scalar: torch.ops.aten.sub.Tensor,
    torch.ops.aten.pow.Tensor_Scalar: torch.ops.aten.pow.Tensor_Tensor,
}


def _symbolic_scalars_as_tensors(graph: torch.fx.Graph) -> None:
    """``x * s`` where ``s`` is a symbolic float (attention's ``1 / sqrt(E)`` of a
    dynamic ``E``) multiplies by ``s`` as a 0-d tensor of ``x``'s dtype: torchlib's
    Scalar overloads call ``float()`` on it, which failed the export, and the whole
    region fell back to eager."""
    for node in list(graph.nodes):
        overload = _TENSOR_OVERLOADS.get(node.target) if node.op == "call_function" else None
        if overload is None or len(node.args) < 2 or not isinstance(node.args[1], torch.fx.Node):
            continue
        scalar = node.args[1].meta.get(META_VAL)
        value = tensor_value(node.args[0])
        if value is None or not isinstance(scalar, (torch.SymFloat, torch.SymInt)):
            continue
        with graph.inserting_before(node):
            made = graph.call_function(
                torch.ops.aten.scalar_tensor.default, (node.args[1],), {"dtype": value.dtype}
            )
        made.meta[META_VAL] = torch.empty((), dtype=value.dtype)
        node.target = overload
        node.args = (node.args[0], made, *node.args[2:])


def _stable_sorts_as_topk(graph: torch.fx.Graph) -> None:
    """``sort(stable=True)`` exports as the plain ``sort``, which torchlib turns
    into ONNX ``TopK``: TopK puts equal values in the order of their indices,
    the stable order. torchlib has no translation of the stable overload."""
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.sort.stable):
        args = arguments_by_name(node)
        if not args:
            continue
        node.target = torch.ops.aten.sort.default
        node.args = (node.args[0], args["dim"], args["descending"])
        node.kwargs = {}


def sorts_in_onnx_runtime_order(gm: torch.fx.GraphModule) -> None:
    """Every ``sort`` of the region ``gm`` made stable, in place: the order ONNX
    Runtime's TopK gives equal values, and one of those an unstable sort may give.
    The region's torch form (its first-call check, the calls torch runs for it)
    then orders ties as its session does. Sorting a mixture-of-experts router's
    expert ids, torch's unstable order and ORT's differed, the check refused the
    region, and the whole model around it ran eagerly."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SORTS:
            continue
        args = arguments_by_name(node)
        if not args or args.get("stable"):
            continue
        node.target = torch.ops.aten.sort.stable
        node.args = (node.args[0],)
        node.kwargs = {"stable": True, "dim": args["dim"], "descending": args["descending"]}
        changed = True
    if changed:
        gm.recompile()


def _as_strided_over_storage_order(graph: torch.fx.Graph) -> None:
    """``as_strided(x, ...)`` reads ``x`` permuted to its storage order and made
    contiguous, at its offset from ``x``'s first element: what torchlib's
    translation (which flattens the values it is given) needs to read torch's
    storage (``onnx_ops.as_strided_storage``; the others stay off ORT)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not AS_STRIDED:
            continue
        layout = as_strided_storage(node)
        if isinstance(layout, str):
            continue
        order, start = layout
        source, size, stride = node.args[0], node.args[1], node.args[2]
        with graph.inserting_before(node):
            if order != tuple(sorted(order)):
                source = graph.call_function(torch.ops.aten.permute.default, (source, list(order)))
                source = graph.call_function(
                    torch.ops.aten.clone.default, (source,), {"memory_format": torch.contiguous_format}
                )
        node.args, node.kwargs = (source, size, stride, start), {}


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
