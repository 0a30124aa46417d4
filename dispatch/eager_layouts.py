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
"""

from __future__ import annotations

import contextlib

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
        with getattr(value, "fake_mode", None) or contextlib.nullcontext():
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
