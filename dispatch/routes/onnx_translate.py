"""The ONNX exporter's steps after ``torch.export``, its decompositions run only
where they would change the program.

The exporter decomposes every program it is given: ``run_decompositions`` with
its ONNX-friendly table (torch's decompositions, less the ops torchlib
translates) traces the whole program again through AOTAutograd's dispatch. A
region is an aten graph AOTAutograd has lowered already, and in most regions no
op is one that table rewrites: the trace then returns the program it was
given, at a cost of 0.3 to 1.5 s a region: half an export or more
(hf_mixtral's five regions: 4.6 s of 8.6; timm_mobilenetv3's export took
4.07 s with them and 1.82 s without). Such a program goes straight to
translation. One holding an op the table rewrites (the ``_safe_softmax`` of an
attention in training mode), a mutating op or a higher-order op is decomposed
as the exporter decomposes it, and so is one whose translation fails without.
The models are the exporter's own, node for node, but for the names the trace
gives some values (``tests/test_onnx_translate.py``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from .onnx_ops import decomposition_table
from .onnx_registry import export_opset, onnx_registry

log = logging.getLogger("dispatch")


def to_onnx_program(program: torch.export.ExportedProgram, args: tuple[Any, ...]) -> Any:
    """The exporter's ``ONNXProgram`` of ``program`` (traced from ``args``) at
    ``export_opset()``, optimized; its decompositions skipped where
    ``decomposed_ops`` finds nothing for them to do."""
    translate = translation()
    if translate is not None and not decomposed_ops(program):
        try:
            return translate(_prepared(program))
        except Exception as error:  # the exporter's private steps: its own entry is the way that holds
            log.debug("onnxrt: translation without decompositions failed (%s); decomposing", error)
    return exporters_own(program, args)


def exporters_own(program: torch.export.ExportedProgram, args: tuple[Any, ...]) -> Any:
    """The exporter's ``ONNXProgram`` of ``program`` as ``torch.onnx.export`` makes it,
    decompositions included, with the registry built once per process (the public
    function builds one on every call; it is the way where the private one moved)."""
    try:
        from torch.onnx._internal.exporter import _core as core
    except ImportError:
        core = None  # type: ignore[assignment]
    if core is not None:
        try:
            return core.export(
                program,
                args,
                None,
                registry=onnx_registry(),
                optimize=True,
                verbose=False,
                report=False,
                opset_version=export_opset(),
            )
        except TypeError:
            pass  # the private signature moved
    return torch.onnx.export(
        program, args, dynamo=True, optimize=True, verbose=False, report=False, opset_version=export_opset()
    )


def decomposed_ops(program: torch.export.ExportedProgram) -> list[str]:
    """The ops of ``program`` that the exporter's decompositions would rewrite: ops
    in its table, ops that mutate an argument, higher-order ops (whose bodies are
    graphs of their own). Every op where the table cannot be had."""
    table = _decomposition_table()
    ops = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        schema = getattr(target, "_schema", None)
        if (
            table is None
            or target in table
            or isinstance(target, torch._ops.HigherOrderOperator)
            or (schema is not None and schema.is_mutable)
        ):
            ops.append(str(target))
    return ops


@functools.cache
def _decomposition_table() -> dict[Any, Any] | None:
    """The exporter's table for the registry regions are exported with
    (``onnx_ops.decomposition_table``, built once per process), or None where
    its private names moved."""
    try:
        return decomposition_table()[1]
    except (ImportError, AttributeError):
        return None


def _prepared(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with the exporter's passes after its decompositions: explicit
    type promotion, assertions removed (``_prepare_exported_program_for_export``
    less ``decompose_with_registry``)."""
    from torch.fx.experimental import _config as fx_config
    from torch.onnx._internal.exporter import _fx_passes

    with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        module = program.graph_module
        _fx_passes.insert_type_promotion_nodes(module)
        module = _fx_passes.remove_assertion_nodes(module)
        program._graph_module = module
    return program


def translation() -> Callable[[Any], Any] | None:
    """The exporter's steps after decomposition, as ``torch.onnx.export`` runs them
    for ``to_onnx_program``'s call (translation, opset conversion, optimizer),
    returning the ``ONNXProgram``; None where torch's private names moved."""
    try:
        from torch.onnx._internal.exporter import _core as core
    except ImportError:
        return None
    to_onnx = getattr(core, "_exported_program_to_onnx_program", None)
    apis = getattr(core, "onnxscript_apis", None)
    if to_onnx is None or apis is None:
        return None

    def translate(program: Any) -> Any:
        onnx_program = to_onnx(program, registry=onnx_registry())
        onnx_program.model = apis.convert_version(onnx_program.model, export_opset())
        onnx_program.optimize()
        return onnx_program

    return translate
