"""Triton kernels for the ``triton`` route, one family per file (installed as ``dispatch.kernels``).

Each module names the aten op(s) it replaces, exposes a launcher and a torch
``reference`` that its tests compare against. ``triton`` is imported lazily:
``import dispatch.kernels`` works without it; calling a launcher needs it (and CUDA
tensors, or CPU tensors under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["layer_norm", "linear_act", "rms_norm", "softmax"]


def __getattr__(name: str) -> Any:
    if name == "softmax":
        from .softmax import softmax

        return softmax
    if name == "layer_norm":
        from .layer_norm import layer_norm

        return layer_norm
    if name == "rms_norm":
        from .rms_norm import rms_norm

        return rms_norm
    if name == "linear_act":
        from .matmul import linear_act

        return linear_act
    raise AttributeError(f"module 'dispatch.kernels' has no attribute {name!r}")
