"""NaN and infinity as torch computes them, in a region's ONNX model.

ONNX Runtime's CPU kernels for MaxPool, ReduceMax/ReduceMin and ArgMax/ArgMin
pass over a NaN that shares a window or a row with a number (onnxruntime issue
10514: which one wins depends on its position), where torch returns NaN and,
for the arg ops, the NaN's index (torch orders NaN above every number).
``Sign(NaN)`` is NaN where torch's ``sign(nan)`` is 0, and ORT pads a max
pooling with the lowest finite float, so a border window whose own elements are
all -inf came out as -3.4e38 (for a padded pooling, an input summing to -inf is
checked too). A model whose input or
activations held a NaN came back finite, and a caller's ``isnan`` check saw
nothing. The first-call check cannot see this: a first call rarely holds a NaN.

Under ``torch.compile`` (``flag_nan_inputs``) each such op runs as exported, and
the model gains one boolean output, ``NAN_SEEN``: whether any of their inputs
held a NaN (its sum is NaN: a NaN, or both infinities). Where it did, the call
is run again by torch (``onnxrt.py``), so its result is torch's own. The check
is one read of each input, and a 4-D one is read by ``GlobalAveragePool``,
which ORT runs in the blocked layout of the convolutions around it:
hf_resnet's ORT run took 110 µs with the flag against 108 without any check.

A lowered program runs no torch beside its regions, so there each op runs
under an ONNX ``If`` instead (``nan_as_in_torch``): only where the input's sum
is NaN does a branch compute torch's result from the op's twin over
``isnan(x)``. It is exact but slower: the ``If`` takes its input out of ORT's
blocked layout and the convolution after it loses its fused residual add
(hf_resnet: 138 against 108 µs; a max pooling of 1x64x112x112 alone took 194
against 140 µs). The ``If`` is built on the exported model, after the
exporter's optimizer, which mishandled values of unknown shape coming out of
an ``If`` (``x + 0`` became a flatten).

Two cases are settled on the aten region instead: a one-sided clamp exports as
Max/Min (``onnx_rewrites.py``), and a max pooling whose indices are read stays
off ORT (``onnx_ops.not_as_in_torch``).
"""

from __future__ import annotations

from typing import Any

# ONNX op -> the op that, run on the NaN mask with the same inputs and
# attributes, is positive where the op's window or row saw a NaN.
_DETECTORS = {
    "MaxPool": "MaxPool",
    "GlobalMaxPool": "GlobalMaxPool",
    "ReduceMax": "ReduceMax",
    "ReduceMin": "ReduceMax",
}
_ARG_OPS = ("ArgMax", "ArgMin")
_GUARDED = frozenset([*_DETECTORS, *_ARG_OPS, "Sign"])
# The name of the boolean output that ``flag_nan_inputs`` adds.
NAN_SEEN = "dispatch_nan_seen"


def nan_as_in_torch(model: Any) -> None:
    """Every op of ``model`` (an ``onnx_ir`` model) that passes over NaN, guarded."""
    for node in _passing_over_nan(model):
        _guarded(model.graph, node)


def flag_nan_inputs(model: Any) -> bool:
    """Give ``model`` (an ``onnx_ir`` model) a last output, the boolean ``NAN_SEEN``:
    whether the input of an op that passes over NaN held one. Those ops stay as
    exported. False, and nothing added, where the model has no such op."""
    import onnx_ir as ir

    graph, seen = model.graph, []
    for k, node in enumerate(_passing_over_nan(model)):
        x = node.inputs[0]
        read = []
        if x.dtype == ir.DataType.FLOAT and x.shape is not None and len(x.shape) == 4:
            # Runs in ORT's blocked layout, where a ReduceSum would take its input out of it.
            read.append(ir.node("GlobalAveragePool", [x]))
            x = read[-1].outputs[0]
        read += _unlike_torch(node, x)
        for j, made in enumerate(read):
            made.outputs[0].name = f"{NAN_SEEN}_{k}_{j}"
        graph.insert_before(node, read)
        seen.append(read[-1].outputs[0])
    if not seen:
        return False
    flag = seen[0]
    for k, other in enumerate(seen[1:]):
        either = ir.node("Or", [flag, other])
        either.outputs[0].name = f"{NAN_SEEN}_or{k}"
        graph.append(either)
        flag = either.outputs[0]
    flag.name, flag.dtype, flag.shape = NAN_SEEN, ir.DataType.BOOL, ir.Shape([])
    graph.outputs.append(flag)
    return True


def _passing_over_nan(model: Any) -> list[Any]:
    """The ops of ``model`` that pass over a NaN in their float input."""
    import onnx_ir as ir

    floats = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE}
    found = []
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _GUARDED:
            continue
        x = node.inputs[0]
        if x is None or x.dtype not in floats or any(o.uses() for o in node.outputs[1:]):
            continue
        found.append(node)
    return found


def _guarded(graph: Any, node: Any) -> None:
    """``node`` replaced by ``If(isnan(sum(x)))``: torch's result, else ``node`` as it was."""
    import onnx_ir as ir

    x, out = node.inputs[0], node.outputs[0]
    check = _unlike_torch(node, x)
    plain = _copy(node)
    exact = [_copy(node)]
    exact += _corrected(node, exact[0].outputs[0])
    branch = ir.node(
        "If",
        [check[-1].outputs[0]],
        {
            "then_branch": _branch(exact, out, "nan_as_torch"),
            "else_branch": _branch([plain], out, "as_exported"),
        },
        num_outputs=1,
    )
    name = out.name or f"nan_guarded_{id(node)}"
    # Values left unnamed are named at serialisation per graph, and a branch's
    # names then collide with the outer graph's (ORT refuses the model).
    for k, made in enumerate((*check, plain, *exact)):
        for value in made.outputs:
            value.name = f"{name}__nan{k}"
    out.name = None
    guarded = branch.outputs[0]
    guarded.name, guarded.type, guarded.shape = name, out.type, out.shape
    graph.insert_before(node, [*check, branch])
    for k, value in enumerate(graph.outputs):
        if value is out:
            graph.outputs[k] = guarded
    ir.convenience.replace_all_uses_with(out, guarded)
    graph.remove(node, safe=True)


