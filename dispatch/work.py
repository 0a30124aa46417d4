"""How much arithmetic a graph does, estimated from its nodes' fake values.

A runtime's fixed costs (waking a thread pool, a call) pay off only above some
amount of work; routes read this estimate to size what they set up for a
region. Matmuls and convolutions count their multiply-adds (2 flops each);
every other op counts one flop per output element. An estimate, not a model of
the hardware: it ranks regions by work, which is all its callers ask. The
bytes that ops moving data (permutes, copies, gathers) write are counted
beside the matmuls' work: ORT runs each of them on its own, inductor mostly
folds them into their readers.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence

import torch
import torch.fx

from .inspect import META_VAL, compute_nodes, is_computing_op, tensor_value

aten = torch.ops.aten

_MATMULS = {
    aten.mm.default: (0, 1),  # positions of the two factors
    aten.addmm.default: (1, 2),
    aten.bmm.default: (0, 1),
    aten.baddbmm.default: (1, 2),
    # torch-level ops that ONNX-bound graphs keep (torch.export, onnx_friendly decompositions)
    aten.linear.default: (0, 1),
    aten.matmul.default: (0, 1),
}
_CONVOLUTIONS = {
    aten.convolution.default,
    aten._convolution.default,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
}
# Ops that only move data. ONNX Runtime runs each as a kernel of its own (a
# Transpose for every permute, a Gather for every index), one element at a
# time where the layout is not a plain copy; inductor folds most of them into
# the kernel that reads their result.
_DATA_MOVES = {
    aten.permute.default,
    aten.transpose.int,
    aten.clone.default,
    aten.cat.default,
    aten.index_select.default,
    aten.gather.default,
    aten.index.Tensor,
    aten.embedding.default,
    aten.im2col.default,
}

# Ops that inductor on CPU hands to a library kernel of its own (as it does the
# matmuls and convolutions) instead of writing them as loops it fuses with
# their neighbours. Every other computing op it lowers into such loops:
# pointwise ops, reductions, fills, ``arange``, gathers, embeddings, ``cat``,
# pooling, and the norms and losses it decomposes.
_LIBRARY_KERNELS = {
    aten.sort.default,
    aten.sort.stable,
    aten.topk.default,
    aten.kthvalue.default,
    aten.median.dim,
    aten.mode.default,
    aten.cumsum.default,
    aten.cumprod.default,
    aten.logcumsumexp.default,
    aten.nonzero.default,
    aten.searchsorted.Tensor,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.randperm.default,
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_attention_math.default,
    aten._fft_r2c.default,
    aten._fft_c2r.default,
    aten._fft_c2c.default,
}
# Ops that re-describe or copy data, which inductor folds into the loops that read them.
_FOLDED = {aten.clone.default, aten._unsafe_view.default, aten._to_copy.default, aten.alias.default}


def estimated_flops(gm: torch.fx.GraphModule) -> int | None:
    """The graph's floating-point operations per call; None where a size is
    symbolic (reading it would add a guard to Dynamo's shape environment)."""
    return _summed_flops(gm, None)


def data_moved(gm: torch.fx.GraphModule) -> tuple[int, int] | None:
    """(bytes written by the graph's data-moving ops, FLOPs of its matmuls and
    convolutions) per call; None where a size is symbolic."""
    moved = matmul = 0
    for node in compute_nodes(gm):
        out = node.meta.get(META_VAL)
        if node.target in _MATMULS or node.target in _CONVOLUTIONS:
            flops = _node_flops(node)
            if flops is None:
                return None
            matmul += flops
        elif node.target in _DATA_MOVES and isinstance(out, torch.Tensor):
            size = _product(out.element_size(), out.shape)
            if size is None:
                return None
            moved += size
    return moved, matmul


def loop_ops(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """(the graph's ops that inductor writes as loops it fuses; its ops that run
    a library kernel each: matmuls, convolutions, sorts, scans, attention).
    Copies and reshapes count as neither: inductor folds them into their readers."""
    loops = kernels = 0
    for node in gm.graph.nodes:
        if not is_computing_op(node) or node.target in _FOLDED:
            continue
        target = node.target
        if target in _MATMULS or target in _CONVOLUTIONS or target in _LIBRARY_KERNELS:
            kernels += 1
        else:
            loops += 1
    return loops, kernels


def convolution_flops(gm: torch.fx.GraphModule) -> int | None:
    """The FLOPs of the graph's convolutions per call; None where a size is symbolic."""
    return _summed_flops(gm, _CONVOLUTIONS)


def _summed_flops(gm: torch.fx.GraphModule, targets: Container[object] | None) -> int | None:
    """The FLOPs of the graph's compute nodes whose target is in ``targets`` (all
    of them for None); None where a size is symbolic."""
    total = 0
    for node in compute_nodes(gm):
        if targets is None or node.target in targets:
            flops = _node_flops(node)
            if flops is None:
                return None
            total += flops
    return total


def _node_flops(node: torch.fx.Node) -> int | None:
    out = node.meta.get(META_VAL)
    if not isinstance(out, torch.Tensor):
        return 0  # getitem of a tuple, a size, a scalar: its producer counts
    if node.target in _MATMULS:
        a, b = (tensor_value(node.args[i]) for i in _MATMULS[node.target])
        if a is None or b is None:
            return None
        return _product(2, out.shape, a.shape[-1:])
    if node.target in _CONVOLUTIONS:
        weight = tensor_value(node.args[1])
        if weight is None:
            return None
        return _product(2, out.shape, weight.shape[1:])  # in_channels / groups x kernel
    return _product(1, out.shape)


def _product(factor: int, *shapes: Sequence[object]) -> int | None:
    sizes = [s for shape in shapes for s in shape]
    if not all(type(s) is int for s in sizes):
        return None
    return factor * math.prod(sizes)  # type: ignore[arg-type]
