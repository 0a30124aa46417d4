"""The ``onnxrt`` route: ONNX export of the region, run by an ONNX Runtime session.

The region's aten graph goes through ``torch.onnx.export`` (the dynamo
exporter; symbolic dimensions become dynamic axes, one export for all shapes);
the graph, with its weights handed over beside it (``onnx_model.py``), is
loaded into an ``InferenceSession`` on
``CPUExecutionProvider``, or ``CUDAExecutionProvider`` where onnxruntime-gpu is
installed and the region is on CUDA. On every device IO binding points ORT at
torch's input buffers, and ORT's outputs come back through DLPack, so no tensor
is copied or converted through numpy.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..cache import current_cache, region_key, tensors_digest
from ..inspect import (
    GraphFacts,
    first_device,
    has_unbacked_size,
    is_size_arithmetic,
    marked_static_positions,
    tensor_values,
)
from .baked_weights import BakedRegion
from .base import (
    Availability,
    CompiledFn,
    PreprocessResult,
    RegionProgram,
    Route,
    install_hint,
    op_handles,
)
from .onnx_export import export_region, fed_positions, reading_sizes_without_tensor, size_without_tensor
from .onnx_guards import ShapeClasses
from .onnx_model import OnnxModel
from .onnx_on_torch import TorchWhereNaN, refusing_other_shapes, run_by_torch
from .onnx_ops import export_opset, not_as_in_torch, translatable, untranslatable_decomposition
from .onnx_outputs import checked_against_torch, in_traced_layout, output_values
from .onnx_rebake import Rebake
from .onnx_rewrites import sorts_in_onnx_runtime_order
from .onnx_session import threaded_session
from .onnx_threads import ONE, POOL, thread_plan
from .registry import registry

log = logging.getLogger("dispatch")

_NO_NUMPY_DTYPE = (torch.bfloat16, torch.complex32)
# Measured, benchmarks/README.md ("float64 on CPU").
_FLOAT64_REASON = (
    "dtype torch.float64 stays off onnxrt: ONNX Runtime's CPU provider has no float64 Conv, pooling, "
    "Erf or GELU (a region holding one failed whole), and ran a float64 SiLU MLP 3.2x slower than eager"
)
_ENTRY_FORMAT = "graph+initializers"  # cache entries of the format of onnx_model.py
# How the exported model gives torch's result where an op passes over NaN
# (onnx_nan.py): computed in the model, or flagged and run again by torch.
_NAN_IN_MODEL, _NAN_FLAGGED = "nan-in-model", "nan-flagged"


@registry.register
class OnnxRoute(Route):
    name = "onnxrt"
    devices = frozenset({"cpu", "cuda"})
    trains = False
    keeps_aliases = False
    capture_refusal = "ONNX Runtime's CUDA provider runs on its own stream, so a torch CUDA graph would record none of its work"

    def available(self) -> Availability:
        missing = []
        for module in ("onnxruntime", "onnx", "onnxscript"):
            # Found, not imported: onnx and onnxscript are needed only to export,
            # and a warm start that loads its models from the cache never does.
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                missing.append(f"{module} (No module named {module!r})")
        if missing:
            return Availability(
                False, None, "not installed: " + ", ".join(missing) + f"; {install_hint('onnx')}"
            )
        import onnxruntime

        return Availability(True, onnxruntime.__version__)

    def serves_device(self, device: str) -> bool:
        if device == "cpu":
            return True
        if device == "cuda":
            return "CUDAExecutionProvider" in _providers()
        return False

    def device_reason(self, device: str) -> str:
        if device == "cuda":
            return "device cuda needs onnxruntime-gpu (CUDAExecutionProvider is not installed)"
        return f"device {device} is not served by onnxrt (cpu, cuda with onnxruntime-gpu)"

    def supports(self, node: torch.fx.Node, graph: GraphFacts) -> str | None:
        if has_unbacked_size(node):
            return "data-dependent shape: ONNX export needs sizes known from the inputs' shapes"
        if is_size_arithmetic(node):
            return None  # exported as ONNX shape ops; symbolic dims become dynamic axes
        if not translatable(node.target):
            return f"the ONNX exporter cannot translate {node.target}"
        unlike = not_as_in_torch(node)
        if unlike:
            return unlike
        # Inputs too: an op that takes a complex tensor and returns a real one
        # (irfft) would give its region a complex input, which ORT cannot bind.
        for t in [*tensor_values(node), *(t for a in node.all_input_nodes for t in tensor_values(a))]:
            if t.dtype in _NO_NUMPY_DTYPE or t.is_complex():
                return f"dtype {t.dtype} is not run by onnxrt here"
            if t.dtype == torch.float64:
                return _FLOAT64_REASON
            if t.is_sparse or t.layout != torch.strided:
                return f"layout {t.layout} is not exported to ONNX"
        missing = untranslatable_decomposition(node)
        if missing:
            return (
                f"the ONNX exporter decomposes {node.target} into {', '.join(missing)}, "
                "which it cannot translate"
            )
        return None

    def region_reason(self, nodes: Collection[torch.fx.Node]) -> str | None:
        return size_without_tensor(nodes)

    def region_blockers(self, nodes: Collection[torch.fx.Node]) -> Collection[torch.fx.Node]:
        return reading_sizes_without_tensor(nodes)

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        sorts_in_onnx_runtime_order(gm)
        weights = marked_static_positions(gm)
        region = BakedRegion(
            example_inputs,
            weights,
            functools.partial(_session_runner, gm, {}),
            checked=not weights_frozen_by_user(),
        )
        return checked_against_torch(region, gm, example_inputs, weights)

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        """The ONNX model with the region's parameters and buffers baked in as
        initializers (the payload of ``OnnxModel.parts``: graph, then raw arrays)."""
        gm, args = region.gm, region.example_inputs
        assert args is not None, "preprocess needs the region's real inputs"
        sorts_in_onnx_runtime_order(gm)
        frozen = frozenset(marked_static_positions(gm))
        model = _cached_export(gm, args, frozen)
        threads = thread_plan(gm, args)
        specs = {
            **compile_specs,
            "device": str(first_device(args)),
            "small": threads == ONE,  # for a dispatch that predates "threads"
            "threads": threads,
            "fed": fed_positions(args, frozen),
            "bools": _bool_outputs(gm),
            "guards": list(model.guards),
        }
        return PreprocessResult(b"".join(model.parts()), op_handles(gm), specs, frozen)

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        model = OnnxModel.from_payload(processed_bytes)
        sorts_in_onnx_runtime_order(region.gm)
        count = len(output_values(region.gm))
        device = torch.device(specs["device"])
        threads = str(specs.get("threads") or (ONE if specs["small"] else POOL))
        fed = list(specs["fed"])
        run = in_traced_layout(
            threaded_session(model, device, threads, fed, list(specs["bools"]), count), region.gm
        )
        if specs.get("guards"):
            run = refusing_other_shapes(run, tuple(specs["guards"]))
        if region.example_inputs is not None:
            # Lowering: the first call is checked against torch, as under torch.compile.
            args = region.example_inputs
            run = checked_against_torch(run, region.gm, args, [i for i in range(len(args)) if i not in fed])
        return run


def weights_frozen_by_user() -> bool:
    """Whether inductor's ``freezing`` is on (``TORCHINDUCTOR_FREEZING=1`` sets it):
    the user's promise that weights do not change after compiling."""
    from torch._inductor import config  # Dynamo imported it before any backend ran

    return bool(config.freezing)


