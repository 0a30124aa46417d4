"""The aten graph of a Dynamo graph, kept in the persistent cache: a warm start skips AOTAutograd.

AOTAutograd traces every Dynamo graph again on fake tensors. On a warm start,
that trace was the largest cost left that is ours: 0.10-0.15 s of 0.6 s on the
custom-op benchmark model, and 0.21-0.29 s of 0.8 s on the transformer layer.

Inductor's ``AOTAutogradCache`` skips that trace, but it stores the compiled
``OutputCode`` that only Inductor makes, so it cannot hold our graphs. What is
stored here is less: the inference graph itself, as data: each node's name,
kind, operator name and arguments (JSON). It is read back by looking each
operator up by name in ``torch.ops`` and building the nodes with
``torch.fx.Graph.create_node``. The cold process plans the graph read back
too, so that both processes plan the same graph.
Each node's ``meta["val"]`` (what planning reads) is stored as its tensors'
metadata and made again as fake tensors. That takes milliseconds, where
``FakeTensorProp`` took 0.16 s on the transformer layer.

Only graphs whose result is fixed by the key are stored. The key is:

- the Dynamo graph's code;
- its inputs' metadata and aliasing;
- grad, inference and autocast state, and the AOTAutograd config;
- the decomposition table;
- the versions.

Every node must pass torch's own cacheability check, the one
``AOTAutogradCache`` uses. Within that set, only inference graphs whose
AOTAutograd runtime wrapper would do nothing are stored (the wrapper is
skipped in that case anyway), and only if the record reads back as the same
graph. Anything else (gradients, autocast, dynamic shapes, non-tensor inputs,
tensors held by the graph module) is traced as before.

The entry is data: nothing in it is executed or unpickled, so whoever can
write the cache directory cannot run code in the user's process through it
(an entry names operators that are already registered, and a name that is not
one is a miss). The cache root itself is checked in ``cache.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import keyword
import logging
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.fx

from . import aot, decompositions
from .cache import ArtifactCache, versions, warn_once
from .inspect import META_VAL, needs_gradients

log = logging.getLogger("dispatch")

KIND = "aten"
_FORMAT = 2  # bump when the entry's layout or what the key covers changes


def aten_graph_key(
    dynamo_gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    static_inputs: frozenset[int],
    decompose: bool,
) -> str | None:
    """The key of the inference graph that AOTAutograd makes of ``dynamo_gm``.

    None where the graph is not one that can be stored (the reason is logged at
    debug level)."""
    reason = _not_storable(dynamo_gm, example_inputs)
    if reason is None:
        try:
            # Dynamo's fake values of every node: a custom op's changed fake
            # implementation changes the key, though not the graph's code.
            values = json.dumps([_describe(n.meta.get("example_value")) for n in dynamo_gm.graph.nodes])
        except ValueError as error:
            reason = str(error)
    if reason is not None:
        log.debug("aten graph not cached: %s", reason)
        return None
    h = hashlib.sha256()
    h.update(dynamo_gm.code.encode())
    h.update(values.encode())
    storages: dict[int, int] = {}
    for i, x in enumerate(example_inputs):
        alias = storages.setdefault(x.untyped_storage().data_ptr(), i) if x.numel() else -1
        h.update(
            f"{tuple(x.shape)}|{x.stride()}|{x.storage_offset()}|{x.dtype}|{x.device}|"
            f"{x.requires_grad}|{x.is_inference()}|{x._is_view()}|{x.is_conj()}|{x.is_neg()}|"
            f"{alias}|{i in static_inputs}\n".encode()
        )
    h.update(
        f"{_FORMAT}|{decompose}|{torch.is_grad_enabled()}|{torch.is_inference_mode_enabled()}|"
        f"{torch.are_deterministic_algorithms_enabled()}|{versions()}|{_source_digest()}".encode()
    )
    h.update(torch._functorch.config.save_config())
    return h.hexdigest()


def load_aten_graph(cache: ArtifactCache, key: str) -> torch.fx.GraphModule | None:
    """The stored inference graph, its nodes' fake values restored; None on a miss."""
    record = cache.get_json(KIND, key)
    if record is None:
        return None
    try:
        return _read(GraphSource(**record))
    except Exception as error:  # an entry that no longer loads is a miss, then rewritten
        warn_once(f"dispatch: cached aten graph {key[:12]} does not load ({error}); tracing again")
        return None


def save_aten_graph(cache: ArtifactCache, key: str, source: GraphSource) -> None:
    """Store what ``read_back`` returned, for later processes."""
    cache.put_json(KIND, key, source._asdict())


def read_back(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, GraphSource] | None:
    """``gm`` as a warm start will read it from the cache, and what to store; None where
    it cannot be stored.

    The cold process plans the graph read back, not AOTAutograd's own: graphs
    derived from it (the stitched graph, each region's graph) take their node
    names from how it was built, and those names are in the cache keys of
    measured decisions and ONNX models. So both processes must plan a graph
    built the same way. Costs a few milliseconds, once."""
    source = _source_of(gm)
    if source is None:
        return None
    try:
        same = _read(source)
    except Exception as error:
        log.debug("aten graph not cached: it does not read back (%s)", error)
        return None
    if same.code != gm.code:
        log.debug("aten graph not cached: it reads back as a different graph")
        return None
    return same, source


class GraphSource(NamedTuple):
    """What the cache stores of a graph: data only, never code."""

    nodes: list[dict[str, Any]]  # each node's name, kind, target and arguments (``_node_record``)
    values: list[Any]  # each node's ``meta["val"]`` as ``_describe`` writes it


