"""Cut an aten graph into regions: one route, one device (``cuda:1``, not just ``cuda``) each.

``CapabilityBasedPartitioner`` proposes cycle-free partitions for one (route,
device) at a time and ``fuse_by_partitions`` turns each into a submodule, so a
later route's partitions see earlier regions as single nodes and can never form
a cycle with them. A region with fewer than ``min_region_size`` compute ops is
handed to the next route in its nodes' chains (eventually eager), so a model is
not shredded into tiny regions whose hand-over costs more than they gain.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import create_op_support
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from .inspect import META_BESIDE_OTHER_ROUTES, META_STATIC, META_VAL, is_computing_op, is_view_op, op_name
from .region import LOWER_PRIORITY, Region
from .routes.registry import registry

if TYPE_CHECKING:
    from .planner import NodeChoice


def _compute_count(nodes: Iterable[torch.fx.Node]) -> int:
    return sum(1 for n in nodes if is_computing_op(n))


def form_regions(
    gm: torch.fx.GraphModule,
    choices: dict[torch.fx.Node, NodeChoice],
    orders: dict[str, tuple[str, ...]],
    min_region_size: int,
    graph_index: int,
    kind: str,
) -> list[Region]:
    """Fuse ``gm``'s compute nodes into region submodules in place; describe each.

    ``orders`` gives each device's routes in priority order; regions of a
    higher-priority route are formed first.
    """
    # fuse_by_partitions rebuilds the graph, so nodes are matched by name and target.
    by_name = _ByName(choices)
    regions: list[Region] = []
    places = list(dict.fromkeys((c.device, c.place) for c in by_name.values()))
    for device, place in places:
        for route in orders[device]:
            kept = _kept_partitions(gm, by_name, route, place, min_region_size)
            if not kept:
                continue
            # Numbered in the order they run, so that _0 is the first such region a call meets.
            position = {n: i for i, n in enumerate(gm.graph.nodes)}
            kept.sort(key=lambda p: min(position[n] for n in p.nodes))
            prefix = f"{route}_{place.replace(':', '')}_"
            described = [describe_region(p.nodes, by_name, route, device, graph_index, kind) for p in kept]
            fuse_by_partitions(gm, [dict(p.nodes) for p in kept], prefix=prefix, always_return_tuple=True)
            regions += [replace(region, name=f"{prefix}{i}") for i, region in enumerate(described)]
    gm.recompile()
    _annotate_placeholders(gm, {r.name for r in regions})
    for region in regions:  # a region of views only (one returned to the caller) runs no ops
        beside = any(other.route != region.route and other.node_count for other in regions)
        getattr(gm, region.name).meta[META_BESIDE_OTHER_ROUTES] = beside
    called = {node.target: i for i, node in enumerate(gm.graph.find_nodes(op="call_module"))}
    return sorted(regions, key=lambda r: called[r.name])


class _ByName(dict):
    """Node choices keyed by (name, target), which survive the graph rebuilds of fusing."""

    def __init__(self, choices: dict[torch.fx.Node, NodeChoice]) -> None:
        super().__init__({(n.name, n.target): c for n, c in choices.items()})

    def get(self, node: torch.fx.Node, default: object = None) -> NodeChoice | None:
        return super().get((node.name, node.target), default)

    def __getitem__(self, node: torch.fx.Node) -> NodeChoice:
        return super().__getitem__((node.name, node.target))

    def __contains__(self, node: object) -> bool:
        return isinstance(node, torch.fx.Node) and super().__contains__((node.name, node.target))


def _propose(gm: torch.fx.GraphModule, choices: dict, route: str, place: str) -> list:
    def supported(_submodules: object, node: torch.fx.Node) -> bool:
        choice = choices.get(node)
        return choice is not None and choice.place == place and choice.chain[:1] == [route]

    partitioner = CapabilityBasedPartitioner(
        gm, create_op_support(supported), allows_single_node_partition=True
    )
    return partitioner.propose_partitions()


def _kept_partitions(gm: torch.fx.GraphModule, choices: dict, route: str, place: str, min_size: int) -> list:
    """The partitions ``route`` takes as regions at ``place``. A refused partition's
    nodes go to their next route; where the route names the nodes that stop it
    (``region_blockers``), only those go, and the rest is proposed again: taking
    nodes out of a partition can leave a path that leaves it and comes back."""
    floor = registry.get(route).min_region_size or min_size
    while True:
        kept, narrowed = [], False
        for partition in _propose(gm, choices, route, place):
            _leave_views_of_inputs(partition.nodes, choices, route)
            if not partition.nodes:
                continue
            size = _compute_count(partition.nodes)
            if route == "eager":
                reason = None
            elif size < floor:
                reason = f"region of {size} op(s) is below min_region_size={floor}"
            else:
                reason = registry.get(route).region_reason(partition.nodes)
                blockers = registry.get(route).region_blockers(partition.nodes) if reason else ()
                if (
                    reason
                    and 0 < len(blockers) < len(partition.nodes)
                    and _demote(blockers, choices, route, reason)
                ):
                    narrowed = True
                    continue
            if reason is not None and _demote(partition.nodes, choices, route, reason):
                continue
            kept.append(partition)
        if not narrowed:
            return kept


def _leave_views_of_inputs(nodes: dict[torch.fx.Node, object], choices: dict, route: str) -> None:
    """Take out of a partition of a route that copies its outputs (``keeps_aliases``
    False) the views of its inputs that only other regions read: torch takes such a
    view for free, the route would compute and copy it on every call. A mixture-of-
    experts layer's transposed expert weights, read by the eager op between two ONNX
    Runtime regions, were copied twice per call (out of ORT, then into their strides).
    No path leaves a partition and comes back, so what is taken out forms no cycle."""
    if registry.get(route).keeps_aliases:
        return
    views = {n for n in nodes if is_view_op(n)}
    changed = True
    while changed:
        changed = False
        for n in list(views):
            linked = [*n.all_input_nodes, *n.users]
            if any(m in nodes and m not in views for m in linked):
                views.discard(n)
                changed = True
    reason = f"a view of its region's inputs read only outside it: torch takes it without a copy, {route} copies it"
    if views and _demote(views, choices, route, reason):
        for n in views:
            del nodes[n]


def _demote(nodes: Iterable[torch.fx.Node], choices: dict, route: str, reason: str) -> bool:
    """Hand a refused partition's nodes to their next route; False if none has one."""
    if any(len(choices[n].chain) < 2 for n in nodes if n in choices):
        return False
    for n in nodes:
        choice = choices[n]
        if choice.chain[:1] == [route]:
            choice.chain = choice.chain[1:]
            choice.rejected[route] = reason
    return True