def _cached_export(
    gm: torch.fx.GraphModule,
    args: Sequence[Any],
    frozen: frozenset[int],
    flag_nan: bool = False,
    by_shape: bool = False,
    exports: Exports | None = None,
) -> OnnxModel:
    """The region's ONNX model, from the persistent cache when an earlier process
    exported the same region with the same baked weights; ``by_shape``: one for
    the shapes of ``args`` (``onnx_guards.py``), kept apart from the others;
    ``exports``: the region's earlier exports, whose programs bake another set
    of weights without exporting again (``onnx_rebake.py``)."""
    shapes = [list(args[i].shape) for i in fed_positions(args, frozen)] if by_shape else None
    cache = current_cache()
    key = None
    if cache is not None:
        key = region_key(
            gm,
            "onnxrt",
            _ENTRY_FORMAT,
            _NAN_FLAGGED if flag_nan else _NAN_IN_MODEL,
            shapes,
            export_opset(),
            sorted(frozen),
            tensors_digest(args[i] for i in sorted(frozen)),
        )
        payload = cache.get("onnx", key)
        if payload is not None:
            return OnnxModel.from_payload(payload)
    kind = (flag_nan, frozen, str(shapes))
    earlier = exports.get(kind) if exports is not None else None
    model = earlier.model(args) if earlier is not None else None
    if model is None:
        model = export_region(gm, args, frozen, flag_nan=flag_nan)
        if exports is not None and model.for_other_weights is not None:
            exports[kind] = model.for_other_weights
    if cache is not None and key is not None:
        cache.put_parts("onnx", key, model.parts())
    return model


# A region's exports by what they were made for (NaN flagged, baked positions,
# shapes where one export serves one class of shapes): ``_cached_export``.
Exports = dict[tuple[bool, frozenset[int], str], Rebake]


def _session_runner(
    gm: torch.fx.GraphModule, exports: Exports, args: Sequence[Any], frozen: frozenset[int]
) -> CompiledFn:
    """The region's session; where its export holds only for some shapes, one
    session per class of shapes (``onnx_guards.py``)."""
    run, guards = _model_runner(gm, args, frozen, exports)
    if not guards:
        return run
    weights = sorted(frozen)

    def for_shapes(call: Sequence[Any]) -> tuple[CompiledFn, tuple[str, ...]]:
        again, held = _model_runner(gm, call, frozen, exports, by_shape=True)
        return checked_against_torch(again, gm, call, weights), held

    return ShapeClasses(run, guards, for_shapes, functools.partial(run_by_torch, gm))


def _model_runner(
    gm: torch.fx.GraphModule,
    args: Sequence[Any],
    frozen: frozenset[int],
    exports: Exports,
    by_shape: bool = False,
) -> tuple[CompiledFn, tuple[str, ...]]:
    """A session of the region exported from ``args``, and the guards it holds under.
    On CPU its ops that pass over NaN are flagged, not corrected in the model
    (``onnx_nan.py``): every call brings the region's inputs, weights included,
    so torch can run the one whose flag is up. On CUDA reading the flag would
    wait for the device on every call."""
    device = first_device(args)
    model = _cached_export(
        gm, args, frozen, flag_nan=device.type == "cpu", by_shape=by_shape, exports=exports
    )
    count = len(output_values(gm))
    flagged = model.flags_nan
    run = threaded_session(
        model,
        device,
        thread_plan(gm, args),
        fed_positions(args, frozen),
        [*_bool_outputs(gm), *([count] if flagged else [])],
        count + flagged,
    )
    if flagged:
        return TorchWhereNaN(run, gm), model.guards
    return in_traced_layout(run, gm), model.guards


def _bool_outputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the region's boolean outputs."""
    return [k for k, v in enumerate(output_values(gm)) if getattr(v, "dtype", None) == torch.bool]


def _providers() -> list[str]:
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())
