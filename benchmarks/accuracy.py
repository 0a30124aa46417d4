"""The benchmarks' accuracy judge: the rule of PyTorch's benchmark dashboard.

A result is compared with eager in the same dtype on the same device
(``torch._dynamo.utils.same``), with an fp64 run of the model as the truth: in
float32 that is fp32 eager; in bfloat16 a result passes when it is about as
close to fp64 as bfloat16 eager is. Shared by ``nox -s bench`` and ``nox -s
zoo``, so that a peer computing in a lower precision than it was asked for (OpenVINO
runs fp32 models in bf16 on CPUs with AVX512_BF16 unless told otherwise) fails
instead of setting the bar.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def accurate(reference: Any, fp64: Any, result: Any, dtype: torch.dtype) -> bool:
    """Whether ``result`` matches ``reference`` (eager in ``dtype``) by the dashboard's
    rule, with ``fp64`` (the same model in float64) as the truth. Where the model has
    no fp64 run (``None``), the dashboard's own fallback: cosine similarity."""
    from torch._dynamo.utils import same

    ref, res = floating_leaves(reference), floating_leaves(result)
    if len(ref) != len(res):
        return False
    ref, res = [r.cpu() for r in ref], [r.cpu() for r in res]
    if fp64 is None:
        return bool(same(ref, res, cos_similarity=True, tol=TOLERANCE[dtype], equal_nan=True))
    return bool(same(ref, res, fp64_ref=floating_leaves(fp64), tol=TOLERANCE[dtype], equal_nan=True))


def fp64_truth(run: Callable[[], Any]) -> Any:
    """``run()``, the model in float64, or None where it cannot run in float64 (an op
    with no double kernel, as ``torch._grouped_mm`` in transformers' mixture-of-experts
    layers): PyTorch's dashboard then judges by cosine similarity instead."""
    try:
        return run()
    except (RuntimeError, NotImplementedError):
        return None


def fp64_inference(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """The truth for an inference cell: a copy of ``model`` run in float64, or None (``fp64_truth``)."""
    return fp64_truth(lambda: copy.deepcopy(model).double()(*in_float64(inputs)))


def copies(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A copy of each input: a run that updates one in place leaves the caller's as it was."""
    return tuple(t.clone() for t in inputs)


def in_float64(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A copy of ``inputs`` with every floating tensor in float64 (token ids and masks
    keep their dtype): the fp64 run may update an input in place, and the runs
    judged after it must see the inputs as they were."""
    return tuple(t.double() if t.is_floating_point() else t.clone() for t in inputs)


def give_new_values(inputs: tuple[torch.Tensor, ...]) -> None:
    """Each input rolled by one along its last dimension, in place: the same
    shapes, dtypes and values (token ids stay in the vocabulary, a mask stays a
    mask) in other places, as a service's next request brings. A program that
    kept an input's values, or an output, from an earlier call is then wrong."""
    with torch.no_grad():
        for t in inputs:
            if t.dim() and t.shape[-1] > 1:
                t.copy_(t.roll(1, -1))


def inference_accurate_now(
    call: Callable[[], Any], model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dtype: torch.dtype
) -> bool:
    """Whether ``call`` (a column's compiled ``model`` on ``inputs``) still matches
    eager, judged as the first call was, after the calls a column decides on: auto's
    trials swap in other programs up to the 165th call, a CUDA graph replays into
    buffers it reuses, and neither shows on the first call. Judged on new values
    of ``inputs`` (``give_new_values``), against eager on them as they are then (a
    model may update its input in place); run under the cell's grad mode."""
    give_new_values(inputs)
    now = copies(inputs)
    fp64 = fp64_inference(model, now)
    reference = copy.deepcopy(model)(*copies(now))
    return accurate(reference, fp64, call(), dtype)


def floating_leaves(out: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in a model's output (ModelOutput, dict, list, tuple),
    and those held by objects in it: a decoder's KV cache (transformers' ``DynamicCache``
    keeps its keys and values on per-layer objects that pytree does not open), so a
    wrong cache fails the accuracy check as a wrong hidden state does."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if hasattr(value, "to_tuple"):
            value = value.to_tuple()
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                if leaf.is_floating_point():
                    found.append(leaf)
            elif depth and hasattr(leaf, "__dict__") and not isinstance(leaf, type) and id(leaf) not in seen:
                seen.add(id(leaf))
                walk(list(vars(leaf).values()), depth - 1)

    walk(out, depth=3)
    return found
