"""Softmax over the last dimension: replaces ``aten._softmax.default`` (dim=-1).

Numerically stable (the row maximum is subtracted) for any row length: a row
that fits one block is loaded once; a longer row is read twice with an online
max/sum (the running sum is rescaled whenever the maximum grows), then a
third time to write. Accumulates in float32 for float16/bfloat16 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import as_rows, check_device, on_device, row_block


@triton.jit
def _softmax_kernel(
    out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    src = in_ptr + row * in_stride
    dst = out_ptr + row * out_stride
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = offs < n_cols
        x = tl.load(src + offs, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.where(mask, tl.exp(x - tl.max(x, 0)), 0.0)
        tl.store(dst + offs, (e / tl.sum(e, 0)).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            x = tl.load(src + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            # A NaN makes its lane NaN for good, and the sum with it, as torch gives a
            # NaN row: the default (NONE) lowers to a max that drops it.
            m_new = tl.maximum(m, x, propagate_nan=tl.PropagateNan.ALL)
            empty = m_new == -float("inf")
            s = tl.where(empty, 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
            m = m_new
        row_max = tl.max(m, 0)
        total = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - row_max)), 0)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            x = tl.load(src + cols, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(dst + cols, (tl.exp(x - row_max) / total).to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, dim: int = -1, *, block: int | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim=-1)``; ``block`` overrides the block-size rule (tests)."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"kernels.softmax: only the last dimension, got dim={dim}")
    check_device(x)
    n_cols = x.shape[-1]
    x2 = as_rows(x, n_cols)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel() == 0:
        return out.view(x.shape)
    BLOCK, warps = row_block(n_cols, block)
    with on_device(x):
        _softmax_kernel[(x2.shape[0],)](
            out,
            x2,
            x2.stride(0),
            out.stride(0),
            n_cols,
            BLOCK=BLOCK,
            ONE_PASS=n_cols <= BLOCK,
            num_warps=warps,
        )
    return out.view(x.shape)


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
