"""What an aten FX graph holds: per-node op, devices, dtypes and symbolic shapes.

Everything is read from ``node.meta["val"]`` (the fake values that AOTAutograd
and ``make_fx`` attach), so it works on graphs traced from real or fake
``cuda``/``mps`` tensors alike, without touching the hardware.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeGuard

import torch
import torch.fx
from torch._prims_common import is_contiguous_or_false

from .update_step import is_update_step

META_VAL = "val"  # torch's own key: the fake value a node produces
META_EXAMPLE_VALUE = "example_value"  # the same, on the graphs Dynamo hands a backend
META_STATIC = "dispatch_static"  # ours: a placeholder fed by a parameter or buffer
META_PATTERN = "dispatch_pattern"  # ours: the kernels/ pattern instance a node belongs to
META_PATTERN_REFUSED = "dispatch_pattern_refused"  # ours: why a kernels/ pattern at a node was refused
# ours, on a region's GraphModule: other routes' regions run in the same graph
META_BESIDE_OTHER_ROUTES = "dispatch_beside_other_routes"

GRAPH_INFERENCE = "inference"
GRAPH_FORWARD = "forward"
GRAPH_BACKWARD = "backward"
NEEDS_GRAD = (GRAPH_FORWARD, GRAPH_BACKWARD)


def op_name(node: torch.fx.Node) -> str:
    """``"aten.addmm.default"`` for an OpOverload, the qualified name otherwise."""
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return str(target)
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__qualname__", None) or str(target)


def flat_values(node: torch.fx.Node, key: str = META_VAL) -> Iterator[object]:
    """The values a node holds under ``key``, a tuple's items one by one."""
    val = node.meta.get(key)
    if isinstance(val, (list, tuple)):
        yield from val
    else:
        yield val


def tensor_values(node: torch.fx.Node) -> list[torch.Tensor]:
    return [v for v in flat_values(node) if isinstance(v, torch.Tensor)]


def holds_bfloat16(gm: torch.fx.GraphModule) -> bool:
    """Whether some value of Dynamo's graph ``gm`` is a bfloat16 tensor: a bfloat16
    model, or autocast to bfloat16 (``GraphFacts.bfloat16`` says it of an aten graph)."""
    return any(
        isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16
        for node in gm.graph.nodes
        for v in flat_values(node, META_EXAMPLE_VALUE)
    )


def tensor_value(arg: object) -> torch.Tensor | None:
    """The (fake) tensor an op argument holds; None for a constant or a non-tensor node."""
    value = arg.meta.get(META_VAL) if isinstance(arg, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def is_symbolic(node: torch.fx.Node) -> bool:
    """True where a node's value (or its shape) involves a symbolic size."""
    for v in flat_values(node):
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride())):
            return True
    return False


def has_unbacked_size(node: torch.fx.Node) -> bool:
    """True where a node's value depends on data (an unbacked symbol such as ``u0``)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(v) for v in flat_values(node) if v is not None)


def is_size_arithmetic(node: torch.fx.Node) -> bool:
    """True for a node that computes a symbolic size (``sym_size``, ``s0 * 5``), not tensor data."""
    values = list(flat_values(node))
    return bool(values) and all(isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)) for v in values)


def dynamic_dims(gm: torch.fx.GraphModule, names: dict[int, str] | None = None) -> tuple[str, ...]:
    """``"x dim 0 = s77"`` for every symbolic dimension of the graph's tensor inputs.

    ``names`` gives user-facing names (Dynamo's ``L_x_``) to placeholder positions."""
    dims = []
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get(META_VAL)
        if not isinstance(value, torch.Tensor):
            continue
        name = (names or {}).get(i, node.name)
        dims += [f"{name} dim {d} = {s}" for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt)]
    return tuple(dims)


def node_device_indices(node: torch.fx.Node) -> frozenset[torch.device]:
    """Devices (with index) a compute node touches: its inputs' and its outputs'."""
    devices = {t.device for t in tensor_values(node)}
    for arg in node.all_input_nodes:
        devices.update(t.device for t in tensor_values(arg))
    return frozenset(devices)


def marked_static_positions(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of ``gm``'s inputs marked ``META_STATIC`` (fed by a parameter or buffer)."""
    return [i for i, p in enumerate(gm.graph.find_nodes(op="placeholder")) if p.meta.get(META_STATIC)]


def device_usable(device: torch.device) -> bool:
    """Whether this process can put tensors on ``device`` (its index included)."""
    if device.type in ("cpu", "meta"):
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    if device.type == "mps":
        return torch.backends.mps.is_available()
    backend = getattr(torch, device.type, None)
    return bool(getattr(backend, "is_available", lambda: False)())


def first_device(values: Iterable[object]) -> torch.device:
    """The device of the first tensor among ``values`` (cpu if there is none)."""
    return next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))


def needs_gradients(example_inputs: Iterable[object]) -> bool:
    """Whether AOTAutograd will trace a training graph for these inputs: grad mode
    is on and one of them requires grad."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in example_inputs)


def static_input_positions(dynamo_gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of a Dynamo graph's inputs that are parameters or buffers.

    Dynamo marks them in ``meta["tensor_dict"]`` (the same mark AOTAutograd reads
    for ``static_input_indices``)."""
    placeholders = dynamo_gm.graph.find_nodes(op="placeholder")
    return frozenset(
        i
        for i, node in enumerate(placeholders)
        if node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
    )


def input_names(dynamo_gm: torch.fx.GraphModule) -> dict[int, str]:
    """The user's names of a Dynamo graph's inputs by position: ``L_x_`` -> ``x``."""
    placeholders = dynamo_gm.graph.find_nodes(op="placeholder")
    names = (re.sub(r"^[lL]_(.+)_$", r"\1", str(p.target)) for p in placeholders)
    return {i: re.sub(r"^(args|kwargs)_(\w+)$", r"\1[\2]", name) for i, name in enumerate(names)}


