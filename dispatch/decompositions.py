"""Decompositions that let ONNX Runtime run what the ONNX exporter cannot translate.

``chunk`` or ``split`` of a dimension whose size is symbolic (``dynamic=True``)
gives ``aten.split.Tensor`` a symbolic piece size, which the exporter writes as
``SplitToSequence``; onnxscript's constant folding then fails on it
(``'NoneType' object has no attribute 'ndim'``, onnxscript 0.7.2), and the
whole region fell back to eager. Written as one slice per piece, it exports.

``nn.TransformerEncoderLayer`` in eval mode takes a fused "fast path"
(``aten._transformer_encoder_layer_fwd``) that no exporter translates and that
has no aten decomposition in torch. Left alone, the whole layer would run
eager. Here it is rewritten into the same math as the module's own slow path
(linear, attention as matmul + softmax, layer norm), all of which ONNX
translates. Used only for CPU inference graphs where ``onnxrt`` may run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _self_attention(x: torch.Tensor, num_heads: int, qkv_w, qkv_b, proj_w, proj_b) -> torch.Tensor:
    batch, seq, embed = x.shape
    head = embed // num_heads
    qkv = F.linear(x, qkv_w, qkv_b).view(batch, seq, 3, num_heads, head).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * (head**-0.5)
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return F.linear(out.transpose(1, 2).reshape(batch, seq, embed), proj_w, proj_b)


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> Any:
    """``aten._transformer_encoder_layer_fwd`` for unmasked, dense, batch-first input."""
    if mask is not None or src.is_nested or src.dim() != 3:
        return NotImplemented

    def attention(x: torch.Tensor) -> torch.Tensor:
        return _self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    shape = (embed_dim,)
    x = src
    if norm_first:
        x = x + attention(F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps))
        return x + feed_forward(F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps))
    x = F.layer_norm(x + attention(x), shape, norm_weight_1, norm_bias_1, eps)
    return F.layer_norm(x + feed_forward(x), shape, norm_weight_2, norm_bias_2, eps)


def split_as_slices(x: torch.Tensor, split_size: Any, dim: int = 0) -> Any:
    """``aten.split.Tensor`` with a symbolic piece size, as one slice per piece."""
    if not isinstance(split_size, torch.SymInt) or x.dim() == 0:
        return NotImplemented
    from torch.fx.experimental.symbolic_shapes import guard_int

    dim = dim % x.dim()
    size = x.shape[dim]
    # How many pieces: Dynamo already fixed it (the graph has that many outputs),
    # and torch's own decomposition reads it the same way.
    pieces = guard_int((size + split_size - 1) // split_size)
    ends = [*(split_size * (k + 1) for k in range(pieces - 1)), size]
    starts = [0, *ends[:-1]]
    return tuple(aten.slice.Tensor(x, dim, start, end) for start, end in zip(starts, ends))


def attention_in_four_dims(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``aten.scaled_dot_product_attention`` of 3-D tensors (one head, as hand-written
    attention calls it) as the same op on 4-D ones: torchlib translates 4-D attention
    only ("only 4D query, key, and value are supported"), and a lowered program's
    region holding it fell back to eager."""
    if not query.dim() == key.dim() == value.dim() == 3 or enable_gqa:
        return NotImplemented
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.unsqueeze(1)
    out = aten.scaled_dot_product_attention.default(
        query.unsqueeze(1),
        key.unsqueeze(1),
        value.unsqueeze(1),
        attn_mask,
        dropout_p,
        is_causal,
        scale=scale,
    )
    return out.squeeze(1)


def onnx_friendly() -> dict[Any, Callable[..., Any]]:
    """The decomposition table to lower with when onnxrt may run the graph."""
    return {
        aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
        aten.split.Tensor: split_as_slices,
        aten.scaled_dot_product_attention.default: attention_in_four_dims,
    }
