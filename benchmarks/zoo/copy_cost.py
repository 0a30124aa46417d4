"""What the copy that lets a captured region's outputs survive the next call costs,
split into host and device time, for a lent GPU's few seconds.

    python -m benchmarks.zoo.copy_cost --models hf_llama,hf_bert --dtype bfloat16 --out DIR

On an H200 the copy cost auto 34-58 µs a call on the small transformers over
``mode="reduce-overhead"`` (``results/gpu-h200-20261127.md``), where the same
Python path costs 6 µs on CPU: this says whether that is the host's time (the
launch and allocations) or the device's, and what other ways of copying the same
tensors cost. The tensors are the ones auto's copy received on a real call
(``routes.cudagraphs.copied``); on CPU (a smoke test) there is no capture, and
the model's floating outputs stand in. Rows go to ``DIR/copy_cost.jsonl``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dispatch.routes import cudagraphs

from ..accuracy import floating_leaves
from .in_turn import append_row, model_parser
from .wider import EVERY_MODEL
from .worker import moved

CALLS = 200  # few enough that the device's queue never fills and blocks the host
ROUNDS = 5


def _empty_then_foreach_copy(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    copies = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(copies, tensors)
    return copies


def _one_flat_buffer(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One allocation and one kernel for all of them (one dtype only), handed back
    as views of the buffer."""
    if len({t.dtype for t in tensors}) > 1:
        raise ValueError("tensors of more than one dtype")
    flat = torch.cat([t.reshape(-1) for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


VARIANTS: dict[str, Callable[[list[torch.Tensor]], list[torch.Tensor]]] = {
    "auto (copied)": cudagraphs.copied,
    "clone each": lambda ts: [t.clone() for t in ts],
    "empty_like + _foreach_copy_": _empty_then_foreach_copy,
    "one flat buffer": _one_flat_buffer,
}


def copied_tensors(name: str, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """The tensors auto's output copy received on a call of ``name`` (after its
    capture settled), or the model's floating outputs where nothing was copied."""
    model, inputs = EVERY_MODEL[name].build()
    model, inputs = moved(model.eval(), inputs, device, dtype)
    seen: list[list[torch.Tensor]] = []
    original = cudagraphs.copied

    def spying(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        seen.append(list(tensors))
        return original(tensors)

    cudagraphs.copied = spying
    try:
        with torch.no_grad():
            compiled = torch.compile(model, backend="auto")
            for _ in range(5):
                out = compiled(*inputs)
    finally:
        cudagraphs.copied = original
    if seen:
        return seen[-1]
    return [t.detach() for t in floating_leaves(out)]


def variant_cost(
    copy: Callable[[list[torch.Tensor]], list[torch.Tensor]], tensors: list[torch.Tensor]
) -> dict[str, float]:
    """Median over rounds of the host's time per copy (enqueueing only) and the
    whole time per copy with the device synchronised after each batch."""
    sync = torch.cuda.synchronize if tensors[0].is_cuda else (lambda: None)
    for _ in range(20):
        copy(tensors)
    host, whole = [], []
    for _ in range(ROUNDS):
        sync()
        start = time.perf_counter()
        for _ in range(CALLS):
            copy(tensors)
        host.append((time.perf_counter() - start) / CALLS * 1e6)
        sync()
        whole.append((time.perf_counter() - start) / CALLS * 1e6)
    return {"host_us": round(statistics.median(host), 1), "whole_us": round(statistics.median(whole), 1)}


def model_row(name: str, device: str, dtype: torch.dtype) -> dict[str, Any]:
    tensors = copied_tensors(name, device, dtype)
    row: dict[str, Any] = {
        "model": name,
        "dtype": str(dtype).removeprefix("torch."),
        "tensors": [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in tensors],
        "bytes": sum(t.numel() * t.element_size() for t in tensors),
        "variants": {},
    }
    for label, copy in VARIANTS.items():
        try:
            copies = copy(tensors)
            same = len(copies) == len(tensors) and all(
                c.dtype == t.dtype and torch.equal(c, t) for c, t in zip(copies, tensors)
            )
            if not same:
                raise AssertionError("the copies differ from the tensors")
            if {c.data_ptr() for c in copies} & {t.data_ptr() for t in tensors}:
                raise AssertionError("a copy shares memory with its tensor")
            row["variants"][label] = variant_cost(copy, tensors)
        except Exception as error:  # a variant that cannot copy these (mixed dtypes) is reported
            row["variants"][label] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return row


def main() -> None:
    args = model_parser(__doc__.splitlines()[0]).parse_args()
    for name in args.models.split(","):
        torch._dynamo.reset()
        append_row(
            Path(args.out) / "copy_cost.jsonl", model_row(name, args.device, getattr(torch, args.dtype))
        )


if __name__ == "__main__":
    main()