def describe_region(
    nodes: Iterable[torch.fx.Node], choices: dict, route: str, device: str, graph_index: int, kind: str
) -> Region:
    ordered = [n for n in nodes if n.op == "call_function"]
    reasons: dict[str, dict[str, None]] = {}
    fallbacks: list[str] = []
    for n in ordered:
        for name, reason in choices[n].rejected.items():
            if name != route:
                reasons.setdefault(name, {})[reason] = None
    rejected = {name: "; ".join(distinct) for name, distinct in reasons.items()}
    # A route can stand in for this region only if it can run every node of it.
    for name in choices[ordered[0]].chain[1:]:
        if all(name in choices[n].chain for n in ordered):
            fallbacks.append(name)
    for name in fallbacks:
        rejected.setdefault(name, f"{LOWER_PRIORITY} {route}")
    ops = tuple(dict.fromkeys(op_name(n) for n in ordered if n.target is not operator.getitem))
    return Region(
        graph=graph_index,
        name="",
        route=route,
        ops=ops,
        devices=frozenset({device}),
        node_count=_compute_count(ordered),
        kind=kind,
        rejected=rejected,
        fallbacks=tuple(fallbacks),
    )


def _annotate_placeholders(gm: torch.fx.GraphModule, names: set[str]) -> None:
    """Give each region's placeholders the fake value (and static mark) of their argument;
    one fed by a constant of the graph is static too."""
    for node in gm.graph.find_nodes(op="call_module"):
        if node.target not in names:
            continue
        sub = getattr(gm, node.target)
        placeholders = sub.graph.find_nodes(op="placeholder")
        for ph, arg in zip(placeholders, node.args):
            if isinstance(arg, torch.fx.Node):
                for key in (META_VAL, META_STATIC):
                    if key in arg.meta:
                        ph.meta[key] = arg.meta[key]
                if arg.op == "get_attr" and isinstance(arg.meta.get(META_VAL), torch.Tensor):
                    # A tensor constant of the graph (``torch.tensor(8.0)`` in a forward) is
                    # the same tensor on every call: static, so ORT folds it as a weight.
                    ph.meta[META_STATIC] = True
