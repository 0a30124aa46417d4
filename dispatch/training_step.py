"""A training step as the first-call check times it (``capture_check.py``): the
forward, then the backward of its outputs, with every trace of the timed steps
undone before the real call runs.

The backward goes through ``torch.autograd.grad``, which hands the gradients
back instead of adding them to ``.grad``. A training forward updates buffers
(batch norm's running statistics) outside its aten graph, so the inputs that
do not require grad are copied first and written back where they changed. What
cannot be written back that way (an input that requires grad changed in place,
an input whose shape or strides change) keeps the graph untimed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import autotune


def training_step(program: Callable[..., Any], leaves: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """``program`` followed by the backward of its outputs that need gradients (all
    ones as their gradients) into ``leaves``; the forward's outputs are returned.
    ``torch.autograd.grad`` leaves every ``.grad`` as it was."""

    def step(*a: Any) -> Any:
        out = program(*a)
        needed = [o for o in autotune.flat_outputs(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if needed and leaves:
            grads = [torch.ones_like(o) for o in needed]
            torch.autograd.grad(needed, leaves, grads, allow_unused=True)
        return out

    return step


@contextlib.contextmanager
def kept_inputs(args: Sequence[Any]) -> Iterator[None]:
    """Every tensor of ``args`` (a graph's inputs and buffers) that does not require grad is as it was on entry
    when the block ends: a training forward updates buffers (batch norm's running
    statistics), and the steps timed would update them once each. Only a tensor
    that changed is written back."""
    kept = [
        (a, a.detach().clone())
        for a in args
        if isinstance(a, torch.Tensor) and not a.requires_grad and not isinstance(a, FakeTensor)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, copy_of in kept:
                if not torch.equal(tensor, copy_of):
                    tensor.copy_(copy_of)


def undoable_mutations() -> bool:
    """Whether every input that the training graph AOTAutograd is compiling now
    mutates is one ``kept_inputs`` puts back: its data changes, not its shape or
    strides, and it does not require grad. False where AOTAutograd says nothing."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if metadata is None:
        return False
    return not any(i.mutates_metadata or (i.mutates_data and i.requires_grad) for i in metadata.input_info)
