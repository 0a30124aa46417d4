"""Whether a graph is an update step: it writes its own inputs in place and
multiplies no matrices. An optimizer's ``step()`` compiled (AdamW, SGD with
momentum: parameters, moments and step counts updated elementwise), or an
average of weights kept beside a model, traces to such a graph.

ONNX Runtime runs such a graph badly: it writes nothing in place, so every
updated tensor comes back as a new output and is copied back, one copy per
tensor, after kernels that each made a pass of their own. Inductor writes
them in place in a few fused loops, which is why torch's own guide compiles
the optimizer with it. Dynamo's graph shows the writes as ops (``mul_`` on a
parameter); the functional aten graph AOTAutograd makes of it does not, and
AOTAutograd's metadata for the graph it is compiling says which inputs it
updates.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

#: ops (by base name, at torch level or aten level) that multiply matrices or convolve:
#: where ONNX Runtime's kernels lead inductor's
_MATRIX_OPS = frozenset(
    {
        "addbmm",
        "addmm",
        "addmv",
        "baddbmm",
        "bilinear",
        "bmm",
        "dot",
        "einsum",
        "linear",
        "matmul",
        "mm",
        "mv",
        "tensordot",
        "__matmul__",
    }
)
_CONVOLUTION_PREFIXES = ("conv1d", "conv2d", "conv3d", "conv_transpose")
_IN_PLACE_OPERATORS = frozenset(
    {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow, operator.setitem}
)


def is_update_step(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` (Dynamo's graph, or the aten graph AOTAutograd is compiling
    now) writes one of its inputs in place and has no matrix product or
    convolution (module docstring)."""
    writes_input = False
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return False  # a module Dynamo did not inline: what it computes is unknown
        if node.op not in ("call_function", "call_method"):
            continue
        name = _base_name(node)
        if _multiplies_matrices(name):
            return False
        writes_input = writes_input or (
            _writes_in_place(node, name) and _is_input(node.args[0] if node.args else None)
        )
    return writes_input or bool(mutated_inputs())


def aot_input_info() -> list[Any] | None:
    """AOTAutograd's metadata of each input of the graph it is compiling now (what
    it mutates, whether it requires grad); None outside its compile."""
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    return None if meta is None else list(meta.input_info)


def mutated_inputs() -> frozenset[int]:
    """Positions of the inputs that AOTAutograd saw the graph it is compiling now
    update in place; empty outside its compile."""
    info = aot_input_info() or []
    return frozenset(i for i, each in enumerate(info) if each.mutates_data or each.mutates_metadata)


def _multiplies_matrices(name: str) -> bool:
    return (
        name in _MATRIX_OPS
        or name.startswith(_CONVOLUTION_PREFIXES)
        or "convolution" in name  # aten.convolution, mkldnn_convolution, ...
        or "scaled_dot_product" in name
    )


def _base_name(node: torch.fx.Node) -> str:
    """``mm`` for ``aten.mm.default``, ``torch.mm`` and ``Tensor.mm``; ``mul_`` for ``Tensor.mul_``."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "")


def _writes_in_place(node: torch.fx.Node, name: str) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return bool(schema.arguments) and schema.arguments[0].alias_info is not None and schema.is_mutable
    if target in _IN_PLACE_OPERATORS:
        return True
    return name.endswith("_") and not name.endswith("__")


def _is_input(arg: object) -> bool:
    """A placeholder or an attribute of the graph (Dynamo keeps an optimizer's
    parameters and state as attributes), or a list of them (``_foreach_*_``)."""
    if isinstance(arg, (list, tuple)):
        return bool(arg) and all(_is_input(a) for a in arg)
    return isinstance(arg, torch.fx.Node) and arg.op in ("placeholder", "get_attr")
