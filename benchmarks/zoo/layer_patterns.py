"""Layers people write by hand around models, in the wider set (``--models
wider``) since 2026-12-06: rotary self-attention, a SwiGLU block behind an RMS
norm, a focal loss, a diffusion U-Net's GroupNorm-SiLU residual block with
its timestep embedding, a recommender's EmbeddingBag towers, position ids
from an attention mask (HF's ``cumsum`` trick), a cross-entropy with label
smoothing and ignored tokens; ALiBi attention, a WaveNet block, image
preprocessing in the model, a detector's box decoding, CLIP's contrastive
loss and a mixture of experts' top-2 router. Small graphs of many pointwise ops, reductions
and integer ops beside few matmuls, the kind ``inductor_bar.mostly_loops`` is
about. Built with their inputs, as the zoo's own patterns are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .models import VOCAB, _pattern, _tokens


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryAttention(nn.Module):
    """Causal self-attention with rotary position embeddings computed in the
    forward (``arange``, an outer product, ``sin``/``cos``), as LLaMA-style code
    writes it by hand, through ``scaled_dot_product_attention``."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        head = dim // heads
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head, 2).float() / head))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        freqs = torch.outer(torch.arange(t, dtype=x.dtype), self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class SwiGLUBlock(nn.Module):
    """An RMS norm written out (``pow``, ``mean``, ``rsqrt``) before a SwiGLU MLP,
    with a residual."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class FocalLoss(nn.Module):
    """A detection head's sigmoid focal loss against fixed binary targets: a
    linear, then a chain of pointwise ops and a mean."""

    def __init__(self, dim: int = 64, classes: int = 20) -> None:
        super().__init__()
        self.head = nn.Linear(dim, classes)
        self.register_buffer("targets", (torch.rand(32, classes) > 0.9).float())

    def forward(self, x):
        logits = self.head(x)
        p = logits.sigmoid()
        ce = F.binary_cross_entropy_with_logits(logits, self.targets, reduction="none")
        p_t = p * self.targets + (1 - p) * (1 - self.targets)
        alpha_t = 0.25 * self.targets + 0.75 * (1 - self.targets)
        return (alpha_t * ce * (1 - p_t) ** 2).mean()


class DiffusionResBlock(nn.Module):
    """A diffusion U-Net's residual block: a sinusoidal timestep embedding through
    an MLP, GroupNorm and SiLU around two 3x3 convolutions."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.time = nn.Sequential(nn.Linear(64, channels), nn.SiLU(), nn.Linear(channels, channels))
        self.norm1, self.norm2 = nn.GroupNorm(8, channels), nn.GroupNorm(8, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, t):
        freqs = torch.exp(-torch.arange(32, dtype=x.dtype) * (9.21 / 32))
        angles = t[:, None] * freqs[None]
        emb = self.time(torch.cat((angles.sin(), angles.cos()), dim=-1))
        h = self.conv1(F.silu(self.norm1(x))) + emb[:, :, None, None]
        return x + self.conv2(F.silu(self.norm2(h)))


class EmbeddingBagTowers(nn.Module):
    """A recommender's two towers: ``EmbeddingBag`` sums over offsets, an MLP
    each, a cosine score."""

    def __init__(self) -> None:
        super().__init__()
        self.users = nn.EmbeddingBag(VOCAB, 32, mode="sum")
        self.items = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.user_mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.item_mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, user_ids, item_ids):
        offsets = torch.arange(0, user_ids.numel(), 8)
        u = self.user_mlp(self.users(user_ids.flatten(), offsets))
        v = self.item_mlp(self.items(item_ids.flatten(), offsets))
        return F.cosine_similarity(u, v, dim=-1)


class MaskedPositions(nn.Module):
    """Position ids from a padding mask (``cumsum`` of the mask, as transformers'
    RoBERTa computes them), embeddings of tokens and positions, a layer norm and a
    masked mean pool."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, 64)
        self.positions = nn.Embedding(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, ids):
        mask = (ids % 7 != 0).long()  # stands in for padding
        positions = torch.cumsum(mask, dim=1) * mask
        h = self.norm(self.tokens(ids) + self.positions(positions))
        weights = mask.unsqueeze(-1).to(h.dtype)
        return (h * weights).sum(1) / weights.sum(1).clamp(min=1)


class SmoothedCrossEntropy(nn.Module):
    """A language-model head's loss: logits, cross-entropy with label smoothing
    and an ignored index, as training loops compute it in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 256)

    def forward(self, hidden, labels):
        logits = self.head(hidden).flatten(0, 1)
        labels = labels.flatten().masked_fill(labels.flatten() % 5 == 0, -100)
        return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)


