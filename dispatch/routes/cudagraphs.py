"""The ``cudagraphs`` route: capture a CUDA region once, replay it on every call.

It does not run ops itself: it wraps the route that runs the region (eager,
triton or inductor) in a CUDA graph, which removes the per-kernel launch cost
of small, launch-bound regions. Capture safety is checked with torch's own
checks (``torch._dynamo.backends.cudagraphs.check_for_skip``: no input
mutation, one CUDA device and no CPU tensor, no op that is unsafe to capture)
plus ours: static shapes, and an inner route whose work runs on torch's
stream (ONNX Runtime's CUDA provider runs on its own, so a capture would
record none of its work). Capture and replay use torch's CUDA graph trees
(``cudagraphify_impl``), as ``mode="reduce-overhead"`` does, under their
calling convention: the wrapped function takes its inputs as a list and
empties it, so that the trees can free inputs they no longer need.

Outputs: by default every output that lives in the graph's memory pool is
copied out on each call, so an output the user holds survives later calls, as
on every other route. With the reduce-overhead contract
(``options={"reduce_overhead": True}`` or ``DISPATCH_REDUCE_OVERHEAD=1``) the
copy is skipped and, as under ``mode="reduce-overhead"``, an output is valid
until the next call of the same graph (clone what you keep; torch raises a
clear error if an overwritten output is read).

Threads: CUDA graph trees keep one tree (and memory pool) per thread, so each
thread that calls a region captures it for itself.

Saved programs: the payload is the inner route's (``compile_specs["inner"]``);
the capture happens on the loaded program's first call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import first_device, is_symbolic, marked_static_positions, tensor_values
from .base import Availability, CompiledFn, PreprocessResult, RegionProgram, Route, WrappingRoute
from .registry import registry


@registry.register
class CudaGraphsRoute(WrappingRoute):
    name = "cudagraphs"
    devices = frozenset({"cuda"})
    trains = False

    def available(self) -> Availability:
        if torch.cuda.is_available():
            return Availability(True, torch.version.cuda)
        # Not available here; a plan on fake cuda tensors still shows where a
        # CUDA machine would capture (the planner does not ask this).
        return Availability(
            False, torch.version.cuda, "no CUDA device on this machine (plans on cuda tensors still show it)"
        )

    def capture_reason(self, gm: torch.fx.GraphModule, inner: Route) -> str | None:
        """None if ``gm`` (a region that ``inner`` runs) is safe to capture, else why not."""
        from torch._dynamo.backends.cudagraphs import check_for_skip

        if inner.capture_refusal is not None:
            return f"its route {inner.name}: {inner.capture_refusal}"
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

    def wrap(
        self,
        inner: CompiledFn,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        outputs_survive: bool = True,
    ) -> CompiledFn:
        """``inner`` (the region compiled by its route) captured with CUDA graph trees."""
        from torch._inductor.cudagraph_utils import get_placeholder_info

        static = marked_static_positions(gm)
        device = first_device(example_inputs)
        options = {
            "static_input_idxs": static,
            "device_index": device.index or 0,  # a real CUDA tensor always has its index
            "stack_traces": [None] * len(_outputs(gm)),
            "placeholders": get_placeholder_info(gm.graph),
        }
        return _Captured(_boxed(inner), options, outputs_survive)

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        return registry.get(compile_specs["inner"]).preprocess(region, compile_specs)

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        inner = registry.get(specs["inner"]).load(processed_bytes, region, specs)
        device = [torch.empty(0, device=specs["device"])]
        return self.wrap(inner, region.gm, device, outputs_survive=bool(specs.get("outputs_survive", True)))


def _boxed(inner: CompiledFn) -> Callable[[list[Any]], list[Any]]:
    """``inner`` under the trees' calling convention: one list of inputs, emptied
    before the work runs (the trees assert it is empty afterwards)."""

    def boxed(inputs: list[Any]) -> list[Any]:
        args = list(inputs)
        inputs.clear()
        return list(inner(*args))

    boxed._boxed_call = True  # type: ignore[attr-defined]
    return boxed


class _Captured:
    """A region captured once per calling thread; outputs copied out unless the
    reduce-overhead contract was chosen."""

    def __init__(
        self, boxed: Callable[[list[Any]], list[Any]], options: dict[str, Any], outputs_survive: bool
    ) -> None:
        self.boxed = boxed
        self.options = options
        self.outputs_survive = outputs_survive
        self._local = threading.local()

    def _capture(self, args: Sequence[Any]) -> Callable[[list[Any]], Any]:
        from torch._inductor.cudagraph_trees import cudagraphify_impl

        options = self.options
        return cudagraphify_impl(
            self.boxed,
            list(args),
            options["static_input_idxs"],
            device_index=options["device_index"],
            is_backward=False,
            is_inference=True,
            stack_traces=options["stack_traces"],
            placeholders=options["placeholders"],
            mutated_input_idxs=(),
        )

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        captured = getattr(self._local, "captured", None)
        if captured is None:
            captured = self._local.captured = self._capture(args)
        outputs = captured(list(args))
        if not self.outputs_survive:
            return tuple(outputs)
        held = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        return tuple(copied_out(o, held) for o in outputs)


def copied_out(output: Any, inputs: set[int]) -> Any:
    """A copy of an output that lives in the graph's pool; an output that is (a
    view of) an input is not the pool's and is handed back as it is."""
    if not isinstance(output, torch.Tensor) or output.untyped_storage().data_ptr() in inputs:
        return output
    return output.clone()


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    (out,) = gm.graph.find_nodes(op="output")
    return list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
