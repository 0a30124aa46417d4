"""Rewrites that let ONNX Runtime fuse what torchlib's translation hid: an RMS norm
reaches ORT as the pattern its optimizer fuses, and computes what torch does."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dispatch
from dispatch.routes.onnx_fusions import fusible_for_onnx_runtime

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
aten = torch.ops.aten


def rms_norm(x, w):  # as LLaMA, Mistral and T5 write it
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + 1e-6))


def optimized_op_types(model, tmp_path) -> list[str]:
    """The op types of ``model`` after ORT's own graph optimizer, at the level the route uses."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.graph, model.session_options(options), providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def run_session(model, *feeds):
    session = ort.InferenceSession(
        model.graph, model.session_options(ort.SessionOptions()), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, (f.numpy() for f in feeds), strict=True)))


def test_an_rms_norm_reaches_onnx_runtime_as_the_pattern_it_fuses(tmp_path):
    from dispatch.routes.onnx_export import export_region

    x, w = torch.randn(4, 16, 64), torch.randn(64)
    model = export_region(make_fx(rms_norm)(x, w), [x, w], frozen=frozenset({1}))
    ops = optimized_op_types(model, tmp_path)
    assert "SimplifiedLayerNormalization" in ops
    assert "Reciprocal" not in ops
    (out,) = run_session(model, x)
    torch.testing.assert_close(torch.from_numpy(out), rms_norm(x, w))


def test_an_rsqrt_of_anything_else_is_left_as_it_is():
    def scaled(x, v):  # a product with rsqrt, but no mean of squares under it
        return x * torch.rsqrt(v + 1.0)

    gm = make_fx(scaled)(torch.randn(4, 8), torch.rand(4, 1))
    fusible_for_onnx_runtime(gm.graph)
    assert gm.graph.find_nodes(op="call_function", target=aten.rsqrt.default)
    assert not gm.graph.find_nodes(op="call_function", target=aten.div.Tensor)


def test_an_rsqrt_with_other_users_keeps_them_and_the_norm_still_divides():
    def norm_and_scale(x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x * r, r * 3.0

    x = torch.randn(2, 5, 32)
    gm = make_fx(norm_and_scale)(x)
    fusible_for_onnx_runtime(gm.graph)
    gm.recompile()
    assert len(gm.graph.find_nodes(op="call_function", target=aten.div.Tensor)) == 1
    assert len(gm.graph.find_nodes(op="call_function", target=aten.rsqrt.default)) == 1
    for got, want in zip(gm(x), norm_and_scale(x), strict=True):
        torch.testing.assert_close(got, want)


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))

    def forward(self, x):
        return rms_norm(x, self.weight)


@torch.no_grad()
def test_auto_runs_an_rms_norm_on_onnx_runtime_as_eager_computes_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), RMSNorm(64), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(3, 7, 32)
    explanation = dispatch.explain(model, x)
    (norm,) = [r for r in explanation.regions if "aten.rsqrt.default" in r.ops]
    assert norm.route == "onnxrt"
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))
