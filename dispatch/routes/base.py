"""The ``Route`` interface: one runtime that can compile and run a region.

A route is a small object: ``name``, ``devices``, ``available()``,
``supports(node, graph) -> None | reason`` and ``compile(gm, example_inputs)``.
For saved programs (``dispatch.lower``), a route also turns a region into bytes
and back, as ExecuTorch's backend contract does:
``preprocess(region, compile_specs) -> PreprocessResult`` and
``load(processed_bytes, region, specs) -> callable``.
Heavy imports (onnxruntime, triton) happen inside ``available()``,
``compile()``, ``preprocess()`` and ``load()``, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..inspect import GraphFacts

CompiledFn = Callable[..., Any]

#: the distribution's name on the package index (the import name is ``dispatch``)
DISTRIBUTION = "torch-auto-dispatch"


def install_hint(extra: str) -> str:
    """The command that installs an optional runtime, as this package's extra."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


@dataclass(frozen=True)
class Availability:
    """Whether a route can run on this machine, and why not."""

    ok: bool
    version: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"available": self.ok, "version": self.version, "reason": self.reason}


@dataclass
class RegionProgram:
    """One region handed to ``preprocess`` or ``load``: its aten graph, and its real
    inputs when lowering (None when loading a saved program: a route's payload
    must not need them; ``load`` may use them to check its first call)."""

    gm: torch.fx.GraphModule
    example_inputs: Sequence[Any] | None = None


@dataclass(frozen=True)
class PreprocessResult:
    """What a route made of a region for a saved program.

    ``processed_bytes``: the payload its ``load`` reads. ``debug_handle_map``:
    each handle inside the payload (a kernel, an op) -> the aten nodes it runs.
    ``specs``: the compile specs with what ``load`` needs beside the bytes
    (JSON-serialisable). ``baked``: the region's input positions whose values
    are inside the payload, so that the program need not pass or store them."""

    processed_bytes: bytes
    debug_handle_map: dict[str, list[str]]
    specs: dict[str, Any] = field(default_factory=dict)
    baked: frozenset[int] = frozenset()


def op_handles(gm: torch.fx.GraphModule) -> dict[str, list[str]]:
    """The debug map of a payload that runs the region's aten nodes one by one."""
    return {n.name: [n.name] for n in gm.graph.nodes if n.op == "call_function"}


class Route:
    """Base class of every route. Subclasses set ``name`` and ``devices``."""

    name: str = ""
    devices: frozenset[str] = frozenset()
    #: whether the route may run graphs that take part in autograd
    #: (AOTAutograd forward and backward graphs).
    trains: bool = True
    #: whether a region's outputs may alias its inputs (views returned to the caller).
    keeps_aliases: bool = True
    #: the fewest compute ops a region of this route may have; None: options' min_region_size.
    min_region_size: int | None = None
    #: a wrapping route (cudagraphs) takes whole regions of other routes, not ops.
    wraps: bool = False
    #: why a region of this route cannot run inside a captured CUDA graph (None: it can).
    capture_refusal: str | None = None

    def available(self) -> Availability:
        return Availability(True, torch.__version__)

    def serves_device(self, device: str) -> bool:
        """True where this route can run on ``device``; may look at installed providers."""
        return device in self.devices

    def prepare(self, gm: torch.fx.GraphModule, graph: GraphFacts) -> None:
        """Called once per graph before ``supports``: a route may annotate nodes."""

    def device_reason(self, device: str) -> str:
        """Why ``serves_device(device)`` is False, with what to use instead."""
        served = ", ".join(sorted(self.devices))
        return f"device {device} is not served by {self.name} (it serves {served})"

    def supports(self, node: torch.fx.Node, graph: GraphFacts) -> str | None:
        """None if this route can run ``node``, else the reason it cannot."""
        return None

    def region_reason(self, nodes: Collection[torch.fx.Node]) -> str | None:
        """None if this route can run ``nodes`` as one region, else why not: what no
        single node shows (the region's inputs, once the graph is cut)."""
        return None

    def region_blockers(self, nodes: Collection[torch.fx.Node]) -> Collection[torch.fx.Node]:
        """Of ``nodes``, which ``region_reason`` refuses, those that stop this route:
        handed to their next route, the rest may form regions here. Empty: the
        region goes whole."""
        return ()

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        """A callable taking the region's inputs positionally, returning a tuple."""
        raise NotImplementedError

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        """The region as bytes for a saved program; ``region.example_inputs`` are real."""
        raise NotImplementedError(f"route {self.name!r} cannot save its regions")

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        """The inverse of ``preprocess``: a callable like ``compile``'s, from the bytes."""
        raise NotImplementedError(f"route {self.name!r} cannot load saved regions")

    def __repr__(self) -> str:
        return f"<route {self.name}>"


class WrappingRoute(Route):
    """A route that runs another route's compiled region in a new way (a CUDA
    graph capture) instead of running ops itself."""

    wraps = True

    def supports(self, node: torch.fx.Node, graph: GraphFacts) -> str | None:
        return f"{self.name} wraps whole regions; it runs no op itself"

    def capture_reason(self, gm: torch.fx.GraphModule, inner: Route) -> str | None:
        """None if ``gm``, a region that ``inner`` runs, can be wrapped, else why not."""
        raise NotImplementedError

    def wrap(
        self,
        inner: CompiledFn,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        outputs_survive: bool = True,
    ) -> CompiledFn:
        """``inner`` (the region compiled by its route) wrapped. With
        ``outputs_survive`` an output handed back is never changed by a later call."""
        raise NotImplementedError

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        raise RuntimeError(f"{self.name} wraps another route: use wrap(inner, gm, inputs)")
