"""The benchmark models: name -> (model factory, input factory)."""

from __future__ import annotations

from collections.abc import Callable

import torch


@torch.library.custom_op("bench::swish_clip", mutates_args=())
def swish_clip(x: torch.Tensor) -> torch.Tensor:
    """A user op in the middle of a model: no exporter can translate it."""
    return (x * torch.sigmoid(x)).clamp(-4.0, 4.0)


@swish_clip.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, width))
    return torch.nn.Sequential(*layers)


class ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class CustomOpMLP(torch.nn.Module):
    """Two 512-wide GELU MLP blocks with LayerNorm, a custom op between them."""

    def __init__(self, width: int = 512) -> None:
        super().__init__()

        def block() -> torch.nn.Module:
            return torch.nn.Sequential(
                torch.nn.Linear(width, width),
                torch.nn.GELU(),
                torch.nn.LayerNorm(width),
                torch.nn.Linear(width, width),
                torch.nn.GELU(),
            )

        self.a, self.b = block(), block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(swish_clip(self.a(x)))


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "tiny_mlp": (lambda: mlp(10, 3), lambda: (torch.randn(2, 10),)),
    "mlp_1024": (lambda: mlp(1024, 3), lambda: (torch.randn(64, 1024),)),
    "conv_bn_relu": (ConvBnRelu, lambda: (torch.randn(1, 3, 224, 224),)),
    "transformer_layer": (
        lambda: torch.nn.TransformerEncoderLayer(256, nhead=8, dim_feedforward=1024, batch_first=True),
        lambda: (torch.randn(8, 128, 256),),
    ),
    "custom_op_mlp": (CustomOpMLP, lambda: (torch.randn(64, 512),)),
}


def build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    make_model, make_inputs = MODELS[name]
    model = make_model().eval()
    if isinstance(model, ConvBnRelu):
        # Non-trivial running statistics, so that BN is not an identity.
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model, make_inputs()
