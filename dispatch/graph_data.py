"""An aten graph as data: JSON node records in, an FX graph out, nothing executed.

Each node is written as its name, kind, operator name and arguments; a graph is
read back by looking each operator up by name in ``torch.ops`` (or in a fixed
table of Python operators) and building the nodes with
``torch.fx.Graph.create_node``. Nothing is evaluated, exec'd or unpickled: the
only code that runs is FX's own generation of ``forward`` from the graph, and
every name that reaches it is checked to be a plain identifier. The persistent
cache (``aten_cache.py``) and saved programs (``archive.py``) both use it.

Each node's ``meta["val"]`` (what planning and the kernels' pattern matcher
read) is stored as its tensors' metadata and made again as fake tensors. A
small tensor constant the graph reads (``get_attr``: what AOTAutograd makes of
``torch.tensor(...)`` in a model's code, such as the empty tensor or the scalar
that decoders' mask code creates) is stored by value; a larger one, or any
other attribute, cannot be written as data.
"""

from __future__ import annotations

import keyword
import operator
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.fx

from .inspect import META_VAL


class GraphSource(NamedTuple):
    """A graph as data: never code."""

    nodes: list[dict[str, Any]]  # each node's name, kind, target and arguments (``node_record``)
    values: list[Any]  # each node's ``meta["val"]`` as ``describe`` writes it (None: not kept)
    constants: dict[str, Any] = {}  # each ``get_attr`` target by value (``constant_record``)


def graph_source(gm: torch.fx.GraphModule, *, modules: bool = False, all_values: bool = True) -> GraphSource:
    """``gm`` as data. ``modules``: allow ``call_module`` nodes (a stitched graph's
    regions). ``all_values``: every node's value must be describable (else a
    symbolic value is kept as None). Raises ``ValueError`` naming the node that
    cannot be written as data."""
    kinds = _NODE_KINDS + (("call_module",) if modules else ())
    nodes = [node_record(node, kinds) for node in gm.graph.nodes]
    constants = {
        str(node.target): constant_record(node, getattr(gm, str(node.target), None))
        for node in gm.graph.find_nodes(op="get_attr")
    }
    values = []
    for node in gm.graph.nodes:
        try:
            values.append(describe(node.meta.get(META_VAL)))
        except ValueError:
            if all_values:
                raise
            values.append(None)
    return GraphSource(nodes, values, constants)


# The most elements a constant may have to be stored by value: decoders' mask code
# makes empty and 0-d tensors; anything near this size is a weight, not a literal.
CONSTANT_LIMIT = 64


def constant_record(node: torch.fx.Node, value: Any) -> dict[str, Any]:
    """A ``get_attr`` node's tensor as JSON: dtype, shape, device and its values.

    ``ValueError`` where it is not a small, dense, real-valued plain tensor."""
    if not _plain_name(node.target):
        raise ValueError(f"node {node.name} reads {node.target!r}, not a plain name")
    if type(value) is not torch.Tensor or value.layout != torch.strided or not value.is_contiguous():
        raise ValueError(f"node {node.name} reads {type(value).__name__} {node.target}, not a dense tensor")
    if value.numel() > CONSTANT_LIMIT or value.is_complex() or value.is_quantized:
        raise ValueError(f"node {node.name} reads a constant of {value.numel()} {value.dtype} elements")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # planning runs inside AOTAutograd's fake mode
        data = value.detach().to("cpu").flatten().tolist()
    return {
        "dtype": str(value.dtype).removeprefix("torch."),
        "shape": list(value.shape),
        "device": str(value.device),
        # float.hex: exact, and NaN and infinity stay JSON
        "data": [x.hex() if isinstance(x, float) else x for x in data],
    }


