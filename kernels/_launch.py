"""What every kernel family shares: where it may run, and the block-size rule.

Block-size rule for row kernels (softmax, layer norm, RMS norm): one program per
row; the block is the row length rounded up to a power of two, capped at
``MAX_ROW_BLOCK`` (longer rows loop over blocks); warps grow with the block so
each thread holds a handful of elements: 4 warps up to 1024, 8 up to 4096,
16 beyond. Matmul block sizes come from ``triton.autotune`` on a GPU.
"""

from __future__ import annotations

import contextlib
import os

import torch

MAX_ROW_BLOCK = 4096


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels run on CPU tensors, in numpy."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_device(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t is None:
            continue
        if t.device.type == "cuda" or (t.device.type == "cpu" and interpreting()):
            continue
        raise RuntimeError(
            f"kernels: a {t.device.type} tensor needs CUDA (or CPU under TRITON_INTERPRET=1); "
            "run this op eagerly instead"
        )


def on_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Launch on ``tensor``'s device: Triton launches on the *current* CUDA
    device, which for a region on ``cuda:1`` is usually ``cuda:0``."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def max_offset(t: torch.Tensor) -> int:
    """The largest element offset a kernel computes into ``t`` (its strided extent)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)


INT32_LIMIT = 2**31 - 1


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def row_block(n_cols: int, block: int | None = None) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of ``n_cols`` elements, per the rule above."""
    block = block or min(next_power_of_2(n_cols), MAX_ROW_BLOCK)
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    return block, warps


def as_rows(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``x`` as a 2-D (rows, n_cols) tensor whose rows are contiguous (a view where possible)."""
    rows = x.reshape(-1, n_cols)
    return rows if rows.stride(-1) == 1 else rows.contiguous()
