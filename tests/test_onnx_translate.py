"""A region's export skips the exporter's decompositions only where they would
change nothing: the model is the exporter's own, and a program they would
change is decomposed as before."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

import onnxruntime as ort

from dispatch.routes import onnx_translate
from dispatch.routes.onnx_registry import exporters_quiet
from dispatch.routes.onnx_translate import decomposed_ops, exporters_own, to_onnx_program
from tests.models import ManyExportedOps


class _SafeSoftmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._safe_softmax(x, -1) * 2


class _InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone().add_(1).relu()


def _aten_region(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> torch.nn.Module:
    """``model`` lowered to aten as AOTAutograd lowers a graph before it is split."""
    return torch.export.export(model.eval(), args, strict=False).run_decompositions().module()


def _graph_bytes(proto) -> bytes:
    """The model with its values named in the order they are made and without the
    nodes' names and metadata (the source lines and module names each trace
    records, and the names it gives values): its ops, their attributes and
    wiring, its weights."""
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        return name and names.setdefault(name, f"v{len(names)}")

    graph = proto.graph
    for value in list(graph.input) + list(graph.initializer):
        value.name = rename(value.name)
    for node in graph.node:
        del node.metadata_props[:]
        node.name = ""
        node.input[:] = [rename(i) for i in node.input]
        node.output[:] = [rename(o) for o in node.output]
    for value in list(graph.output) + list(graph.value_info):
        value.name = rename(value.name)
    return proto.SerializeToString()


@pytest.fixture
def decompositions_run(monkeypatch):
    calls = []
    original = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    return calls


def _run(proto, args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: a.numpy() for n, a in zip(names, args)})


def test_an_aten_region_is_translated_without_decompositions_into_the_exporters_model(decompositions_run):
    args = (torch.randn(2, 3, 8, 8), torch.randn(4, 4))
    region = _aten_region(ManyExportedOps(), args)
    decompositions_run.clear()
    program = torch.export.export(region, args, strict=False)
    assert decomposed_ops(program) == []
    with exporters_quiet():
        skipped = to_onnx_program(program, args).model_proto
    assert decompositions_run == []
    with exporters_quiet():
        expected = exporters_own(torch.export.export(region, args, strict=False), args).model_proto
    assert len(decompositions_run) == 1  # the exporter's own path decomposes
    assert _graph_bytes(skipped) == _graph_bytes(expected)


@pytest.mark.parametrize(
    ("model", "op"),
    [(_SafeSoftmax(), "aten._safe_softmax.default"), (_InPlace(), "aten.add_.Tensor")],
)
def test_a_program_the_decompositions_change_is_decomposed(decompositions_run, model, op):
    x = torch.randn(3, 5)
    x[1] = float("-inf")  # a fully masked row: _safe_softmax gives zeros, softmax NaN
    program = torch.export.export(model, (x,), strict=False)
    assert decomposed_ops(program) == [op]
    with exporters_quiet():
        proto = to_onnx_program(program, (x,)).model_proto
    assert len(decompositions_run) == 1
    (out,) = _run(proto, (x,))
    np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_a_translation_that_fails_without_decompositions_decomposes(decompositions_run, monkeypatch):
    def fails(program):
        raise RuntimeError("a private step moved")

    monkeypatch.setattr(onnx_translate, "_prepared", fails)
    args = (torch.randn(2, 3, 8, 8), torch.randn(4, 4))
    region = _aten_region(ManyExportedOps(), args)
    decompositions_run.clear()
    with exporters_quiet():
        proto = to_onnx_program(torch.export.export(region, args, strict=False), args).model_proto
    assert len(decompositions_run) == 1
    for got, want in zip(_run(proto, args), region(*args)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_prepared_program_whose_translation_fails_is_decomposed(decompositions_run, monkeypatch):
    # The type promotion and assertion removal have already changed the program
    # in place when the translation fails; the exporter's own path takes it so.
    def translation_that_fails():
        def translate(program):
            raise RuntimeError("a private step moved")

        return translate

    monkeypatch.setattr(onnx_translate, "translation", translation_that_fails)
    prepared = []
    real_prepared = onnx_translate._prepared
    monkeypatch.setattr(onnx_translate, "_prepared", lambda p: prepared.append(p) or real_prepared(p))
    args = (torch.randn(2, 3, 8, 8), torch.randn(4, 4))
    region = _aten_region(ManyExportedOps(), args)
    decompositions_run.clear()
    with exporters_quiet():
        proto = to_onnx_program(torch.export.export(region, args, strict=False), args).model_proto
    assert len(prepared) == 1 and len(decompositions_run) == 1
    for got, want in zip(_run(proto, args), region(*args)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)
