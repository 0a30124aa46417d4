"""Which aten ops the ONNX exporter can translate, asked of the exporter itself.

An op is translatable when torchlib registers an ONNX function for it, or when the
exporter's decomposition table rewrites it into other aten ops. Nothing here is
a hand-written list.
"""

from __future__ import annotations

import functools
import logging

import torch


@functools.cache
def _registered_names() -> frozenset[str]:
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    # torchlib warns about every torchvision op it cannot find; that is noise here.
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        registry = ONNXRegistry.from_torchlib()
    finally:
        logger.setLevel(level)
    return frozenset(k if isinstance(k, str) else str(k) for k in registry.functions)


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
