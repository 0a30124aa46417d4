"""RMS norm forward: replaces the aten pattern that ``torch.nn.RMSNorm`` and
``F.rms_norm`` lower to::

    [_to_copy(x, float32)] -> pow(x, 2) -> mean(dim=-1, keepdim) -> add(eps)
      -> rsqrt -> mul(x, .) -> [mul(., weight)] -> [_to_copy(., dtype)]

computed in float32 in one kernel; the output dtype is what the pattern's last
node returns. The weight is either a full (N,) scale or one element broadcast
over the row (read with stride 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import as_rows, check_device, on_device, row_block


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    in_ptr,
    w_ptr,
    in_stride,
    out_stride,
    w_stride,
    n_cols,
    eps,
    HAS_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    src = in_ptr + row * in_stride
    dst = out_ptr + row * out_stride
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(src + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        y = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + cols * w_stride, mask=mask, other=1.0).to(tl.float32)
        tl.store(dst + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    out_dtype: torch.dtype | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """RMS norm over the last dimension, with an optional weight of N elements or one."""
    check_device(x, weight)
    n_cols = x.shape[-1]
    if weight is not None and weight.numel() not in (1, n_cols):
        raise ValueError(
            f"kernels.rms_norm: weight {tuple(weight.shape)} is neither ({n_cols},) nor one element"
        )
    x2 = as_rows(x, n_cols)
    out = torch.empty(x2.shape, dtype=out_dtype or x.dtype, device=x.device)
    if x2.numel():
        BLOCK, warps = row_block(n_cols, block)
        w = weight.reshape(-1).contiguous() if weight is not None else x2
        with on_device(x):
            _rms_norm_kernel[(x2.shape[0],)](
                out,
                x2,
                w,
                x2.stride(0),
                out.stride(0),
                1 if w.numel() == n_cols else 0,
                n_cols,
                eps,
                HAS_W=weight is not None,
                BLOCK=BLOCK,
                num_warps=warps,
            )
    return out.view(x.shape)


def reference(x, weight, eps, out_dtype=None):
    y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), None, eps)
    if weight is not None:
        y = y * weight.float().reshape(-1)
    return y.to(out_dtype or x.dtype)
