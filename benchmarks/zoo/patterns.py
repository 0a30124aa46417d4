"""Code patterns of the wider set (``--models wider``) that the zoo's own list lacks:
recurrent layers, a small U-Net (GroupNorm, InstanceNorm, a transposed conv,
interpolation, a skip concat), pixel shuffle, top-k and scatter and sort,
attention with a boolean mask and its weights returned, an einsum with
``masked_fill(-inf)``, a dilated grouped 1-d conv stack, and torch's own
``nn.TransformerEncoder``; and since 2026-11-28 code that Dynamo traces into
higher-order ops: ``flex_attention``, ``torch.cond`` and activation
checkpointing. Each is built with the inputs it is called on, as the zoo's own patterns are.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .models import VOCAB, _pattern, _tokens


class LSTMTagger(nn.Module):
    """Embedding, a two-layer bidirectional LSTM, a per-token head: Dynamo leaves
    ``nn.LSTM`` to eager, so the graphs around it are all a backend sees."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.lstm = nn.LSTM(64, 96, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(192, 10)

    def forward(self, tokens):
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden).log_softmax(-1)


class GRUSequence(nn.Module):
    """A GRU whose last hidden state is returned beside the projected sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, 32)

    def forward(self, x):
        sequence, last = self.gru(x)
        return self.out(sequence), last


class TinyUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(8, 32), nn.SiLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.merge = nn.Sequential(
            nn.Conv2d(32, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True), nn.GELU()
        )
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        skip = self.down1(x)
        h = torch.cat([self.up(self.down2(skip)), skip], 1)
        return self.out(self.merge(h)) + F.interpolate(
            x, scale_factor=1.0, mode="bilinear", align_corners=False
        )


class PixelShuffleUpsampler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 12, 3, padding=1)
        self.refine = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = F.pixel_shuffle(self.expand(x), 2)
        z = F.interpolate(y, size=(x.shape[-2], x.shape[-1]), mode="nearest")
        return self.refine(z).sigmoid(), F.adaptive_avg_pool2d(y, 5)


class TopKScatter(nn.Module):
    """Top-k, scatter into zeros (so the sort meets ties), sort, cumsum, gather,
    argmax: integer outputs beside floating ones."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        y = self.proj(x)
        values, indices = y.topk(8, dim=-1)
        z = torch.zeros_like(y).scatter(-1, indices, values.softmax(-1))
        ordered, order = z.sort(dim=-1, descending=True)
        return z.cumsum(-1), ordered, order, torch.gather(y, -1, order[..., :4]), y.argmax(-1)


class MaskedAttention(nn.Module):
    """``nn.MultiheadAttention`` with a causal boolean mask, returning its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        steps = x.shape[1]
        mask = torch.triu(torch.ones(steps, steps, dtype=torch.bool), 1)
        y, weights = self.attention(x, x, x, attn_mask=mask, need_weights=True)
        return self.norm(y + x), weights


class EinsumMasked(nn.Module):
    """A per-head einsum, ``masked_fill`` with -inf, softmax, and a ``where`` on
    ``isfinite``: few flops, many pointwise ops."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 32, 32) / 6)

    def forward(self, x):
        y = torch.einsum("bhtd,hde->bhte", x, self.weight)
        y = y.masked_fill(y < -1, float("-inf")).softmax(-1)
        return torch.where(torch.isfinite(y), y, torch.zeros_like(y)).amax(-2)


class Conv1dAudio(nn.Module):
    """1-d convolutions over audio features: BatchNorm1d, a dilated grouped conv, pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(80, 128, 5, padding=2),
            nn.BatchNorm1d(128),
            nn.ReLU(),
            nn.Conv1d(128, 128, 3, padding=2, dilation=2, groups=4),
            nn.ReLU(),
            nn.AvgPool1d(2),
            nn.Conv1d(128, 32, 1),
        )

    def forward(self, features):
        return self.net(features).transpose(1, 2).flatten(1)


class TorchTransformerEncoder(nn.Module):
    """torch's own pre-norm encoder (eager takes its fused fast path under no_grad)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, norm_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class FlexSelfAttention(nn.Module):
    """Causal self-attention through ``flex_attention`` (a ``score_mod``), from a
    fused ``qkv`` split by ``permute`` and ``unbind``. ONNX cannot take
    flex_attention, and it lays its output out as its query: ``q`` must reach it
    in the traced order (``q`` is a view with gaps) for the ``view`` after it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.out = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, score_mod=_causal)
        return x + self.out(y.transpose(1, 2).reshape(b, t, 64))


def _causal(score, batch, head, query, key):
    return torch.where(query >= key, score, -float("inf"))


class CondBranches(nn.Module):
    """``torch.cond`` on a value of the data: one of two MLP heads, inside one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(64, 64)
        self.wide = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.narrow = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 64))

    def forward(self, x):
        h = self.stem(x).relu()
        h = torch.cond(h.mean() > 0.2, self.wide, self.narrow, (h,))
        return h.softmax(-1)


class CheckpointedMLP(nn.Module):
    """Residual MLP blocks under ``torch.utils.checkpoint`` (as training code leaves
    them), called for inference: a higher-order op in Dynamo's graph per block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
            for _ in range(3)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


# name -> how to build it with its inputs
PATTERNS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "lstm_tagger": _pattern(LSTMTagger, inputs=partial(_tokens, batch=2, seq=20)),
    "gru_sequence": _pattern(GRUSequence, 2, 16, 32),
    "tiny_unet": _pattern(TinyUNet, 2, 3, 32, 32),
    "pixel_shuffle": _pattern(PixelShuffleUpsampler, 2, 3, 20, 20),
    "topk_scatter": _pattern(TopKScatter, 4, 10, 64),
    "masked_attention": _pattern(MaskedAttention, 2, 12, 64),
    "einsum_masked": _pattern(EinsumMasked, 2, 4, 8, 32),
    "conv1d_audio": _pattern(Conv1dAudio, 2, 80, 200),
    "torch_transformer_encoder": _pattern(TorchTransformerEncoder, 2, 10, 64),
    "flex_attention": _pattern(FlexSelfAttention, 2, 32, 64),
    "cond_branches": _pattern(CondBranches, 2, 32, 64),
    "checkpointed_mlp": _pattern(CheckpointedMLP, 2, 32, 64),
}
