import pytest
import torch

import dispatch
from dispatch.decompositions import transformer_encoder_layer_fwd


def _fast_path_args(layer: torch.nn.TransformerEncoderLayer, x: torch.Tensor) -> tuple:
    attn = layer.self_attn
    return (
        x,
        attn.embed_dim,
        attn.num_heads,
        attn.in_proj_weight,
        attn.in_proj_bias,
        attn.out_proj.weight,
        attn.out_proj.bias,
        layer.activation_relu_or_gelu == 2,
        layer.norm_first,
        layer.norm1.eps,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
    )


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_decomposition_equals_the_fused_fast_path(activation, norm_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        32, 4, 64, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    x = torch.randn(3, 7, 32)
    args = _fast_path_args(layer, x)
    fused = torch._transformer_encoder_layer_fwd(*args)
    torch.testing.assert_close(transformer_encoder_layer_fwd(*args), fused, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x), fused)  # the module itself takes the fast path here


def test_masked_input_is_left_to_the_fused_op():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    x = torch.randn(1, 3, 8)
    args = _fast_path_args(layer, x)
    assert transformer_encoder_layer_fwd(*args, mask=torch.zeros(3, 3, dtype=torch.bool)) is NotImplemented


@torch.no_grad()
def test_transformer_layer_runs_on_onnxrt():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    x = torch.randn(2, 5, 32)
    explanation = dispatch.explain(layer, x)
    assert [r.route for r in explanation.regions] == ["onnxrt"]
    assert "aten._transformer_encoder_layer_fwd.default" not in explanation.regions[0].ops
    torch.testing.assert_close(torch.compile(layer, backend="auto")(x), layer(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_fused_op_is_kept_when_onnxrt_is_not_allowed():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    x = torch.randn(2, 5, 32)
    explanation = dispatch.explain(layer, x, options={"routes": ["eager"]})
    assert explanation.regions[0].ops == ("aten._transformer_encoder_layer_fwd.default",)
