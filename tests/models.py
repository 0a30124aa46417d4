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
