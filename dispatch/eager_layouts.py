"""Rewrites that let torch's own kernels run a lowered aten graph op by op.

The eager route, the first-call checks of the other routes and the fallbacks
all run a region's aten graph with torch's kernels. Where a kernel asserts a
layout that its composite op used to establish, and the strides it meets at
run time are not the ones the graph was traced with, the graph fails where the
model ran: torch's ``aot_eager`` backend fails the same way (pytorch#124181,
fixed in torch's kernel after 2.13).

- ``native_group_norm`` on CPU asserts its input contiguous in the input's
  suggested memory format. ``F.group_norm`` makes it so before calling it; the
  lowered graph calls it directly. A channels_last feature map with a size-1
  dim (a batch of one) may reach it from a ``view`` whose size-1 stride eager
  computes otherwise than the traced graph (64 against 65536 for 1x64x32x32
  after diffusers' VAE attention), and the suggested format then reads as
  contiguous: the VAE raised on auto's first call. Its input is cloned into
  the traced layout there; ORT exports the clone as nothing, inductor fuses it.
- Batch norm on CPU returns its output contiguous for an input that is neither
  contiguous nor channels_last, where the traced graph keeps the input's
  strides (pytorch#192668): PatchTST normalizes a transposed (batch, channels,
  patches) tensor, transposes it back and views it, and that view raised on
  the contiguous output. Its output is put back in its traced order of strides
  (a permute, a contiguous clone, the inverse permute: one copy where torch
  runs it; ORT cancels the transposes, inductor fuses them).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten


def group_norm_inputs_in_traced_layout(gm: torch.fx.GraphModule) -> int:
    """Clone the input of each ``native_group_norm`` whose traced layout torch may
    not see again at run time (module docstring); returns how many were cloned."""
    cloned = 0
    for node in gm.graph.find_nodes(op="call_function", target=aten.native_group_norm.default):
        source = node.args[0]
        layout = _channels_last_with_a_size_one_dim(source)
        if layout is None or _is_clone_into(source, layout):
            continue
        with gm.graph.inserting_before(node):
            clone = gm.graph.call_function(aten.clone.default, (source,), {"memory_format": layout})
        value = source.meta["val"]
        with _mode_of(value):
            clone.meta = {**source.meta, "val": value.clone(memory_format=layout)}
        node.replace_input_with(source, clone)
        cloned += 1
    if cloned:
        gm.recompile()
    return cloned


def _channels_last_with_a_size_one_dim(node: object) -> torch.memory_format | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() not in (4, 5):
        return None
    if not any(type(n) is int and n == 1 for n in value.shape):
        return None
    layout = suggest_memory_format(value)
    return layout if layout != torch.contiguous_format else None


def _is_clone_into(node: torch.fx.Node, layout: torch.memory_format) -> bool:
    return node.target is aten.clone.default and node.kwargs.get("memory_format") == layout


# Batch norm's forms in lowered graphs; output 0 is the normalized tensor.
_BATCH_NORMS = frozenset(
    {
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten._native_batch_norm_legit_functional.default,
        aten.native_batch_norm.default,
    }
)


def batch_norm_outputs_in_traced_order(gm: torch.fx.GraphModule) -> int:
    """Put each CPU batch norm's output, traced in its non-contiguous input's
    order of strides, back in that order (module docstring); returns how many."""
    restored = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _BATCH_NORMS:
            continue
        order = _traced_order(node.args[0])
        normalized = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
        if order is None or len(normalized) != 1:
            continue
        (out,) = normalized
        if _restored(out):
            continue
        inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
        users = list(out.users)
        graph = gm.graph
        with graph.inserting_after(out):
            permuted = graph.call_function(aten.permute.default, (out, list(order)))
        with graph.inserting_after(permuted):
            dense = graph.call_function(
                aten.clone.default, (permuted,), {"memory_format": torch.contiguous_format}
            )
        with graph.inserting_after(dense):
            back = graph.call_function(aten.permute.default, (dense, list(inverse)))
        value = out.meta["val"]
        with _mode_of(value):
            permuted.meta = {**out.meta, "val": value.permute(order)}
            dense.meta = {**out.meta, "val": permuted.meta["val"].contiguous()}
            back.meta = {**out.meta, "val": dense.meta["val"].permute(inverse)}
        for user in users:
            user.replace_input_with(out, back)
        restored += 1
    if restored:
        gm.recompile()
    return restored


def _restored(out: torch.fx.Node) -> bool:
    """Whether ``out`` is already put back in its order (a second pass adds nothing)."""
    users = list(out.users)
    if len(users) != 1 or users[0].target is not aten.permute.default:
        return False
    return any(u.target is aten.clone.default for u in users[0].users)


def _traced_order(node: object) -> tuple[int, ...] | None:
    """The dims of a CPU tensor ``node`` from outermost to innermost stride, where
    they are not in their contiguous order (nor channels_last's, which torch keeps);
    None otherwise."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.dim() < 2:
        return None
    stride = value.stride()
    if any(type(s) is not int for s in stride):
        return None
    if value.is_contiguous() or suggest_memory_format(value) != torch.contiguous_format:
        return None
    order = outer_to_inner(stride)
    return None if order == tuple(range(value.dim())) else order


def outer_to_inner(stride: Sequence[int]) -> tuple[int, ...]:
    """The dims of a tensor with ``stride`` from outermost to innermost (ties in dim order)."""
    return tuple(sorted(range(len(stride)), key=lambda d: (-stride[d], d)))


def _mode_of(value: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """The fake mode ``value`` was traced under, to make values beside it."""
    return getattr(value, "fake_mode", None) or contextlib.nullcontext()
