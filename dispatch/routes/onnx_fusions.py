"""Rewrites of an aten region, before its ONNX export, that let ONNX Runtime's
graph optimizer find the patterns it fuses.

Each computes what torch computes, within rounding, and exists because
torchlib's translation of an op hides a pattern that ORT's optimizer would
otherwise fuse (``onnx_rewrites.py`` holds the rewrites for translations that
are missing, refused or not torch's).
"""

from __future__ import annotations

import torch
import torch.fx

from ..inspect import META_VAL, mean_square_base

aten = torch.ops.aten


def fusible_for_onnx_runtime(graph: torch.fx.Graph) -> None:
    """Every rewrite below, in place."""
    _rms_norms_as_divisions(graph)


def _rms_norms_as_divisions(graph: torch.fx.Graph) -> None:
    """``x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps)`` becomes ``x / sqrt(...)``.

    torchlib translates ``rsqrt`` as ``Reciprocal(Sqrt(.))``, and ORT's
    ``SimplifiedLayerNormFusion`` looks for ``Div(x, Sqrt(.))``: the RMS norms of
    LLaMA, Mistral, Gemma and T5 ran as six ops each. Fused, a bare ORT session
    of the zoo's LLaMA, T5 and a Gemma ran in 0.87-0.91 of its time (AVX-512,
    two threads, ten alternating rounds; ``benchmarks/README.md``)."""
    for rsqrt in graph.find_nodes(op="call_function", target=aten.rsqrt.default):
        x = mean_square_base(rsqrt.args[0])
        value = None if x is None else x.meta.get(META_VAL)
        if x is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        products = [u for u in rsqrt.users if u.target is aten.mul.Tensor and _operands(u) == {x, rsqrt}]
        if not products:
            continue
        with graph.inserting_after(rsqrt):
            root = graph.call_function(aten.sqrt.default, (rsqrt.args[0],))
        root.meta[META_VAL] = rsqrt.meta.get(META_VAL)
        for product in products:
            with graph.inserting_after(product):
                quotient = graph.call_function(aten.div.Tensor, (x, root))
            quotient.meta[META_VAL] = product.meta.get(META_VAL)
            product.replace_all_uses_with(quotient)
            graph.erase_node(product)
        if not rsqrt.users:
            graph.erase_node(rsqrt)


def _operands(node: torch.fx.Node) -> set[object]:
    return set(node.args) if len(node.args) == 2 and not node.kwargs else set()
