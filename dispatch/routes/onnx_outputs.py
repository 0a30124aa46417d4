"""The onnxrt route's outputs: checked against torch on the first call, and in the
layout the graph was traced with.

A translation that computes something else (torchlib's avg_pool drops
``divisor_override``; ORT's optimizer removes Dropout; torchlib returns a
float16 sum as float32) gives wrong results silently. So a region's first call
is also run by torch, on copies of its inputs, and a region whose outputs have
another dtype or shape than torch's, or floating values further from torch's
than a precision difference explains, fails to compile: it falls back, with
the error in the warning and in ``explain``. The bar is loose on purpose (1%
of the output's scale in float32, 5% in half precision): ONNX Runtime sums in
other orders than torch, and a region must not leave it for that.

ONNX Runtime returns every output contiguous. Eager returns the traced strides
and inductor keeps them (``keep_output_stride``), and code after the model may
depend on them: ``out.permute(0, 2, 3, 1).view(n, -1)`` works on a channels_last
feature map and raises on a contiguous one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..eager_layouts import outer_to_inner
from ..errors import DispatchError
from .base import CompiledFn
from .onnx_ops import fills_storage


def in_traced_layout(run: CompiledFn, gm: torch.fx.GraphModule) -> CompiledFn:
    """``run``, with each output in the type and layout the graph was traced with
    (``traced_form``)."""
    form = traced_form(gm)
    if form is None:
        return run

    def in_traced_form(*args: Any) -> tuple[Any, ...]:
        return form(run(*args))

    return in_traced_form


def traced_form(gm: torch.fx.GraphModule) -> Callable[[Sequence[Any]], tuple[Any, ...]] | None:
    """What puts ORT's outputs of ``gm`` in the type and layout the graph was traced
    with; None where they are in it already.

    A size the graph returns (a ``SymInt`` such as ``min(h, w)`` that the model
    stores on itself or returns) comes back from ORT as a 0-dim tensor and is
    handed on as the Python number it was traced as: returned as a tensor, it
    became a tensor attribute of the model (Swin's ``window_size``) and every
    later graph that read it failed to compile. Each output ORT returns
    contiguous is copied into the strides the graph was traced with, where those
    differ (a channels_last feature map, a transposed result), where those are
    static, dense and non-overlapping. An output traced with gaps (``q`` of a
    fused ``qkv`` split by ``permute`` and ``unbind``), or of symbolic size, is
    copied into a dense tensor with its traced order of strides instead: ops
    after it follow that order (``flex_attention`` lays its output out as its
    query), and a ``view`` of it traced as valid raised on the contiguous one.
    Copying the gaps too would cost a slice of a large tensor that tensor's size."""
    layouts = _traced_layouts(gm)
    orders = _traced_orders(gm, restored={k for k, _ in layouts})
    numbers = _number_outputs(gm)
    if not layouts and not orders and not numbers:
        return None

    def form(returned: Sequence[Any]) -> tuple[Any, ...]:
        outputs = list(returned)
        for k, (size, stride) in layouts:
            t = outputs[k]
            outputs[k] = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
        for k, order in orders:
            t = outputs[k]
            outputs[k] = torch.empty_permuted(t.shape, order, dtype=t.dtype, device=t.device).copy_(t)
        for k, kind in numbers:
            outputs[k] = kind(outputs[k].item())
        return tuple(outputs)

    return form


_NUMBER_KINDS: tuple[tuple[type, type], ...] = (
    (torch.SymBool, bool),
    (bool, bool),
    (torch.SymInt, int),
    (int, int),
    (torch.SymFloat, float),
    (float, float),
)


def _number_outputs(gm: torch.fx.GraphModule) -> list[tuple[int, type]]:
    """(output position, Python type) of the outputs traced as numbers, not tensors."""
    numbers = []
    for k, value in enumerate(output_values(gm)):
        kind = next((python for traced, python in _NUMBER_KINDS if isinstance(value, traced)), None)
        if kind is not None:
            numbers.append((k, kind))
    return numbers


def _traced_layouts(gm: torch.fx.GraphModule) -> list[tuple[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """(output position, (size, strides)) of the outputs whose traced strides are
    not the contiguous ones, of static size, dense and non-overlapping."""
    layouts = []
    for k, value in enumerate(output_values(gm)):
        if not isinstance(value, torch.Tensor):
            continue
        size, stride = tuple(value.shape), tuple(value.stride())
        if not all(type(n) is int for n in size + stride) or value.numel() < 2:
            continue
        if not value.is_contiguous() and fills_storage(size, stride):
            layouts.append((k, (size, stride)))
    return layouts


def _traced_orders(gm: torch.fx.GraphModule, restored: set[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(output position, dims from outermost to innermost) of the non-overlapping
    outputs whose traced strides are not ``restored`` exactly (``_traced_layouts``)
    and whose order is not the contiguous one. Sizes and strides may be symbolic:
    their order is read from the values they were traced with."""
    orders = []
    for k, value in enumerate(output_values(gm)):
        if k in restored or not isinstance(value, torch.Tensor) or value.dim() < 2:
            continue
        size, stride = _hints(value.shape), _hints(value.stride())
        if size is None or stride is None or not _non_overlapping(size, stride):
            continue
        order = outer_to_inner(stride)
        # A size-1 dim's stride says nothing of the layout: contiguous is that order where
        # the other dims come in their own order.
        if [d for d in order if size[d] != 1] != [d for d in range(len(size)) if size[d] != 1]:
            orders.append((k, order))
    return orders


def _hints(values: Sequence[Any]) -> tuple[int, ...] | None:
    """The integers ``values`` were traced with; None where one has no hint."""
    hinted = []
    for v in values:
        if isinstance(v, torch.SymInt):
            v = v.node.hint
        if type(v) is not int:
            return None
        hinted.append(v)
    return tuple(hinted)


def _non_overlapping(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether no two elements of ``size`` laid out by ``stride`` share memory."""
    extent = 1
    for n, step in sorted(((n, s) for n, s in zip(size, stride) if n != 1), key=lambda p: p[1]):
        if step < extent:
            return False
        extent = step * n
    return True


def output_values(gm: torch.fx.GraphModule) -> list[Any]:
    """The traced values (fake tensors, or constants) of ``gm``'s outputs."""
    (out,) = gm.graph.find_nodes(op="output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    return [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]


def checked_against_torch(
    run: CompiledFn, gm: torch.fx.GraphModule, args: Sequence[Any], weights: Sequence[int]
) -> CompiledFn:
    """``run``, once its outputs on copies of ``args`` were found to be torch's (``gm``
    run eagerly); raises ``DispatchError`` naming the output where they are not,
    or where its dtype or shape is not torch's.
    The ``weights`` positions (never written by the region) are not copied: a large
    model's weights would double its memory. The values of integer and boolean
    outputs are not compared: ties in a sort or top-k may be broken either way."""
    unchanged = set(weights)

    def copies() -> list[Any]:
        return [
            a.clone() if isinstance(a, torch.Tensor) and k not in unchanged else a for k, a in enumerate(args)
        ]

    expected = gm(*copies())
    got = run(*copies())
    expected = expected if isinstance(expected, (list, tuple)) else (expected,)
    for k, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, (bool, int, float)) and (type(g) is not type(e) or g != e):
            raise DispatchError(
                f"onnxrt: output {k} of the region is {g!r} on its first call, torch's is the "
                f"{type(e).__name__} {e!r}: the ONNX translation returns something else"
            )
        if not isinstance(e, torch.Tensor):
            continue
        if g.dtype != e.dtype or g.shape != e.shape:
            raise DispatchError(
                f"onnxrt: output {k} of the region is {g.dtype} of shape {tuple(g.shape)} on its first "
                f"call, torch's is {e.dtype} of shape {tuple(e.shape)}: the ONNX translation returns "
                "something else"
            )
        if not e.is_floating_point() or e.numel() == 0:
            continue
        bar = _RELATIVE_BAR.get(e.dtype, 1e-2)
        e, g = e.detach().float(), g.detach().float()
        scale = max(1.0, float(e.abs().nan_to_num(posinf=0, neginf=0).max()))
        try:
            torch.testing.assert_close(g, e, rtol=0, atol=bar * scale, equal_nan=True, check_device=False)
        except AssertionError as error:
            worst = next((line.strip() for line in str(error).splitlines() if "absolute" in line), "")
            raise DispatchError(
                f"onnxrt: output {k} of the region differs from torch's on its first call "
                f"(values up to {scale:.2g}; {worst}): the ONNX translation computes something else"
            ) from None
    return run


_RELATIVE_BAR = {torch.float16: 5e-2, torch.bfloat16: 5e-2}