class ALiBiAttention(nn.Module):
    """Self-attention with ALiBi's linear position bias built in the forward from
    ``arange`` and per-head slopes, and a causal mask, written out with matmuls."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.register_buffer("slopes", 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        pos = torch.arange(t)
        bias = (pos[None, :] - pos[:, None]).to(x.dtype) * self.slopes[:, None, None]
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + bias
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class WaveNetBlock(nn.Module):
    """A dilated causal 1-d convolution with WaveNet's gate (``tanh * sigmoid``),
    residual and skip 1x1 convolutions."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.dilated = nn.Conv1d(channels, 2 * channels, 2, dilation=4)
        self.residual = nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        h = self.dilated(F.pad(x, (4, 0)))
        a, b = h.chunk(2, dim=1)
        gated = torch.tanh(a) * torch.sigmoid(b)
        return x + self.residual(gated), self.skip(gated)


class ImagePreprocess(nn.Module):
    """Preprocessing inside the model: uint8-range input scaled, normalised by
    per-channel mean and std, clamped, resized bilinearly, then a stem conv."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x):
        x = ((x.clamp(0, 255) / 255.0) - self.mean) / self.std
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
        return self.stem(x)


class BoxDecoder(nn.Module):
    """A detector's box decoding: deltas from a linear head applied to anchors
    (``exp`` of clamped sizes, centres to corners), scores by sigmoid."""

    def __init__(self, anchors: int = 64) -> None:
        super().__init__()
        self.head = nn.Linear(32, 5)
        g = torch.Generator().manual_seed(1)
        self.register_buffer("anchors", torch.rand(anchors, 4, generator=g) * 64 + 8)

    def forward(self, features):
        out = self.head(features)
        deltas, logits = out[..., :4], out[..., 4]
        cx = self.anchors[:, 0] + deltas[..., 0] * self.anchors[:, 2]
        cy = self.anchors[:, 1] + deltas[..., 1] * self.anchors[:, 3]
        w = self.anchors[:, 2] * torch.exp(deltas[..., 2].clamp(max=4.0))
        h = self.anchors[:, 3] * torch.exp(deltas[..., 3].clamp(max=4.0))
        boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), dim=-1)
        return boxes.clamp(0, 128), logits.sigmoid()


class ContrastiveLoss(nn.Module):
    """CLIP's loss over a batch: two projections, L2 normalisation, a learned
    temperature, cross-entropy in both directions."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(64, 32)
        self.text = nn.Linear(48, 32)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, image, text):
        a = F.normalize(self.image(image), dim=-1)
        b = F.normalize(self.text(text), dim=-1)
        logits = self.logit_scale.exp() * a @ b.t()
        labels = torch.arange(logits.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


class Top2Router(nn.Module):
    """A mixture of experts' top-2 router: softmax gates, ``topk``, renormalised
    weights, a one-hot dispatch mask and the load-balancing loss."""

    def __init__(self, dim: int = 64, experts: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = experts

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        weights, chosen = probs.topk(2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        mask = F.one_hot(chosen, self.experts).sum(-2).to(x.dtype)
        balance = (mask.mean(0) * probs.mean(0)).sum() * self.experts
        return weights, mask, balance


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# name -> how to build it with its inputs
LAYER_PATTERNS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "rotary_attention": _pattern(RotaryAttention, 2, 32, 64),
    "swiglu_block": _pattern(SwiGLUBlock, 2, 32, 64),
    "focal_loss": _pattern(FocalLoss, 32, 64),
    "diffusion_res_block": _pattern(
        DiffusionResBlock,
        inputs=lambda: (torch.randn(2, 32, 16, 16, generator=_gen()), torch.rand(2, generator=_gen()) * 1000),
    ),
    "embedding_bag_towers": _pattern(EmbeddingBagTowers, inputs=lambda: _tokens(0, batch=16, seq=8)),
    "masked_positions": _pattern(MaskedPositions, inputs=lambda: _tokens(batch=4, seq=32)),
    "alibi_attention": _pattern(ALiBiAttention, 2, 32, 64),
    "wavenet_block": _pattern(WaveNetBlock, 2, 32, 200),
    "image_preprocess": _pattern(
        ImagePreprocess, inputs=lambda: (torch.rand(2, 3, 48, 48, generator=_gen()) * 255,)
    ),
    "box_decoder": _pattern(BoxDecoder, 2, 64, 32),
    "contrastive_loss": _pattern(
        ContrastiveLoss,
        inputs=lambda: (torch.randn(16, 64, generator=_gen()), torch.randn(16, 48, generator=_gen())),
    ),
    "top2_router": _pattern(Top2Router, 64, 64),
    "smoothed_cross_entropy": _pattern(
        SmoothedCrossEntropy,
        inputs=lambda: (
            torch.randn(4, 16, 64, generator=_gen()),
            torch.randint(0, 256, (4, 16), generator=_gen()),
        ),
    ),
}
