"""Data records of a routing decision: ``Region`` and ``Plan``.

They hold names and strings only (no graph, no tensors), so a plan can be
printed, compared in tests and serialised with ``to_dict()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Region:
    """One piece of one graph, run by one route: a plan, never changed once made.

    ``rejected`` maps every route that was not chosen to the reason. A region
    captured in a CUDA graph has ``route == "cudagraphs"`` and names the route
    that runs inside the capture in ``inner_route``. What happens at run time
    (a route failing and the next taking over, measurements) is recorded beside
    the plan in a ``RegionRun``; ``explain`` reports that outcome as a ``Region``.
    """

    graph: int
    name: str
    route: str
    ops: tuple[str, ...]
    devices: frozenset[str]
    node_count: int
    kind: str = "inference"
    rejected: dict[str, str] = field(default_factory=dict)
    fallbacks: tuple[str, ...] = ()
    #: for a captured region (route "cudagraphs"), the route that runs inside the capture
    inner_route: str | None = None
    #: with autotune: each candidate route's measured time per call, or why it was not measured
    measured: dict[str, str] = field(default_factory=dict)
    #: in an outcome whose route differs from the plan's: the route the plan chose
    #: (the region's name keeps the planned route)
    planned_route: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "name": self.name,
            "kind": self.kind,
            "route": self.route,
            "inner_route": self.inner_route,
            "ops": list(self.ops),
            "devices": sorted(self.devices),
            "node_count": self.node_count,
            "rejected": dict(self.rejected),
            "fallbacks": list(self.fallbacks),
            "measured": dict(self.measured),
            "planned_route": self.planned_route,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], graph: int | None = None) -> Region:
        """The inverse of ``to_dict``; ``graph`` renumbers the region's graph."""
        return cls(
            graph=data["graph"] if graph is None else graph,
            name=data["name"],
            route=data["route"],
            ops=tuple(data["ops"]),
            devices=frozenset(data["devices"]),
            node_count=data["node_count"],
            kind=data["kind"],
            rejected=dict(data["rejected"]),
            fallbacks=tuple(data["fallbacks"]),
            inner_route=data["inner_route"],
            measured=dict(data["measured"]),
            planned_route=data["planned_route"],
        )


@dataclass
class RegionRun:
    """What happened to one planned region at run time: the route it runs on now,
    the routes that failed (in ``rejected``) and what measuring found."""

    planned: Region
    route: str
    inner_route: str | None
    fallbacks: tuple[str, ...]
    rejected: dict[str, str]
    measured: dict[str, str]

    @classmethod
    def of(cls, region: Region) -> RegionRun:
        return cls(
            region,
            region.route,
            region.inner_route,
            region.fallbacks,
            dict(region.rejected),
            dict(region.measured),
        )

    def outcome(self) -> Region:
        """The plan as it turned out: a new record; the plan itself is unchanged."""
        return replace(
            self.planned,
            planned_route=self.planned.route if self.route != self.planned.route else None,
            route=self.route,
            inner_route=self.inner_route,
            fallbacks=self.fallbacks,
            rejected=dict(self.rejected),
            measured=dict(self.measured),
        )


@dataclass
class GraphPlan:
    """The regions of one aten graph (an inference, forward or backward graph)."""

    graph: int
    kind: str
    devices: frozenset[str]
    dynamic: bool
    node_count: int
    route_order: dict[str, tuple[str, ...]]
    regions: list[Region] = field(default_factory=list)
    #: "x dim 0 = s77" for each symbolic input dimension (empty for a static graph)
    dynamic_dims: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "kind": self.kind,
            "devices": sorted(self.devices),
            "dynamic": self.dynamic,
            "dynamic_dims": list(self.dynamic_dims),
            "node_count": self.node_count,
            "route_order": {k: list(v) for k, v in self.route_order.items()},
            "regions": [r.to_dict() for r in self.regions],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], graph: int | None = None) -> GraphPlan:
        """The inverse of ``to_dict``; ``graph`` renumbers the graph and its regions."""
        index = data["graph"] if graph is None else graph
        return cls(
            graph=index,
            kind=data["kind"],
            devices=frozenset(data["devices"]),
            dynamic=data["dynamic"],
            node_count=data["node_count"],
            route_order={k: tuple(v) for k, v in data["route_order"].items()},
            regions=[Region.from_dict(r, index) for r in data["regions"]],
            dynamic_dims=tuple(data["dynamic_dims"]),
        )


@dataclass
class Plan:
    """The routing decision for one FX graph: its aten graphs and their regions."""

    graphs: list[GraphPlan] = field(default_factory=list)

    @property
    def regions(self) -> list[Region]:
        return [r for g in self.graphs for r in g.regions]

    def routes(self) -> set[str]:
        return {r.route for r in self.regions}

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": [g.to_dict() for g in self.graphs]}

    def __str__(self) -> str:
        return region_table(self.regions)


# How a reason in ``Region.rejected`` begins where a route was left out of the
# order (by rule or by the user) or stands behind the chosen one as its fallback.
BY_RULE = "not chosen by rule"
NOT_ALLOWED = "not in the allowed routes"
DISABLED = "disabled by"
LOWER_PRIORITY = "lower priority than"
_LEFT_OUT = (BY_RULE, NOT_ALLOWED, DISABLED)


def region_table(regions: Sequence[Region]) -> str:
    """A readable table: one row per region, then why other routes were not chosen."""
    header = ("graph", "kind", "region", "route", "fallback", "devices", "nodes", "ops")
    rows = [
        (
            str(r.graph),
            r.kind,
            r.name,
            r.route if r.planned_route is None else f"{r.route} (planned {r.planned_route})",
            ",".join(r.fallbacks) or "-",
            ",".join(sorted(r.devices)),
            str(r.node_count),
            _short(", ".join(o.removeprefix("aten.").removesuffix(".default") for o in r.ops), 60),
        )
        for r in regions
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in rows]
    # A route the rule or the user's settings left out has the same reason in every
    # region: it is said once. A fallback's "lower priority" is the fallback column.
    left_out: dict[str, dict[str, None]] = {}
    notes = []
    for r in regions:
        for route, reason in r.rejected.items():
            if reason.startswith(_LEFT_OUT):
                left_out.setdefault(reason.removeprefix(f"{BY_RULE}: "), {})[route] = None
            elif not reason.startswith(LOWER_PRIORITY):
                notes.append(f"  graph {r.graph} {r.name} [{r.kind}]: {route} not chosen: {reason}")
    if notes:
        lines += ["", "Why not other routes:", *notes]
    if left_out:
        # A measurement may move a region to a route the rule left out (a cut CPU
        # graph's ORT regions to inductor): said beside the rule, not against it.
        ran = {r.route for r in regions}
        lines += ["", "Left out of the route order:"]
        for reason, routes in left_out.items():
            if rest := [route for route in routes if route not in ran]:
                lines.append(f"  {', '.join(rest)}: {reason}")
            if moved := [route for route in routes if route in ran]:
                lines.append(
                    f"  {', '.join(moved)}: {reason} (the regions above on {', '.join(moved)} "
                    "were moved there by measurement)"
                )
    measured = [
        f"  graph {r.graph} {r.name} [{r.kind}]: "
        + ", ".join(f"{route} {line}" for route, line in r.measured.items())
        for r in regions
        if r.measured
    ]
    if measured:
        lines += ["", "Measured:", *measured]
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
