"""A training step as the first-call check times it (``capture_check.py``): the
forward, then the backward of its outputs, with every trace of the timed steps
undone before the real call runs.

The gradients land in ``.grad``, as a real step's do (autograd copies one whose
strides differ from its parameter's), and every ``.grad`` is put back
afterwards. A training forward updates buffers
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
from .update_step import aot_input_info


def training_step(program: Callable[..., Any], leaves: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """``program`` followed by the backward of its outputs that need gradients (all
    ones as their gradients) into ``leaves``, whose ``.grad`` is emptied first, as
    ``zero_grad()`` does; the forward's outputs are returned. The gradients land in
    ``.grad`` as a real step's do: where one's strides differ from its leaf's,
    autograd copies it to the leaf's, and that copy is part of the step
    (``torch.autograd.grad`` would hand it back uncopied: timm's EfficientNet-B0
    measured 28.0 ms under inductor against 34.4 as traced that way, and ran 34.5
    against 33.0 in a training loop). Run it inside ``kept_gradients``."""

    inputs = list(leaves)

    def step(*a: Any) -> Any:
        for leaf in inputs:
            leaf.grad = None
        out = program(*a)
        needed = [o for o in autotune.flat_outputs(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if needed and inputs:
            grads = [torch.ones_like(o) for o in needed]
            torch.autograd.backward(needed, grads, inputs=inputs)
        return out

    return step


def detached_activations(args: Sequence[Any]) -> list[Any]:
    """``args`` with each tensor that requires grad and is no leaf (an activation
    of the caller's graph before this one) replaced by a leaf over its data: a
    timed step's backward computes its gradient and stops there. Run into it, the
    backward would free the caller's graph, whose own backward then fails."""
    leaves: dict[int, torch.Tensor] = {}
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad and not a.is_leaf:
            a = leaves.setdefault(id(a), a.detach().requires_grad_())
        out.append(a)
    return out


@contextlib.contextmanager
def kept_gradients(leaves: Sequence[torch.Tensor]) -> Iterator[None]:
    """Each of ``leaves`` has the ``.grad`` it had on entry when the block ends."""
    kept = [leaf.grad for leaf in leaves]
    try:
        yield
    finally:
        for leaf, grad in zip(leaves, kept, strict=True):
            leaf.grad = grad


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
    info = aot_input_info()
    if info is None:
        return False
    return not any(i.mutates_metadata or (i.mutates_data and i.requires_grad) for i in info)
