"""Softmax and layer norm of ``kernels/`` as torch operators, for a graph that inductor compiles whole.

``kernel_trial.py`` decomposes ``_softmax`` and ``native_layer_norm`` into these
ops while AOTAutograd traces, and inductor compiles the graph in one piece: it
calls each op as an extern kernel, fuses the ops around it into its own
kernels, and CUDA graph trees capture it with the rest, where the triton
route's own regions cut the graph in three at every kernel.

``torch.library.custom_op``, not ``triton_op``: triton_op's fake implementation
is its Python function, which launches the kernel on fake tensors, and the
Triton interpreter (the only Triton where CI runs, without a GPU) cannot; a
custom op with a fake implementation of its own runs in both places. Inductor
calls it as an extern kernel, one launch per call, captured under CUDA graphs.

The RMS-norm and matmul kernels match several aten ops (no single op to
decompose), so they stay regions of the triton route.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

NAMESPACE = "dispatch_kernels"


@functools.cache
def kernel_ops() -> dict[str, Any]:
    """The ops by pattern name, registered on first use (once per process)."""
    from torch.library import custom_op

    @custom_op(f"{NAMESPACE}::softmax", mutates_args=())
    def softmax(x: torch.Tensor) -> torch.Tensor:
        from dispatch.kernels.softmax import softmax as kernel

        return kernel(x)

    @softmax.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape)

    @custom_op(f"{NAMESPACE}::layer_norm", mutates_args=())
    def layer_norm(
        x: torch.Tensor,
        shape: list[int],
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        stats_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from dispatch.kernels.layer_norm import layer_norm as kernel

        return kernel(x, shape, weight, bias, eps, stats_dtype=stats_dtype)

    @layer_norm.register_fake
    def _(
        x: torch.Tensor,
        shape: list[int],
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        stats_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from dispatch.kernels.layer_norm import stats_shape

        stats = stats_shape(x, shape)
        return (
            x.new_empty(x.shape),
            x.new_empty(stats, dtype=stats_dtype),
            x.new_empty(stats, dtype=stats_dtype),
        )

    return {
        "softmax": torch.ops.dispatch_kernels.softmax.default,
        "layer_norm": torch.ops.dispatch_kernels.layer_norm.default,
    }
