"""Small models shared by the tests, including one with a user custom op."""

from __future__ import annotations

import dataclasses

import torch


@torch.library.custom_op("dispatch_tests::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A user op that no exporter knows: ONNX cannot translate it."""
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


scaled_tanh.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("dispatch_tests::matmul_outside_onnx", mutates_args=())
def matmul_outside_onnx(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A user matmul no exporter knows, as transformers' grouped expert matmul is."""
    return x @ w


@matmul_outside_onnx.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


class ExpertBetweenOnnx(torch.nn.Module):
    """Two ORT regions around an op no exporter knows, as in a mixture-of-experts
    layer. At ``width`` 1024 and 16 rows its ORT regions do 67 MFLOP, enough for
    the whole-graph check (``graph_tuning.TIMED_GRAPH_FLOPS``); at 16, little."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.before = torch.nn.Linear(width, width)
        self.expert = torch.nn.Parameter(torch.randn(width, width) / width**0.5)
        self.after = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.before(x)) * 2.0
        h = matmul_outside_onnx(h, self.expert)
        return torch.tanh(self.after(h)) - 1.0


@dataclasses.dataclass
class Scores:
    """A model output type of the user's (as transformers' ModelOutput is), which
    pytree learns only when this module is imported."""

    logits: torch.Tensor
    probs: torch.Tensor


torch.export.register_dataclass(Scores, serialized_type_name="tests.models.Scores")


class ScoresHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> Scores:
        logits = self.linear(x)
        return Scores(logits, logits.softmax(-1))


class MLP(torch.nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        layers.append(torch.nn.Linear(width, width))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CustomOpMLP(torch.nn.Module):
    """Linear -> ReLU -> custom op -> Linear -> ReLU -> Linear."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
        )
        self.b = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(scaled_tanh(self.a(x), 0.5))


class GroupedQueryAttention(torch.nn.Module):
    """Attention whose key and value have fewer heads than its query (LLaMA's
    ``num_key_value_heads``), through ``scaled_dot_product_attention(enable_gqa=True)``."""

    def __init__(self, width: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.head_dim)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class SpectralFilter(torch.nn.Module):
    """Linear -> rfft -> scale by magnitude -> irfft -> ReLU: complex values inside."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.fft.rfft(self.a(x), dim=-1)
        return torch.fft.irfft(f * f.abs(), n=32, dim=-1).relu()


class ManyExportedOps(torch.nn.Module):
    """Conv, batch norm, GELU, linear, layer norm, softmax, matmul, top-k, ``where``
    and SDPA: the ops an ONNX export of a real model translates most."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.linear = torch.nn.Linear(8, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.nn.functional.gelu(self.bn(self.conv(x))).mean((2, 3))
        z = torch.softmax(self.norm(self.linear(h)), -1) @ y
        q = y[None, None]
        attention = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return z.topk(2).values, torch.where(z > 0, z, z.exp()), attention
