"""Whether the weights an ONNX Runtime region baked in are still the model's.

A baked weight is a copy: ONNX Runtime folds it (BatchNorm into Conv) and
pre-packs it (GEMM weights), so a later change to the model's tensor never
reaches the session. Three kinds of change are seen, on every call:

- an in-place op on the tensor itself (an optimizer step, ``load_state_dict``,
  a ``mul_`` under ``no_grad``): its version counter moves;
- ``p.data = t``: its address moves, its version does not;
- an in-place op through ``p.data`` (an EMA teacher's ``p.data.mul_(m)``,
  ``p.data.copy_(q)``, an initialiser's ``p.data.normal_()``): ``.data`` is a
  tensor with a version counter of its own, so neither moves. These are seen
  by comparing the first and last ``EDGE_BYTES`` of each weight's memory with
  what was baked. An edit through ``.data`` that leaves both ends of a weight
  alone is not seen (README, "ONNX export"), nor is such an edit of an
  inference tensor (a model built under ``inference_mode``), which has no
  version counter to move.

The bytes are read by one numpy gather over the span of memory that holds the
weights, at the addresses of their edges: 8 µs for efficientnet_b0's 311
weights, where ``torch.cat`` of two slices per weight took 72 µs (0.12 µs a
slice; 312 µs once the slices passed torch's grain size and ran on the OpenMP
pool) and Dynamo's own guards cost about 0.8 µs per weight. Torch has no
cheaper way to see a write through ``.data``. Reading by address is safe
because the gather runs only after every weight's address was found
unchanged, and this object holds each weight's storage, so that memory is
still the weight's.

The byte check runs on CPU weights only: on CUDA, reading them would
synchronise the device on every call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

EDGE_BYTES = 16  # compared at each end of a weight's memory


class BakedWeights:
    """The state of the weights at ``positions`` of a region's inputs when they
    were baked; ``changed(args)`` says whether any is no longer so."""

    def __init__(self, args: Sequence[Any], positions: Sequence[int]) -> None:
        import numpy as np  # onnxruntime's dependency: this module serves the onnxrt route

        tensors = [args[i] for i in positions]
        pairs = list(zip(positions, tensors))
        self.versions = [(i, t._version, t.data_ptr()) for i, t in pairs if not t.is_inference()]
        # Inference tensors (made under inference_mode) have no version counter.
        self.addresses = [(i, t.data_ptr()) for i, t in pairs if t.is_inference()]
        on_cpu = [t for t in tensors if t.device.type == "cpu" and t.numel()]
        self.storages = [t.untyped_storage() for t in on_cpu]  # keeps the memory read below alive
        self.memory: Any = None
        if not on_cpu:
            return
        addresses = np.concatenate([_edge_addresses(t) for t in on_cpu])
        base = int(addresses.min())
        span = int(addresses.max()) - base + 1
        # A uint8 view of the address range (nothing is read until the gather).
        self.memory = np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8)), shape=(span,))
        self.offsets = (addresses - base).astype(np.intp)
        self.baked = self.memory[self.offsets]

    def changed(self, args: Sequence[Any]) -> bool:
        for i, version, ptr in self.versions:
            t = args[i]
            if t._version != version or t.data_ptr() != ptr:
                return True
        for i, ptr in self.addresses:
            if args[i].data_ptr() != ptr:
                return True
        if self.memory is None:
            return False
        return bool((self.memory[self.offsets] != self.baked).any())


def _edge_addresses(t: torch.Tensor) -> Any:
    """The addresses of the first and last ``EDGE_BYTES`` bytes of ``t``'s memory
    (all of it where that is shorter), as a numpy array."""
    import numpy as np

    start = t.data_ptr()
    # One past the last byte any element covers (its strides may leave gaps).
    extent = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
    if extent <= 2 * EDGE_BYTES:
        return np.arange(start, start + extent, dtype=np.uint64)
    end = start + extent
    return np.concatenate(
        [
            np.arange(start, start + EDGE_BYTES, dtype=np.uint64),
            np.arange(end - EDGE_BYTES, end, dtype=np.uint64),
        ]
    )
