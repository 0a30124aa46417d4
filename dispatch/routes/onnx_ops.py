"""Which aten ops the ONNX exporter can translate, asked of the exporter itself.

An op is translatable when torchlib registers an ONNX function for it, or when the
exporter's decomposition table rewrites it into other aten ops. Nothing here is
a hand-written list.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch


@functools.cache
def onnx_registry() -> Any:
    """The exporter's registry of torchlib translations, built once per process.

    ``torch.onnx.export`` builds a new one on every call (0.8 s warm here); the
    onnxrt route hands this one to the exporter instead."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    # torchlib warns about every torchvision op it cannot find; that is noise here.
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return ONNXRegistry.from_torchlib()
    finally:
        logger.setLevel(level)


@functools.cache
def _registered_names() -> frozenset[str]:
    return frozenset(k if isinstance(k, str) else str(k) for k in onnx_registry().functions)


@functools.cache
def _decomposable() -> frozenset[str]:
    names = {op.name() for op in torch.export.default_decompositions() if hasattr(op, "name")}
    names.update(op.name() for op in torch._decomp.decomposition_table if hasattr(op, "name"))
    return frozenset(names)


def translatable(target: object) -> bool:
    """True where ``torch.onnx.export`` can turn the aten op ``target`` into ONNX."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = target.name()
    return name in _registered_names() or name in _decomposable()
