"""Route choice for every node of an aten graph: rules first, every rejection kept.

``choose_routes`` gives each compute node its chain of routes (those that can run
it, in priority order) and the reason every other route was rejected.
``plan_graph`` turns that into regions. Nothing here compiles or runs anything.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field, replace

import torch.fx

from .config import Config
from .eager_layouts import batch_norm_outputs_in_traced_order, group_norm_inputs_in_traced_layout
from .errors import ConfigError, RouteUnavailableError, UnsupportedDeviceError, UnsupportedOpError
from .inspect import (
    GraphFacts,
    compute_nodes,
    graph_facts,
    has_unbacked_size,
    is_view_op,
    node_device_indices,
    op_name,
    view_to_caller_reason,
)
from .partition import form_regions
from .region import BY_RULE, DISABLED, NOT_ALLOWED, GraphPlan, Region
from .routes import Availability, Route, WrappingRoute, registry
from .rules import default_rule

# Why a route was rejected, so that strict mode raises the matching error.
WHY_DEVICE = "device"
WHY_UNAVAILABLE = "unavailable"
WHY_OP = "op"

_LEFT_OUT_OF_CAPTURE = "data-dependent shape: runs eager, outside the CUDA graph capture, so that the rest of the graph is captured"


@dataclass
class NodeChoice:
    """The routes that can run one node, best first, and why the others cannot."""

    device: str
    chain: list[str]
    rejected: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    #: the device with its index ("cuda:1"): regions never span two places.
    place: str = "cpu"


def route_order(
    device: str, kind: str, config: Config, bfloat16: bool = False, update_step: bool = False
) -> tuple[tuple[str, ...], dict[str, str]]:
    """Routes to try for ``device``/``kind`` in priority order, and why others are left out;
    ``bfloat16``: the graph computes in bfloat16 (``rules.BFLOAT16_RULES``);
    ``update_step``: it is an update step (``rules.UPDATE_STEP_RULES``)."""
    left_out: dict[str, str] = {}
    if config.routes is not None:
        order = list(config.routes)
        for name in registry.names():
            if name not in order:
                left_out[name] = f"{NOT_ALLOWED} {list(config.routes)} ({config.source('routes')})"
        if not config.strict and "eager" not in order:
            order.append("eager")
    else:
        rule = default_rule(device, kind, bfloat16, update_step)
        order = list(rule.routes)
        extra = [
            r.name
            for r in registry
            if (config.autotune or set(order) & config.disabled)
            and r.name not in order
            and not r.wraps
            and r.serves_device(device)
            and availability(r).ok
        ]
        if config.autotune:
            # Measurement decides: every other route that serves the device joins
            # the candidates, ahead of eager (the rule's order stays the tie-break).
            at = order.index("eager") if "eager" in order else len(order)
            order[at:at] = extra
        elif set(order) & config.disabled:
            # The user disabled a route the rule chose: the others that serve the
            # device stand in, after the rule's remaining routes.
            at = next((i for i, n in enumerate(order) if registry.get(n).wraps), len(order))
            order[at:at] = [n for n in extra if n not in config.disabled]
        for name in registry.names():
            if name not in order:
                route = registry.get(name)
                # A route that runs no graph of this device is out for that reason,
                # not the rule's, which explains the order among the routes that do.
                # A route that serves the device only with a package missing here
                # (onnxrt on cuda) is out by the rule all the same.
                serves = device in route.devices or route.serves_device(device)
                why = rule.reason if serves else route.device_reason(device)
                left_out[name] = f"{BY_RULE}: {why}"
    for name in list(order):
        if name in config.disabled:
            order.remove(name)
            left_out[name] = f"{DISABLED} {config.source('disabled')}"
    if config.disabled and not any(not registry.get(n).wraps for n in order):
        raise ConfigError(
            f"{config.source('disabled')} leaves no route for {device} {kind} graphs; routes that serve "
            f"{device}: {[r.name for r in registry if not r.wraps and r.serves_device(device)]}. "
            "Instead: enable at least one of them (eager runs every op)"
        )
    return tuple(order), left_out


@functools.cache
def availability(route: Route) -> Availability:
    """``route.available()``, asked once per process (it imports the route's runtime)."""
    return route.available()


def route_verdict(
    route: Route, node: torch.fx.Node, device: str, facts: GraphFacts
) -> tuple[str, str] | None:
    """None where ``route`` can run ``node`` on ``device``, else (why, reason)."""
    status = availability(route)
    if not status.ok:
        return WHY_UNAVAILABLE, f"unavailable: {status.reason}"
    if not route.serves_device(device):
        return WHY_DEVICE, route.device_reason(device)
    if facts.needs_grad and not route.trains:
        return WHY_OP, f"{facts.kind} graph of a training step: {route.name} runs inference only"
    if not route.keeps_aliases and is_view_op(node):
        aliasing = view_to_caller_reason(node)
        if aliasing:
            return WHY_OP, f"{op_name(node)} {aliasing}; {route.name} would return a copy"
    reason = route.supports(node, facts)
    return None if reason is None else (WHY_OP, reason)


def choose_routes(
    gm: torch.fx.GraphModule, facts: GraphFacts, config: Config
) -> dict[torch.fx.Node, NodeChoice]:
    """Each compute node's route chain; ``getitem`` nodes follow their producer."""
    choices: dict[torch.fx.Node, NodeChoice] = {}
    orders: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
    prepared: set[str] = set()
    for node in compute_nodes(gm):
        source = node.args[0] if node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and source in choices:
            producer = choices[source]
            choices[node] = NodeChoice(
                producer.device, producer.chain, producer.rejected, producer.why, producer.place
            )
            continue
        devices = node_device_indices(node)
        # A node touching cpu and an accelerator belongs to the accelerator's side.
        device_types = sorted({d.type for d in devices}, key=lambda t: t == "cpu")
        device = device_types[0] if device_types else "cpu"
        if device not in orders:
            orders[device] = route_order(device, facts.kind, config, facts.bfloat16, facts.update_step)
            for name in orders[device][0]:
                if name not in prepared and availability(registry.get(name)).ok:
                    registry.get(name).prepare(gm, facts)
                    prepared.add(name)
        order, left_out = orders[device]
        places = sorted((str(d) for d in devices if d.type == device), key=len)
        choice = NodeChoice(device, [], dict(left_out), place=places[0] if places else device)
        if len(devices) > 1:
            where = ", ".join(sorted(str(d) for d in devices))
            for name in order:
                if name != "eager":
                    choice.rejected[name] = f"{op_name(node)} moves data between devices ({where})"
                    choice.why[name] = WHY_DEVICE
            choice.chain = ["eager"] if "eager" in order else []
        else:
            captured = any(registry.get(name).wraps for name in order) and not facts.needs_grad
            for name in order:
                if registry.get(name).wraps:
                    wrapper = registry.get(name)
                    reason = wrapper.supports(node, facts)
                    if wrapper.serves_device(device) and reason is not None:
                        choice.why[name], choice.rejected[name] = WHY_OP, reason
                    else:
                        choice.why[name], choice.rejected[name] = WHY_DEVICE, wrapper.device_reason(device)
                    continue
                verdict = route_verdict(registry.get(name), node, device, facts)
                if verdict is None and captured and name != "eager" and has_unbacked_size(node):
                    verdict = (WHY_OP, _LEFT_OUT_OF_CAPTURE)
                if verdict is None:
                    choice.chain.append(name)
                else:
                    choice.why[name], choice.rejected[name] = verdict
        if not choice.chain:
            raise _strict_error(node, choice, order, config)
        choices[node] = choice
    return choices


def plan_graph(
    gm: torch.fx.GraphModule,
    kind: str,
    config: Config,
    graph_index: int,
    input_names: dict[int, str] | None = None,
) -> tuple[GraphPlan, torch.fx.GraphModule]:
    """Split ``gm`` (in place) into one submodule per region and describe them."""
    group_norm_inputs_in_traced_layout(gm)  # before any route or check runs it
    batch_norm_outputs_in_traced_order(gm)
    facts = graph_facts(gm, kind, input_names)
    check_forced_route(config, facts)
    choices = choose_routes(gm, facts, config)
    devices = {c.device for c in choices.values()} | set(facts.devices)
    order = {
        device: route_order(device, kind, config, facts.bfloat16, facts.update_step)[0]
        for device in sorted(devices)
    }
    regions = form_regions(gm, choices, order, config.min_region_size, graph_index, kind)
    regions = _plan_capture(gm, regions, order, facts)
    plan = GraphPlan(
        graph_index, kind, facts.devices, facts.dynamic, facts.node_count, order, regions, facts.dynamic_dims
    )
    return plan, gm


def _plan_capture(
    gm: torch.fx.GraphModule, regions: list[Region], order: dict[str, tuple[str, ...]], facts: GraphFacts
) -> list[Region]:
    """Each region, wrapped in ``cudagraphs`` where it is capture-safe and its
    device's order allows it."""
    return [_captured(gm, region, order, facts) for region in regions]


def _captured(
    gm: torch.fx.GraphModule, region: Region, order: dict[str, tuple[str, ...]], facts: GraphFacts
) -> Region:
    (device,) = region.devices
    wrapper = next((r for r in order.get(device, ()) if registry.get(r).wraps), None)
    if wrapper is None:
        return region
    route = registry.get(wrapper)
    assert isinstance(route, WrappingRoute)
    reason = None if route.serves_device(device) else route.device_reason(device)
    if reason is None and facts.needs_grad and not route.trains:
        reason = f"{facts.kind} graph of a training step: {wrapper} captures inference graphs only"
    reason = reason or route.capture_reason(getattr(gm, region.name), registry.get(region.route))
    rejected = dict(region.rejected)
    if reason is not None:
        return replace(region, rejected={**rejected, wrapper: reason})
    rejected.pop(wrapper, None)
    return replace(
        region,
        route=wrapper,
        inner_route=region.route,
        fallbacks=(region.route, *region.fallbacks),
        rejected=rejected,
    )


def check_forced_route(config: Config, facts: GraphFacts) -> None:
    """Forcing is never silent: a forced route that is not installed, or that
    cannot run on the graph's device at all, raises, strict or not."""
    forced = config.forced
    devices = sorted(facts.devices, key=lambda d: d == "cpu")  # the accelerator first
    if forced is None or not devices:
        return
    route, device, where = registry.get(forced), devices[0], config.source("routes")
    if not route.serves_device(device):
        if device == "mps" and forced == "inductor":
            instead = (
                "inductor does not run on mps; auto runs mps graphs eagerly, or move the model to cpu/cuda"
            )
        else:
            instead = f"force a route that serves {device} (python -m dispatch lists them)"
        raise UnsupportedDeviceError(
            f"route {forced!r}, forced by {where}, cannot run this graph's {device} tensors: "
            f"{route.device_reason(device)}. Instead: {instead}, or {_unforce(where)}"
        )
    status = availability(route)
    if not status.ok and not route.wraps:  # a wrapping route's hardware comes with the tensors
        raise RouteUnavailableError(
            f"route {forced!r}, forced by {where}, is not available on this machine: {status.reason}. "
            f"Instead: install it, or {_unforce(where)}"
        )


def _unforce(where: str | None) -> str:
    if where and where.startswith("DISPATCH_ROUTE"):
        return "unset DISPATCH_ROUTE to let auto choose"
    return "leave options['routes'] out to let auto choose"


def _strict_error(
    node: torch.fx.Node, choice: NodeChoice, order: tuple[str, ...], config: Config
) -> Exception:
    device = choice.device
    reasons = "; ".join(f"{r}: {choice.rejected[r]}" for r in order if r in choice.rejected)
    where = f"{op_name(node)} (node {node.name}) on {device}"
    advice = fallback_advice(config)
    if order and all(choice.why.get(r) == WHY_DEVICE for r in order):
        route = order[0]
        return UnsupportedDeviceError(
            f"route {route!r} cannot serve device {device!r} for {where}: {reasons}. Instead: {advice}"
        )
    if order and all(choice.why.get(r) == WHY_UNAVAILABLE for r in order):
        return RouteUnavailableError(
            f"route(s) {list(order)} unavailable for {where}: {reasons}. Instead: {advice}"
        )
    return UnsupportedOpError(f"no allowed route can run {where}: {reasons}. Instead: {advice}")


def fallback_advice(config: Config) -> str:
    """How to let eager run what the allowed routes cannot, for the settings the user made."""
    steps = []
    if config.strict:
        source = config.source("strict") or "strict"
        steps.append(
            "unset DISPATCH_STRICT"
            if source.startswith("DISPATCH_STRICT")
            else "set options['strict'] to False"
        )
    if "eager" in config.disabled:
        steps.append(f"remove 'eager' from {config.source('disabled')}")
    if config.routes is not None and "eager" not in config.routes and config.strict:
        where = config.source("routes") or ""
        steps.append(
            "unset DISPATCH_ROUTE"
            if where.startswith("DISPATCH_ROUTE")
            else "add 'eager' to options['routes']"
        )
    return ", or ".join(steps) or "allow 'eager', which runs every op"
