"""How each zoo column runs a model: a zero-argument callable per column.

CPU: eager; floor (torch.compile with a backend that returns Dynamo's graph
unchanged: what Dynamo costs before any backend runs); inductor; auto;
onnxrt_direct (the whole model through torch.onnx.export and an ONNX Runtime
session, fed and read through numpy). CUDA: eager; floor; inductor; inductor with
mode="reduce-overhead"; inductor with mode="max-autotune-no-cudagraphs"; auto;
auto_reduce_overhead (auto under torch's reduce-overhead contract, outputs not
copied out of the CUDA graph's pool: what auto's copies cost, beside it).
Training columns run forward, backward and an SGD step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..accuracy import floating_leaves

CPU_COLUMNS = ("eager", "floor", "inductor", "auto", "onnxrt_direct")
# The floor on CUDA too: graph-break code whose small graphs run as traced (the
# capture check) costs what Dynamo costs, which no backend removes.
CUDA_COLUMNS = (
    "eager",
    "floor",
    "inductor",
    "reduce_overhead",
    "max_autotune_no_cudagraphs",
    "auto",
    "auto_reduce_overhead",
)
TRAIN_COLUMNS = ("eager", "floor", "inductor", "auto")
PEERS = ("eager", "floor", "inductor", "onnxrt_direct", "reduce_overhead", "max_autotune_no_cudagraphs")


def floor_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """A backend that runs Dynamo's graph as it is."""
    return gm.forward


def compiled(column: str, model: torch.nn.Module) -> Callable[..., Any]:
    """``model`` as ``column`` runs it (not onnxrt_direct, which needs inputs)."""
    if column == "eager":
        return model
    if column == "floor":
        return torch.compile(model, backend=floor_backend)
    if column == "inductor":
        return torch.compile(model, backend="inductor")
    if column == "reduce_overhead":
        return torch.compile(model, mode="reduce-overhead")
    if column == "max_autotune_no_cudagraphs":
        return torch.compile(model, mode="max-autotune-no-cudagraphs")
    if column == "auto":
        return torch.compile(model, backend="auto")
    if column == "auto_reduce_overhead":
        return torch.compile(model, backend="auto", options={"reduce_overhead": True})
    raise ValueError(f"unknown column {column!r}")


def inference(column: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    if column == "onnxrt_direct":
        from ..columns import make

        return make("onnxrt_direct", model, inputs)
    fn = compiled(column, model)
    return lambda: fn(*inputs)


class TrainingStep:
    """One step: forward, a loss over every floating output, backward, SGD.
    ``forward`` is the model as the column compiled it, for a check of its
    gradients once the column's own decisions are made."""

    def __init__(self, column: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.forward = compiled(column, model)
        self.inputs = inputs
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def __call__(self) -> Any:
        self.optimizer.zero_grad(set_to_none=True)
        loss = sum(t.float().mean() for t in floating_leaves(self.forward(*self.inputs)))
        loss.backward()
        self.optimizer.step()
        return loss.detach()
