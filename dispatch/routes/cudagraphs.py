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

from ..inspect import META_VAL, first_device, is_symbolic, marked_static_positions, tensor_values
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
        return _Captured(_boxed(inner), gm, options, outputs_survive)

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
        self,
        boxed: Callable[[list[Any]], list[Any]],
        gm: torch.fx.GraphModule,
        options: dict[str, Any],
        outputs_survive: bool,
    ) -> None:
        self.boxed = boxed
        self.options = options
        self.outputs_survive = outputs_survive
        self.pool_outputs = PoolOutputs(gm)
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
        if not self.outputs_survive:
            return tuple(captured(list(args)))
        return tuple(self.pool_outputs.survive(captured, list(args)))


class PoolOutputs:
    """Copies out of a CUDA graph's memory pool the outputs that live there, so
    that the next replay cannot overwrite what the caller holds. An output that
    is (a view of) an input is not the pool's and is handed back as it is.

    Which outputs alias inputs is read once from the graph's fake values
    (aliasing is a property of the graph): scanning every input's storage on
    each call cost 55-70 µs on a 200 µs BERT replay on an H200, 1.3-1.5x
    ``mode="reduce-overhead"`` (``benchmarks/results/zoo-cuda-*-20261126-*``). A
    graph without fake values (``symbolic_trace``) is scanned call by call."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.aliased = outputs_aliasing_inputs(gm)

    def survive(self, run: Callable[[list[Any]], Any], args: list[Any]) -> list[Any]:
        """``run(args)`` (which may empty ``args``) with its pool outputs copied out."""
        if self.aliased is None:
            held = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            outputs = list(run(args))
            pooled = [
                i
                for i, o in enumerate(outputs)
                if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in held
            ]
        else:
            outputs = list(run(args))
            pooled = [
                i for i, o in enumerate(outputs) if i not in self.aliased and isinstance(o, torch.Tensor)
            ]
        for i, copy in zip(pooled, copied([outputs[i] for i in pooled])):
            outputs[i] = copy
        return outputs


def copied(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors``, in their strides, made by one call where there are
    several: ``_foreach_clone`` allocates and copies them all in C++ with one launch.
    A small model's replay is bound by host time: on an H200, auto's copy of five
    outputs (hf_llama's hidden state and cache) was most of its 50 µs a call over
    ``mode="reduce-overhead"``, ``empty_like`` from Python about 5 µs of it each."""
    if len(tensors) < 2:
        return [t.clone() for t in tensors]
    foreach_clone = getattr(torch, "_foreach_clone", None)
    if foreach_clone is not None:
        return list(foreach_clone(tensors))
    copies = [torch.empty_like(t) for t in tensors]  # a torch without _foreach_clone
    torch._foreach_copy_(copies, tensors)
    return copies


def outputs_aliasing_inputs(gm: torch.fx.GraphModule) -> frozenset[int] | None:
    """Positions of ``gm``'s outputs that share storage with one of its inputs, read
    from the fake values its nodes carry; None where a value is missing."""
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = set()
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get(META_VAL)
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            inputs.add(StorageWeakRef(value.untyped_storage()))
    aliased = set()
    for i, out in enumerate(_outputs(gm)):
        if not isinstance(out, torch.fx.Node):
            continue
        value = out.meta.get(META_VAL)
        if value is None:
            return None
        if isinstance(value, torch.Tensor) and StorageWeakRef(value.untyped_storage()) in inputs:
            aliased.add(i)
    return frozenset(aliased)


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    (out,) = gm.graph.find_nodes(op="output")
    return list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
