"""What every ``kernels/`` pattern match must satisfy before the triton route claims it.

Each check reads the fake values in ``node.meta["val"]`` and returns the reason
a match is refused (or None), so the refusal happens at plan time and
``explain`` shows it; a kernel is never handed a case it does not handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_VAL, is_symbolic, tensor_values

FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})


def value(node: Any) -> Any:
    return node.meta.get(META_VAL) if isinstance(node, torch.fx.Node) else None


def dtype_of(node: Any) -> torch.dtype | None:
    val = value(node)
    return val.dtype if isinstance(val, torch.Tensor) else None


def shape_of(node: Any) -> tuple[int, ...] | None:
    val = value(node)
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def common_checks(
    nodes: Sequence[torch.fx.Node],
    output: torch.fx.Node,
    inputs: Sequence[torch.fx.Node],
    order: dict[torch.fx.Node, int],
) -> str | None:
    """Why a match of ``nodes`` (producing ``output``, reading ``inputs``) cannot
    become one kernel call, or None."""
    everything = [*nodes, *inputs]
    for node in everything:
        if META_VAL not in node.meta:
            return f"{node.name} has no traced value to check"
        if is_symbolic(node):
            return f"dynamic shape at {node.name}: kernels/ patterns are claimed for static shapes"
    devices = {t.device for n in everything for t in tensor_values(n)}
    if len(devices) > 1:
        return f"spans devices {', '.join(sorted(map(str, devices)))}: a kernel runs on one"
    empty = next((n for n in everything if any(t.numel() == 0 for t in tensor_values(n))), None)
    if empty is not None:
        return f"{empty.name} is an empty tensor"
    inside = set(nodes)
    for node in nodes:
        if node is not output and not set(node.users) <= inside:
            used_by = sorted(u.name for u in node.users if u not in inside)
            return f"intermediate {node.name} is also used by {', '.join(used_by)}"
    late = [n.name for n in inputs if order.get(n, -1) >= order.get(output, -1)]
    if late:
        return f"input {', '.join(late)} comes after {output.name}: the rewritten graph would be out of order"
    strided = next((t for t in tensor_values(output) if not t.is_contiguous()), None)
    if strided is not None:
        return (
            f"{output.name} has strides {tuple(strided.stride())} in the graph; the kernel writes "
            "contiguous rows"
        )
    return None