def mark_static_inputs(
    aten_gm: torch.fx.GraphModule,
    positions: frozenset[int],
    lifted: int,
    mutated: frozenset[int] = frozenset(),
) -> None:
    """Flag the aten graph's placeholders fed by parameters or buffers.

    AOTAutograd puts ``lifted`` parameters of the Dynamo module first, then the
    Dynamo graph's inputs in order. A buffer the graph itself updates in place
    (``mutated``: a counter, running statistics) changes on every call, so it is
    not static."""
    for i, node in enumerate(aten_gm.graph.find_nodes(op="placeholder")):
        if (i < lifted or (i - lifted) in positions) and i not in mutated:
            node.meta[META_STATIC] = True


def compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def is_view_op(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and bool(
        target._schema.returns and target._schema.returns[0].alias_info
    )


def is_computing_op(node: torch.fx.Node) -> bool:
    """An op that computes: getitem and views (which only re-describe memory) do not."""
    return node.op == "call_function" and node.target is not operator.getitem and not is_view_op(node)


def mean_square_base(node: object) -> torch.fx.Node | None:
    """``x`` where ``node`` is ``mean(pow(x, 2), [-1], keepdim=True) + eps`` with a float
    ``eps``: the root of an RMS norm as AOTAutograd lowers it (LLaMA, T5, Gemma)."""
    aten = torch.ops.aten
    if (
        not _calls(node, aten.add.Scalar, aten.add.Tensor)
        or node.kwargs
        or not isinstance(node.args[1], float)
    ):
        return None
    mean = node.args[0]
    if not _calls(mean, aten.mean.dim) or mean.kwargs.get("dtype") is not None:
        return None
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    square = mean.args[0]
    if not keepdim or not _calls(square, aten.pow.Tensor_Scalar) or square.args[1] != 2:
        return None
    if not is_last_dim(square, mean.args[1]):
        return None
    x = square.args[0]
    return x if isinstance(x, torch.fx.Node) else None


def is_last_dim(node: object, dim: object) -> bool:
    """Whether ``dim`` (an int, or a list of one) names the last dimension of ``node``'s value."""
    value = node.meta.get(META_VAL) if isinstance(node, torch.fx.Node) else None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return isinstance(value, torch.Tensor) and len(dims) == 1 and dims[0] in (-1, value.dim() - 1)


def _calls(node: object, *targets: object) -> TypeGuard[torch.fx.Node]:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def view_to_caller_reason(node: torch.fx.Node) -> str | None:
    """Why ``node``, a view, must reach the caller as a view, not a copy; None where a
    copy serves as well. A view of a graph input or constant writes theirs when
    written, and a view of a value another output also shows writes that output.
    A view of an intermediate nothing else returns has no base anyone holds, and
    where it is laid out densely a copy is what torch would have made of it: a
    route that copies its outputs (ONNX Runtime) then runs it in its region, where
    alone after that region it cost an eager region's call (27 µs a call after
    MobileNetV2's ORT region, for a ``flatten`` of the pooled features)."""
    output = next((user for user in node.users if user.op == "output"), None)
    if output is None:
        return None
    root = view_root(node)
    if root.op in ("placeholder", "get_attr"):
        return "returns to the caller a view of an input, whose writes reach the input"
    if any(view_root(other) is root for other in output.all_input_nodes if other is not node):
        return "returns to the caller a view of a value another output shows"
    value = node.meta.get(META_VAL)
    if not isinstance(value, torch.Tensor) or not is_contiguous_or_false(value):
        return "returns to the caller a strided view, which torch takes without a copy"
    return None


def view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The value ``node`` views, through any chain of views (and items of a view op's
    list of views, as ``split`` returns); ``node`` itself where it is no view."""
    while True:
        source = node.args[0] if node.args else None
        if not isinstance(source, torch.fx.Node):
            return node
        if not is_view_op(node) and not (node.target is operator.getitem and is_view_op(source)):
            return node
        node = source


@dataclass(frozen=True)
class GraphFacts:
    """A summary of one aten graph, as ``explain`` reports it."""

    kind: str
    devices: frozenset[str]
    dtypes: frozenset[str]
    ops: tuple[str, ...]
    node_count: int
    dynamic: bool
    dynamic_dims: tuple[str, ...] = ()
    #: it writes its inputs in place and multiplies no matrices (``update_step.py``)
    update_step: bool = False

    @property
    def needs_grad(self) -> bool:
        return self.kind in NEEDS_GRAD

    @property
    def bfloat16(self) -> bool:
        """Whether the graph computes in bfloat16 (some value it holds is bfloat16)."""
        return "bfloat16" in self.dtypes


def graph_facts(gm: torch.fx.GraphModule, kind: str, input_names: dict[int, str] | None = None) -> GraphFacts:
    nodes = compute_nodes(gm)
    devices: set[str] = set()
    dtypes: set[str] = set()
    for n in gm.graph.nodes:
        for t in tensor_values(n):
            devices.add(t.device.type)
            dtypes.add(str(t.dtype).removeprefix("torch."))
    ops = tuple(dict.fromkeys(op_name(n) for n in nodes if n.target is not operator.getitem))
    dynamic = any(is_symbolic(n) for n in gm.graph.nodes if n.op == "placeholder")
    dims = dynamic_dims(gm, input_names)
    update_step = kind == GRAPH_INFERENCE and is_update_step(gm)
    return GraphFacts(
        kind, frozenset(devices), frozenset(dtypes), ops, len(nodes), dynamic, dims, update_step
    )
