"""The onnxrt route's outputs in the layout the graph was traced with.

ONNX Runtime returns every output contiguous. Eager returns the traced strides
and inductor keeps them (``keep_output_stride``), and code after the model may
depend on them: ``out.permute(0, 2, 3, 1).view(n, -1)`` works on a channels_last
feature map and raises on a contiguous one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .base import CompiledFn


def in_traced_layout(run: CompiledFn, gm: torch.fx.GraphModule) -> CompiledFn:
    """``run``, with each output ORT returns contiguous copied into the strides the
    graph was traced with, where those differ (a channels_last feature map, a
    transposed result). Only outputs of static size whose traced strides are
    dense and non-overlapping are copied; a symbolic size stays contiguous."""
    layouts = _traced_layouts(gm)
    if not layouts:
        return run

    def restrided(*args: Any) -> tuple[torch.Tensor, ...]:
        outputs = list(run(*args))
        for k, (size, stride) in layouts:
            t = outputs[k]
            outputs[k] = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
        return tuple(outputs)

    return restrided


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
        if not value.is_contiguous() and _dense(size, stride):
            layouts.append((k, (size, stride)))
    return layouts


def _dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether the strides lay ``size`` elements out with no gap and no overlap."""
    expected = 1
    for n, step in sorted(((n, s) for n, s in zip(size, stride) if n != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= n
    return True


def output_values(gm: torch.fx.GraphModule) -> list[Any]:
    """The traced values (fake tensors, or constants) of ``gm``'s outputs."""
    (out,) = gm.graph.find_nodes(op="output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    return [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]
