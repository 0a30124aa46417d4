"""NaN and infinity as torch computes them, in a region's ONNX model.

ONNX Runtime's CPU kernels for MaxPool, ReduceMax/ReduceMin and ArgMax/ArgMin
pass over a NaN that shares a window or a row with a number (onnxruntime issue
10514: which one wins depends on its position), where torch returns NaN and,
for the arg ops, the NaN's index (torch orders NaN above every number).
``Sign(NaN)`` is NaN where torch's ``sign(nan)`` is 0. A model whose input or
activations held a NaN came back finite, and a caller's ``isnan`` check saw
nothing. The first-call check cannot see this: a first call rarely holds a NaN.

Each such op runs under an ONNX ``If`` on whether its input's sum is NaN: only
then (a NaN, or both infinities) does a branch compute torch's result from the
op's twin over ``isnan(x)``; otherwise the op runs as before. The sum is one
read of the input: a max pooling of 1x64x112x112 took 194 against 140 µs in
ORT alone, where computing the twin on every call took 525. The ``If`` is
built on the exported model, after the exporter's optimizer, which mishandled
values of unknown shape coming out of an ``If`` (``x + 0`` became a flatten).

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


def nan_as_in_torch(model: Any) -> None:
    """Every op of ``model`` (an ``onnx_ir`` model) that passes over NaN, guarded."""
    import onnx_ir as ir

    floats = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE}
    for node in list(model.graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in _GUARDED:
            continue
        x = node.inputs[0]
        if x is None or x.dtype not in floats or any(o.uses() for o in node.outputs[1:]):
            continue
        _guarded(model.graph, node)


def _guarded(graph: Any, node: Any) -> None:
    """``node`` replaced by ``If(isnan(sum(x)))``: torch's result, else ``node`` as it was."""
    import onnx_ir as ir

    x, out = node.inputs[0], node.outputs[0]
    total = ir.node("ReduceSum", [x], {"keepdims": 0})
    nan_seen = ir.node("IsNaN", [total.outputs[0]])
    plain = _copy(node)
    exact = [_copy(node)]
    exact += _corrected(node, exact[0].outputs[0])
    branch = ir.node(
        "If",
        [nan_seen.outputs[0]],
        {
            "then_branch": _branch(exact, out, "nan_as_torch"),
            "else_branch": _branch([plain], out, "as_exported"),
        },
        num_outputs=1,
    )
    name = out.name or f"nan_guarded_{id(node)}"
    # Values left unnamed are named at serialisation per graph, and a branch's
    # names then collide with the outer graph's (ORT refuses the model).
    for k, made in enumerate((total, nan_seen, plain, *exact)):
        for value in made.outputs:
            value.name = f"{name}__nan{k}"
    out.name = None
    guarded = branch.outputs[0]
    guarded.name, guarded.type, guarded.shape = name, out.type, out.shape
    graph.insert_before(node, [total, nan_seen, branch])
    for k, value in enumerate(graph.outputs):
        if value is out:
            graph.outputs[k] = guarded
    ir.convenience.replace_all_uses_with(out, guarded)
    graph.remove(node, safe=True)


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
    twin = ir.node(
        _DETECTORS[node.op_type], [mask.outputs[0], *node.inputs[1:]], dict(node.attributes), num_outputs=1
    )
    seen = ir.node("Greater", [twin.outputs[0], zero.outputs[0]])
    nan = ir.node("Constant", [], {"value": ir.tensor(np.array(np.nan, dtype=dtype))})
    return [*made, twin, seen, nan, ir.node("Where", [seen.outputs[0], nan.outputs[0], y])]


def _int_attribute(node: Any, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else int(attribute.value)