def _source_of(gm: torch.fx.GraphModule) -> GraphSource | None:
    """What the cache stores of ``gm``; None where a node cannot be written as data."""
    try:
        nodes = [_node_record(node) for node in gm.graph.nodes]
        values = [_describe(node.meta.get(META_VAL)) for node in gm.graph.nodes]
    except ValueError as error:
        log.debug("aten graph not cached: %s", error)
        return None
    return GraphSource(nodes, values)


def _not_storable(dynamo_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    if any(True for _ in dynamo_gm.parameters()) or any(True for _ in dynamo_gm.buffers()):
        return "the graph module holds parameters or buffers"
    for x in example_inputs:
        if type(x) not in (torch.Tensor, torch.nn.Parameter):
            return f"an input is a {type(x).__name__}, not a plain tensor"
        if x.layout != torch.strided:
            return f"an input has layout {x.layout}"
    if needs_gradients(example_inputs):
        return "gradients are needed"
    if any(torch.is_autocast_enabled(d) for d in torch._C._autocast_supported_devices()):
        return "autocast is on"
    try:
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe
    except ImportError:
        return "this torch has no AOTAutogradCache check to reuse"
    for node in dynamo_gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return f"node {node.name} reads the graph module ({node.op})"
        if node.op != "call_function":
            continue
        try:
            check_node_safe(node)
        except BypassAOTAutogradCache as error:
            return str(error).splitlines()[0]
        if _defined_in_python(node.target):
            return f"{node.target} is decomposed by its Python definition, which may change between processes"
    return None


def _defined_in_python(target: Any) -> bool:
    """A user op (outside torch's namespaces) that AOTAutograd decomposes into its body."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[0] not in _TORCH_NAMESPACES
    if isinstance(target, torch._ops.OpOverload) and target.namespace not in _TORCH_NAMESPACES:
        return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")
    return False


_TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized", "_quantized", "higher_order"})


@functools.cache
def _source_digest() -> str:
    """Our code that shapes the aten graph: the decompositions and the AOTAutograd call."""
    h = hashlib.sha256()
    for module in (decompositions, aot):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def _read(source: GraphSource) -> torch.fx.GraphModule:
    """The graph that ``source`` describes: ops looked up by name, nothing executed
    but FX's own code generation for the graph module."""
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    for record in source.nodes:
        op, name = record["op"], record["name"]
        if op not in _NODE_KINDS:
            raise ValueError(f"node {name}: unknown kind {op!r}")
        target = _target(record["target"]) if op == "call_function" else record["target"]
        # FX writes a placeholder's target into the generated ``def forward(...)``.
        if op == "placeholder" and not _plain_name(target):
            raise ValueError(f"node {name}: placeholder {target!r:.80} is not a plain name")
        if op == "output" and target != "output":
            raise ValueError(f"node {name}: output target {target!r:.80}")
        args = _decode(record["args"], made)
        kwargs = _decode(record["kwargs"], made)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise ValueError(f"node {name}: malformed arguments")
        made[name] = graph.create_node(op, target, args, kwargs, name=name)
        if made[name].name != name:
            raise ValueError(f"node name {name!r} is taken")
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    _restore_values(gm, source.values)
    return gm


_NODE_KINDS = ("placeholder", "call_function", "output")
_PYTHON_TARGETS = {"operator.getitem": operator.getitem}
_TORCH_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _node_record(node: torch.fx.Node) -> dict[str, Any]:
    if node.op not in _NODE_KINDS:
        raise ValueError(f"node {node.name} is a {node.op}")
    return {
        "name": node.name,
        "op": node.op,
        "target": _target_name(node.target) if node.op == "call_function" else node.target,
        "args": _encode(node.args),
        "kwargs": _encode(node.kwargs),
    }


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    for name, known in _PYTHON_TARGETS.items():
        if target is known:
            return name
    raise ValueError(f"{target} is neither an operator overload nor operator.getitem")


def _target(name: Any) -> Any:
    """The operator that ``_target_name`` wrote: looked up in ``torch.ops``, never evaluated."""
    if not isinstance(name, str):
        raise ValueError(f"target {name!r} is not a name")
    if name in _PYTHON_TARGETS:
        return _PYTHON_TARGETS[name]
    qualified, _, overload = name.rpartition(".")
    namespace, _, op = qualified.partition("::")
    if not (namespace.isidentifier() and op.isidentifier() and overload.isidentifier()):
        raise ValueError(f"target {name!r} is not an operator name")
    found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
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
        return {"dict": [[k, _encode(v)] for k, v in value.items()]}  # pairs: the cache sorts JSON keys
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
        return made[item]  # an unknown name is a KeyError: the entry does not load
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


def _describe(value: Any) -> Any:
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
        return {"items": [_describe(v) for v in value], "tuple": isinstance(value, tuple)}
    if value is None or type(value) in (bool, int, float):
        return {"scalar": value}
    raise ValueError(f"a value is a {type(value).__name__}")


def _restore_values(gm: torch.fx.GraphModule, values: list[Any]) -> None:
    """``meta["val"]`` on every node, fake tensors as AOTAutograd's trace left them.

    Each is made from a meta tensor by the fake mode's converter: a fifth of the
    time of ``torch.empty_strided`` under the mode (0.05 against 0.2 ms)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    for node, value in zip(gm.graph.nodes, values, strict=True):
        node.meta[META_VAL] = _fake(mode, value)


def _fake(mode: Any, description: dict[str, Any]) -> Any:
    if "items" in description:
        items = [_fake(mode, d) for d in description["items"]]
        return tuple(items) if description["tuple"] else items
    if "scalar" in description:
        return description["scalar"]
    shape, stride, offset = description["shape"], description["stride"], description["offset"]
    dtype = getattr(torch, description["dtype"])
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset
    meta = torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, torch.device(description["device"]))