def _constant(record: Any) -> torch.Tensor:
    """The tensor that ``constant_record`` wrote."""
    if not isinstance(record, dict) or not isinstance(record.get("data"), list):
        raise ValueError(f"malformed constant {record!r:.80}")
    dtype = getattr(torch, str(record["dtype"]), None)
    shape = record.get("shape")
    if not isinstance(dtype, torch.dtype) or len(record["data"]) > CONSTANT_LIMIT:
        raise ValueError(f"malformed constant {record!r:.80}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"malformed constant {record!r:.80}")
    data = [float.fromhex(x) if isinstance(x, str) else x for x in record["data"]]
    if not all(type(x) in (bool, int, float) for x in data):
        raise ValueError(f"malformed constant {record!r:.80}")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        flat = torch.tensor(data, dtype=dtype)
        return flat.reshape(shape).to(torch.device(record["device"]))


def read_graph(
    source: GraphSource, modules: Mapping[str, torch.nn.Module] | None = None
) -> torch.fx.GraphModule:
    """The graph that ``source`` describes; ``call_module`` targets are taken from
    ``modules`` (by name, checked), never imported. Raises ``ValueError`` (or
    ``KeyError``/``AttributeError`` for an unknown name) on a malformed record."""
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    kinds = _NODE_KINDS + (("call_module",) if modules is not None else ())
    for record in source.nodes:
        if not isinstance(record, dict):
            raise ValueError(f"malformed node record {record!r:.80}")
        op, name = record["op"], record["name"]
        if op not in kinds:
            raise ValueError(f"node {name}: unknown kind {op!r}")
        if not _plain_name(name):
            raise ValueError(f"node name {name!r:.80} is not a plain name")
        target = _target(record["target"]) if op == "call_function" else record["target"]
        # FX writes a placeholder's target into the generated ``def forward(...)``.
        if op in ("placeholder", "call_module", "get_attr") and not _plain_name(target):
            raise ValueError(f"node {name}: target {target!r:.80} is not a plain name")
        if op == "call_module" and (modules is None or target not in modules):
            raise ValueError(f"node {name}: no region {target!r:.80}")
        if op == "get_attr" and target not in source.constants:
            raise ValueError(f"node {name}: no constant {target!r:.80}")
        if op == "output" and target != "output":
            raise ValueError(f"node {name}: output target {target!r:.80}")
        args = _decode(record["args"], made)
        kwargs = _decode(record["kwargs"], made)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise ValueError(f"node {name}: malformed arguments")
        made[name] = graph.create_node(op, target, args, kwargs, name=name)
        if made[name].name != name:
            raise ValueError(f"node name {name!r} is taken")
    root: dict[str, Any] = dict(modules) if modules is not None else {}
    for target, constant in source.constants.items():
        if not _plain_name(target) or target in root:
            raise ValueError(f"constant {target!r:.80} is not a plain, free name")
        root[target] = _constant(constant)
    gm = torch.fx.GraphModule(root, graph)
    restore_values(gm, source.values)
    return gm


_NODE_KINDS: tuple[str, ...] = ("placeholder", "call_function", "get_attr", "output")
# The Python functions an aten graph may call: item access and size arithmetic
# on symbolic dimensions. A fixed table: a name outside it does not load.
_PYTHON_TARGETS = {
    f"operator.{f.__name__}": f
    for f in (
        operator.getitem,
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.neg,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
    )
}
_TORCH_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def node_record(node: torch.fx.Node, kinds: tuple[str, ...] = _NODE_KINDS) -> dict[str, Any]:
    """One node as JSON; ``ValueError`` where it is not an op, an input or the output."""
    if node.op not in kinds:
        raise ValueError(f"node {node.name} is a {node.op}")
    return {
        "name": node.name,
        "op": node.op,
        "target": target_name(node.target) if node.op == "call_function" else node.target,
        "args": _encode(node.args),
        "kwargs": _encode(node.kwargs),
    }


def target_name(target: Any) -> str:
    """An operator's name as ``namespace::op.overload`` (or ``operator.getitem``)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    for name, known in _PYTHON_TARGETS.items():
        if target is known:
            return name
    raise ValueError(f"{target} is neither an operator overload nor a size operation")


class UnknownOperatorError(ValueError):
    """A stored graph names an operator this process has not registered."""

    def __init__(self, name: str) -> None:
        super().__init__(f"operator {name} is not registered in this process")
        self.operator = name


def _target(name: Any) -> Any:
    """The operator that ``target_name`` wrote: looked up in ``torch.ops``, never evaluated."""
    if not isinstance(name, str):
        raise ValueError(f"target {name!r} is not a name")
    if name in _PYTHON_TARGETS:
        return _PYTHON_TARGETS[name]
    qualified, _, overload = name.rpartition(".")
    namespace, _, op = qualified.partition("::")
    if not (namespace.isidentifier() and op.isidentifier() and overload.isidentifier()):
        raise ValueError(f"target {name!r} is not an operator name")
    try:
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        raise UnknownOperatorError(name) from None
    if not isinstance(found, torch._ops.OpOverload):
        raise ValueError(f"target {name!r} is not an operator overload")
    return found


def _encode(value: Any) -> Any:
    """A node argument as JSON: nodes by name, torch enums by name, containers tagged."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _encode(v)] for k, v in value.items()]}  # pairs: JSON keys may be sorted
    if isinstance(value, torch.device):
        return {"device": str(value)}
    for kind, cls in _TORCH_ENUMS.items():
        if isinstance(value, cls):
            return {kind: str(value).removeprefix("torch.")}
    raise ValueError(f"an argument is a {type(value).__name__}")


def _decode(value: Any, made: dict[str, torch.fx.Node]) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"malformed argument {value!r:.80}")
    ((kind, item),) = value.items()
    if kind == "node":
        return made[item]  # an unknown name is a KeyError: the graph does not load
    if kind in ("list", "tuple") and isinstance(item, list):
        items = [_decode(v, made) for v in item]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and isinstance(item, list) and all(isinstance(p, list) and len(p) == 2 for p in item):
        return {str(k): _decode(v, made) for k, v in item}
    if kind == "device" and isinstance(item, str):
        return torch.device(item)
    cls = _TORCH_ENUMS.get(kind)
    if cls is not None and isinstance(item, str) and item.isidentifier():
        found = getattr(torch, item, None)
        if isinstance(found, cls):
            return found
    raise ValueError(f"malformed argument {value!r:.80}")


