"""The exporter's registry that the onnxrt route builds once per process holds
torchlib's functions as ``ONNXRegistry.from_torchlib`` does, infers a function's
signature only when an export dispatches to it, and exports the same bytes."""

import pytest
import torch

pytest.importorskip("onnxscript")

from torch.onnx._internal.exporter import _core
from torch.onnx._internal.exporter._registration import ONNXRegistry

from dispatch.routes.onnx_registry import (
    deferred_registry,
    export_opset,
    exporters_quiet,
    onnx_registry,
)
from tests.models import ManyExportedOps


@pytest.fixture(scope="module")
def full_registry() -> ONNXRegistry:
    with exporters_quiet():
        return ONNXRegistry.from_torchlib(opset_version=export_opset())


def test_the_route_builds_the_deferred_registry():
    # Where torch's private names moved, onnx_registry() falls back to the full
    # build: correct, but 1.7 s slower on every cold start.
    assert type(onnx_registry()).__name__ == "DeferredRegistry"


def test_deferred_registry_holds_the_functions_from_torchlib_holds(full_registry):
    deferred = deferred_registry(export_opset())
    assert deferred.opset_version == full_registry.opset_version
    assert set(deferred.functions) == set(full_registry.functions)
    for name, metas in full_registry.functions.items():
        found = deferred.functions[name]
        assert [(m.onnx_function, m.fx_target, m.is_complex, m.opset_introduced) for m in found] == [
            (m.onnx_function, m.fx_target, m.is_complex, m.opset_introduced) for m in metas
        ], name


def test_a_signature_is_inferred_when_the_exporter_first_asks():
    deferred = deferred_registry(export_opset())
    topk = torch.ops.aten.topk.default
    assert [m.signature for m in deferred.functions[topk.name()]] == [None]
    metas = deferred.get_decomps(topk)
    assert len(metas) == 1
    assert [p.name for p in metas[0].signature.params][:2] == ["self", "k"]


def test_exports_the_same_model_as_the_full_registry(full_registry):
    model = ManyExportedOps().eval()
    args = (torch.randn(2, 3, 8, 8), torch.randn(4, 4))
    exported = []
    for registry in (full_registry, deferred_registry(export_opset())):
        program = torch.export.export(model, args, strict=False)
        with exporters_quiet():
            onnx = _core.export(
                program,
                args,
                None,
                registry=registry,
                optimize=True,
                verbose=False,
                report=False,
                opset_version=export_opset(),
            )
        exported.append(onnx.model_proto.SerializeToString())
    assert exported[0] == exported[1]
