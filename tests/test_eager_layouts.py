"""A lowered graph that torch's own kernels can run op by op
(``dispatch/eager_layouts.py``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dispatch.eager_layouts import batch_norm_outputs_in_traced_order, group_norm_inputs_in_traced_layout
from dispatch.stitch import FallbackWarning


class AttentionThenGroupNorm(torch.nn.Module):
    """diffusers' VAE attention block in small: a feature map viewed as tokens,
    projected, viewed back (channels_last now) and group-normalized."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.GroupNorm(4, 16)

    def forward(self, x):
        h = self.conv(x)
        b, c, height, width = h.shape
        tokens = self.proj(h.view(b, c, height * width).transpose(1, 2))
        return self.norm(tokens.transpose(1, 2).reshape(b, c, height, width) + h)


@pytest.mark.parametrize("batch", [1, 2])
@torch.no_grad()
def test_a_channels_last_group_norm_input_of_a_batch_of_one_runs(batch):
    """At a batch of one, eager gives the viewed-back map another batch stride than
    the traced graph, native_group_norm then judged it not channels_last and
    raised: in ORT's first-call check, then in the eager fallback (diffusers'
    AutoencoderKL failed on auto's first call; torch's aot_eager fails alike)."""
    model, x = AttentionThenGroupNorm().eval(), torch.randn(batch, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


@pytest.mark.parametrize("batch, clones", [(1, 1), (2, 0)])
def test_only_a_channels_last_group_norm_input_with_a_size_one_dim_is_cloned(batch, clones):
    """Cloned once into the traced layout (a second pass adds nothing); a batch of
    two keeps its strides however eager computes them, and is left alone."""
    model = AttentionThenGroupNorm().eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        gm = make_fx(lambda p, x: torch.func.functional_call(model, p, (x,)), tracing_mode="fake")(
            params, torch.randn(batch, 3, 8, 8)
        )
    assert group_norm_inputs_in_traced_layout(gm) == clones
    assert group_norm_inputs_in_traced_layout(gm) == 0
    (norm,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.native_group_norm.default)
    source = norm.args[0]
    if clones:
        assert source.target is torch.ops.aten.clone.default
        assert source.kwargs == {"memory_format": torch.channels_last}
    else:
        assert source.target is torch.ops.aten.add.Tensor
    x = torch.randn(batch, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(gm(params, x), model(x))


class TransposedBatchNorm(torch.nn.Module):
    """PatchTST's batch norm in small: tokens transposed to (batch, channels, time),
    normalized, transposed back and reshaped into rows (eagerly a copy, traced a view)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.out = torch.nn.Linear(16, 4)
        with torch.no_grad():  # statistics other than the identity's
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.norm(self.inp(x).transpose(1, 2)).transpose(1, 2)
        return self.out(h.reshape(b * t, 16))  # a view, as traced


@torch.no_grad()
def test_a_batch_norm_of_a_transposed_input_is_viewed_as_traced():
    """On CPU batch norm returned the transposed input's output contiguous, where the
    traced graph keeps its strides, and the view after it raised: in ORT's
    first-call check, then in the eager fallback (transformers' PatchTST)."""
    model, x = TransposedBatchNorm().eval(), torch.randn(3, 10, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


def test_a_batch_norm_output_is_put_back_in_its_traced_order_once():
    model = TransposedBatchNorm().eval()
    params = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    x = torch.randn(3, 10, 8)
    with torch.no_grad():
        gm = make_fx(lambda p, x: torch.func.functional_call(model, p, (x,)), tracing_mode="fake")(params, x)
    assert batch_norm_outputs_in_traced_order(gm) == 1
    assert batch_norm_outputs_in_traced_order(gm) == 0
    with torch.no_grad():
        torch.testing.assert_close(gm(params, x), model(x))
