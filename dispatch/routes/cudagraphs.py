"""The ``cudagraphs`` route: capture a CUDA region once, replay it on every call.

It does not run ops itself: it wraps the route that runs the region (eager,
triton or inductor) in a CUDA graph, which removes the per-kernel launch cost
of small, launch-bound regions. Capture safety is checked with torch's own
checks (``torch._dynamo.backends.cudagraphs.check_for_skip``: no input
mutation, one CUDA device and no CPU tensor, no op that is unsafe to capture)
plus one of ours, static shapes; capture and replay use torch's CUDA graph
trees (``cudagraphify_impl``), as ``mode="reduce-overhead"`` does.

Outputs: as with CUDA graph trees, an output of a captured region lives in
memory that the next replay of the same graph overwrites. Use it (or
``.clone()`` it) before calling the compiled model again; torch raises a clear
error if an overwritten output is read. ``torch.compiler.cudagraph_mark_step_begin()``
marks where a new iteration starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_STATIC, GraphFacts, first_device, is_symbolic, tensor_values
from .base import Availability, CompiledFn, Route
from .registry import registry


@registry.register
class CudaGraphsRoute(Route):
    name = "cudagraphs"
    devices = frozenset({"cuda"})
    trains = False
    wraps = True  # wraps another route's region instead of running ops itself

    def available(self) -> Availability:
        if torch.cuda.is_available():
            return Availability(True, torch.version.cuda)
        # The hardware is implied by the tensors: cuda tensors mean CUDA is there.
        return Availability(
            True, torch.version.cuda or "-", "no CUDA device on this machine: applies to cuda tensors only"
        )

    def supports(self, node: torch.fx.Node, graph: GraphFacts) -> str | None:
        return "cudagraphs wraps whole regions; it runs no op itself"

    def capture_reason(self, gm: torch.fx.GraphModule) -> str | None:
        """None if ``gm`` (a region) is safe to capture, else why not."""
        from torch._dynamo.backends.cudagraphs import check_for_skip

        for node in gm.graph.nodes:
            if is_symbolic(node):
                return f"dynamic shape at {node.name}: a CUDA graph replays one static shape"
        devices = {t.device for n in gm.graph.nodes for t in tensor_values(n)}
        if any(d.type != "cuda" for d in devices):
            cpu = next(
                n.name for n in gm.graph.nodes if any(t.device.type != "cuda" for t in tensor_values(n))
            )
            return f"holds a non-CUDA tensor ({cpu}): a CUDA graph captures CUDA work only"
        if len(devices) > 1:
            return f"spans several CUDA devices ({', '.join(sorted(map(str, devices)))})"
        skip = check_for_skip(gm, 0)
        return skip.removeprefix("skipping cudagraphs due to ") if skip else None

    def wrap(self, inner: CompiledFn, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        """``inner`` (the region compiled by its route) captured with CUDA graph trees."""
        from torch._inductor.cudagraph_trees import cudagraphify_impl
        from torch._inductor.cudagraph_utils import get_placeholder_info

        placeholders = gm.graph.find_nodes(op="placeholder")
        static = [i for i, p in enumerate(placeholders) if p.meta.get(META_STATIC)]
        device = first_device(example_inputs)

        def boxed(inputs: list[Any]) -> Any:
            return list(inner(*inputs))

        boxed._boxed_call = True  # type: ignore[attr-defined]
        captured = cudagraphify_impl(
            boxed,
            list(example_inputs),
            static,
            device_index=device.index or 0,
            is_backward=False,
            is_inference=True,
            stack_traces=[None] * len(_outputs(gm)),
            placeholders=get_placeholder_info(gm.graph),
            mutated_input_idxs=(),
        )
        return _unboxed(captured)

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        raise RuntimeError("cudagraphs wraps another route: use wrap(inner, gm, inputs)")


def _unboxed(captured: Callable[[list[Any]], Any]) -> CompiledFn:
    def run(*args: Any) -> tuple[Any, ...]:
        return tuple(captured(list(args)))

    return run


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    (out,) = gm.graph.find_nodes(op="output")
    return list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
