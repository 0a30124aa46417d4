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
tensors held by the graph module other than small constants, which are stored
by value) is traced as before.

The entry is data: nothing in it is executed or unpickled, so whoever can
write the cache directory cannot run code in the user's process through it
(an entry names operators that are already registered, and a name that is not
one is a miss). The cache root itself is checked in ``cache.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from . import aot, decompositions
from .cache import ArtifactCache, versions, warn_once
from .graph_data import GraphSource, describe, graph_source, read_graph
from .inspect import needs_gradients

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
            values = json.dumps([describe(n.meta.get("example_value")) for n in dynamo_gm.graph.nodes])
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
        return read_graph(GraphSource(**record))
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
    built the same way. Costs 0.06 s once on hf_bert, 0.26 s on timm's MobileNetV3
    (0.9 to 1.1 s before its values were made outside Dynamo's fake mode)."""
    source = _source_of(gm)
    if source is None:
        return None
    try:
        same = read_graph(source)
    except Exception as error:
        log.debug("aten graph not cached: it does not read back (%s)", error)
        return None
    if same.code != gm.code:
        log.debug("aten graph not cached: it reads back as a different graph")
        return None
    return same, source


def _source_of(gm: torch.fx.GraphModule) -> GraphSource | None:
    """What the cache stores of ``gm``; None where a node cannot be written as data."""
    try:
        return graph_source(gm)
    except ValueError as error:
        log.debug("aten graph not cached: %s", error)
        return None


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
