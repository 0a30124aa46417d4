"""A custom operator for the lowering tests: a library a user would import.

Importing this module registers ``dispatch_lowering::scaled_tanh``; a saved
program that uses it loads only in a process that imported it first.
"""

import torch


@torch.library.custom_op("dispatch_lowering::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    """Linear -> the custom op -> Linear: ONNX Runtime runs the Linears, eager the op."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(scaled_tanh(self.a(x), 2.0))
