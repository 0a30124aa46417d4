"""Matmul with a fused epilogue: replaces ``aten.addmm`` (or ``aten.mm`` followed
by ``aten.add`` of a bias) followed by an activation: ``aten.relu``,
``aten.gelu`` (``approximate="none"`` or ``"tanh"``) or ``aten.silu``.

``act(a @ b + bias)`` in one kernel: tiles of ``a`` and ``b`` are multiplied
with ``tl.dot`` into a float32 accumulator, and bias and activation are
applied to the tile before its only store. ``bias`` is any tensor that
broadcasts to the (M, N) result (``(N,)``, ``(1, N)``, ``(M, 1)``, ``(M, N)``, a
single element): it is read through its broadcast strides. The result has
``out_dtype`` (torch's promotion of the matmul and bias dtypes); where that is
wider than the inputs, the product is rounded to the input dtype before the
bias is added, as ``mm`` followed by ``add`` rounds it in eager. Offsets are
int64 where a tensor spans more than 2**31 elements. Block sizes come from
``triton.autotune`` (keyed on M, N, K); under the interpreter one small
configuration is used, since autotuning there would only time numpy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import INT32_LIMIT, check_device, interpreting, max_offset, on_device

ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}

if interpreting():
    _CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=1)]
else:
    _CONFIGS = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m, n, k, w, s in [
            (128, 128, 32, 8, 3),
            (128, 64, 32, 4, 4),
            (64, 128, 32, 4, 4),
            (64, 64, 32, 4, 4),
            (128, 256, 64, 8, 3),
            (32, 64, 32, 4, 5),
            (16, 64, 64, 4, 4),
        ]
    ]


@triton.jit
def _apply_activation(y, ACT: tl.constexpr):
    if ACT == 1:
        # NaN stays NaN, as in torch.relu: the default (NONE) lowers to a max that drops it.
        y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
    elif ACT == 2:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        # tanh written with exp of a non-positive number only: no overflow.
        e = tl.exp(-2.0 * tl.abs(inner))
        tanh = (1.0 - e) / (1.0 + e)
        y = 0.5 * y * (1.0 + tl.where(inner < 0, -tanh, tanh))
    elif ACT == 4:
        y = y / (1.0 + tl.exp(-y))
    return y


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _linear_act_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_bias_m,
    stride_bias_n,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    UPCAST: tl.constexpr,
    ROUND_PRODUCT: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(ks[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, allow_tf32=False)
    if ROUND_PRODUCT:
        acc = acc.to(a_ptr.dtype.element_ty).to(tl.float32)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_BIAS:
        bias = tl.load(
            bias_ptr + rm[:, None] * stride_bias_m + rn[None, :] * stride_bias_n, mask=mask, other=0.0
        )
        acc += bias.to(tl.float32)
    acc = _apply_activation(acc, ACT)
    tl.store(
        c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask
    )


def linear_act(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``act(a @ b + bias)`` for 2-D ``a`` (M, K) and ``b`` (K, N), any strides.

    ``b`` is typically ``weight.t()`` of a Linear layer; ``bias`` is any tensor
    that broadcasts to (M, N). ``out_dtype`` defaults to torch's promotion of
    the operands' dtypes."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"kernels.linear_act: activation {activation!r} not in {list(ACTIVATIONS)}")
    check_device(a, b, bias)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(
            f"kernels.linear_act: {tuple(a.shape)} {a.dtype} @ {tuple(b.shape)} {b.dtype} do not chain"
        )
    M, K = a.shape
    N = b.shape[1]
    if out_dtype is None:
        out_dtype = torch.promote_types(a.dtype, bias.dtype) if bias is not None else a.dtype
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if bias is not None:
        if torch.broadcast_shapes(bias.shape, (M, N)) != (M, N):
            raise ValueError(f"kernels.linear_act: bias {tuple(bias.shape)} does not broadcast to {(M, N)}")
        bias = bias.expand(M, N)  # a view: broadcast dimensions get stride 0
    int64 = max(max_offset(t) for t in (a, b, out)) > INT32_LIMIT
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))  # noqa: E731
    with on_device(a):
        _linear_act_kernel[grid](
            a,
            b,
            bias if bias is not None else out,
            out,
            M,
            N,
            K,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            out.stride(1),
            bias.stride(0) if bias is not None else 0,
            bias.stride(1) if bias is not None else 0,
            HAS_BIAS=bias is not None,
            ACT=ACTIVATIONS[activation],
            # The interpreter computes tl.dot in numpy, which has no bfloat16.
            UPCAST=interpreting() and a.dtype == torch.bfloat16,
            ROUND_PRODUCT=out_dtype.itemsize > a.dtype.itemsize,
            INT64=int64,
        )
    return out


def reference(a, b, bias=None, activation="none", out_dtype=None):
    out_dtype = out_dtype or (torch.promote_types(a.dtype, bias.dtype) if bias is not None else a.dtype)
    y = a.float() @ b.float()
    if out_dtype.itemsize > a.dtype.itemsize:
        y = y.to(a.dtype).float()
    if bias is not None:
        y = y + bias.float()
    y = {
        "none": lambda t: t,
        "relu": torch.relu,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "silu": torch.nn.functional.silu,
    }[activation](y)
    return y.to(out_dtype)