def _unlike_torch(node: Any, read: Any) -> list[Any]:
    """Nodes whose last output says whether ``node`` may differ from torch on this
    call, from ``read`` (its input, or that input pooled per channel): its sum is
    NaN (a NaN, or both infinities), or for a padded max pooling, -inf."""
    import onnx_ir as ir

    total = ir.node("ReduceSum", [read], {"keepdims": 0})
    nan = ir.node("IsNaN", [total.outputs[0]])
    if not _pads(node):
        return [total, nan]
    # IsInf takes no float16 before opset 20: the sum is read as float32.
    wide = ir.node("Cast", [total.outputs[0]], {"to": ir.DataType.FLOAT})
    low = ir.node("IsInf", [wide.outputs[0]], {"detect_positive": 0})
    return [total, nan, wide, low, ir.node("Or", [nan.outputs[0], low.outputs[0]])]


def _pads(node: Any) -> bool:
    """Whether ``node`` is a max pooling whose windows may reach past the input.
    ORT pads with the lowest finite float, so a window whose own elements are all
    -inf came out as -3.4e38 where torch's is -inf."""
    if node.op_type != "MaxPool":
        return False
    pads, ceil, auto = (node.attributes.get(a) for a in ("pads", "ceil_mode", "auto_pad"))
    return (
        (pads is not None and any(pads.value))
        or (ceil is not None and bool(ceil.value))
        or (auto is not None and auto.value != "NOTSET")
    )


def _copy(node: Any) -> Any:
    import onnx_ir as ir

    return ir.node(node.op_type, list(node.inputs), dict(node.attributes), num_outputs=1)


def _branch(nodes: list[Any], like: Any, name: str) -> Any:
    """A subgraph of ``nodes`` whose last output, typed as ``like``, is its result."""
    import onnx_ir as ir

    result = nodes[-1].outputs[0]
    result.type, result.shape = like.type, like.shape
    return ir.Graph([], [result], nodes=nodes, name=name)


def _corrected(node: Any, y: Any) -> list[Any]:
    """Nodes computing torch's result from ``node``'s output ``y``, the last one's
    output being it."""
    import numpy as np
    import onnx_ir as ir

    x = node.inputs[0]
    dtype = x.dtype.numpy()
    zero = ir.node("Constant", [], {"value": ir.tensor(np.array(0, dtype=dtype))})
    isnan = ir.node("IsNaN", [x])
    if node.op_type == "Sign":
        return [zero, isnan, ir.node("Where", [isnan.outputs[0], zero.outputs[0], y])]
    mask = ir.node("Cast", [isnan.outputs[0]], {"to": x.dtype})
    made = [zero, isnan, mask]
    if node.op_type in _ARG_OPS:
        axis, keepdims = _int_attribute(node, "axis", 0), _int_attribute(node, "keepdims", 1)
        axes = ir.node("Constant", [], {"value": ir.tensor(np.array([axis], dtype=np.int64))})
        twin = ir.node("ReduceMax", [mask.outputs[0], axes.outputs[0]], {"keepdims": keepdims})
        first = ir.node("ArgMax", [mask.outputs[0]], {"axis": axis, "keepdims": keepdims})
        seen = ir.node("Greater", [twin.outputs[0], zero.outputs[0]])
        return [*made, axes, twin, first, seen, ir.node("Where", [seen.outputs[0], first.outputs[0], y])]
    if _pads(node):
        made += _minus_infinity_where_torch_gives_it(node, y, zero.outputs[0], dtype)
        y = made[-1].outputs[0]
    twin = ir.node(
        _DETECTORS[node.op_type], [mask.outputs[0], *node.inputs[1:]], dict(node.attributes), num_outputs=1
    )
    seen = ir.node("Greater", [twin.outputs[0], zero.outputs[0]])
    nan = ir.node("Constant", [], {"value": ir.tensor(np.array(np.nan, dtype=dtype))})
    return [*made, twin, seen, nan, ir.node("Where", [seen.outputs[0], nan.outputs[0], y])]


def _minus_infinity_where_torch_gives_it(node: Any, y: Any, zero: Any, dtype: Any) -> list[Any]:
    """Nodes making -inf of the padded max pooling ``node``'s output ``y`` in each
    window whose own elements are all -inf: its twin over ``x != -inf`` is 0
    (``zero``, a constant of ``dtype``) there."""
    import numpy as np
    import onnx_ir as ir

    x = node.inputs[0]
    low = ir.node("Constant", [], {"value": ir.tensor(np.array(-np.inf, dtype=dtype))})
    wide = ir.node("Cast", [x], {"to": ir.DataType.FLOAT})
    lowest = ir.node("IsInf", [wide.outputs[0]], {"detect_positive": 0})
    other = ir.node("Not", [lowest.outputs[0]])
    real = ir.node("Cast", [other.outputs[0]], {"to": x.dtype})
    twin = ir.node("MaxPool", [real.outputs[0]], dict(node.attributes), num_outputs=1)
    seen = ir.node("Greater", [twin.outputs[0], zero])
    made = [low, wide, lowest, other, real, twin, seen]
    return [*made, ir.node("Where", [seen.outputs[0], y, low.outputs[0]])]


def _int_attribute(node: Any, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else int(attribute.value)
