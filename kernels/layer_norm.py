"""Layer norm forward: replaces ``aten.native_layer_norm.default``.

Returns what aten returns: ``(out, mean, rstd)``, with ``mean`` and ``rstd``
shaped like the input with the normalized dimensions set to 1, in the dtype
the caller asks for (float32 on CUDA for half inputs, as aten does). Weight
and bias are optional. Statistics are computed in float32 in two passes (mean,
then the centred sum of squares) so long rows stay accurate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._launch import as_rows, check_device, on_device, row_block


@triton.jit
def _layer_norm_kernel(
    out_ptr,
    mean_ptr,
    rstd_ptr,
    in_ptr,
    w_ptr,
    b_ptr,
    in_stride,
    out_stride,
    n_cols,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    src = in_ptr + row * in_stride
    dst = out_ptr + row * out_stride
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        acc += tl.load(src + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    mean = tl.sum(acc, 0) / n_cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / n_cols + eps)
    tl.store(mean_ptr + row, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        y = (tl.load(src + cols, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=mask, other=1.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(
    x: torch.Tensor,
    normalized_shape: list[int] | tuple[int, ...],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    stats_dtype: torch.dtype | None = None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.native_layer_norm``: (out, mean, rstd). ``stats_dtype`` defaults to
    float32 on CUDA for half inputs and to the input dtype otherwise."""
    check_device(x, weight, bias)
    normalized = tuple(normalized_shape)
    if tuple(x.shape[x.dim() - len(normalized) :]) != normalized:
        raise ValueError(f"kernels.layer_norm: input {tuple(x.shape)} does not end with {normalized}")
    n_cols = math.prod(normalized)
    x2 = as_rows(x, n_cols)
    rows = x2.shape[0]
    stats_dtype = stats_dtype or stats_dtype_for(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    stat_shape = stats_shape(x, normalized)
    mean = torch.empty(stat_shape, dtype=stats_dtype, device=x.device)
    rstd = torch.empty(stat_shape, dtype=stats_dtype, device=x.device)
    if rows and n_cols:
        w = weight.reshape(-1).contiguous() if weight is not None else x2
        b = bias.reshape(-1).contiguous() if bias is not None else x2
        BLOCK, warps = row_block(n_cols, block)
        with on_device(x):
            _layer_norm_kernel[(rows,)](
                out,
                mean,
                rstd,
                x2,
                w,
                b,
                x2.stride(0),
                out.stride(0),
                n_cols,
                eps,
                HAS_W=weight is not None,
                HAS_B=bias is not None,
                BLOCK=BLOCK,
                num_warps=warps,
            )
    return out.view(x.shape), mean, rstd


def stats_shape(x: torch.Tensor, normalized: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``torch.native_layer_norm``'s mean and rstd: ``x``'s leading
    dimensions, then a 1 for each normalized one."""
    return (*x.shape[: x.dim() - len(normalized)], *(1,) * len(normalized))


def stats_dtype_for(x: torch.Tensor) -> torch.dtype:
    """The dtype of ``torch.native_layer_norm``'s mean and rstd for ``x``: float32 on
    CUDA for half inputs, the input's dtype otherwise."""
    half = x.dtype in (torch.float16, torch.bfloat16)
    return torch.float32 if half and x.device.type == "cuda" else x.dtype


def reference(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return torch.native_layer_norm(x, list(normalized_shape), weight, bias, eps)