def describe(value: Any) -> Any:
    """A node's value as JSON: tensors by their metadata, sequences and Python scalars as such."""
    if isinstance(value, torch.Tensor):
        sizes = [*value.shape, *value.stride(), value.storage_offset()]
        if not all(type(n) is int for n in sizes):
            raise ValueError("a value has a symbolic size")
        return {
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "offset": value.storage_offset(),
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
        }
    if isinstance(value, (list, tuple)):
        return {"items": [describe(v) for v in value], "tuple": isinstance(value, tuple)}
    if value is None or type(value) in (bool, int, float):
        return {"scalar": value}
    raise ValueError(f"a value is a {type(value).__name__}")


def restore_values(gm: torch.fx.GraphModule, values: list[Any]) -> None:
    """``meta["val"]`` on every node whose value was kept, as fake tensors.

    Each is made from a meta tensor by the fake mode's converter: a fifth of the
    time of ``torch.empty_strided`` under the mode (0.05 against 0.2 ms)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    mode = FakeTensorMode()
    # Outside the caller's fake mode (the backend runs inside Dynamo's): under it,
    # each meta tensor made here went through that mode's dispatch, 2-3 ms a value.
    with unset_fake_temporarily():
        for node, value in zip(gm.graph.nodes, values, strict=True):
            if value is not None:
                node.meta[META_VAL] = _fake(mode, value)


def _fake(mode: Any, description: dict[str, Any]) -> Any:
    if "items" in description:
        items = [_fake(mode, d) for d in description["items"]]
        return tuple(items) if description["tuple"] else items
    if "scalar" in description:
        return description["scalar"]
    shape, stride, offset = description["shape"], description["stride"], description["offset"]
    dtype = getattr(torch, description["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"malformed dtype {description['dtype']!r:.40}")
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset
    meta = torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, torch.device(description["device"]))
