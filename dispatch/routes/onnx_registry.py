"""The ONNX exporter's registry of torchlib translations, built once per process
and cheaply; the exporter's logging silenced.

``ONNXRegistry.from_torchlib`` parses the Python source of every torchlib
function (about 500) into ONNX IR and infers each one's signature before the
first export: 1.7 s of a cold first call (AMD EPYC, AVX2), where an ORT-routed
model's whole first call takes 3 to 9 s. An export translates a few dozen of
those functions. So the registry here holds the same functions under the same
names, and each signature is inferred, by torch's own code, the first time
the exporter dispatches a node to it. The models exported are byte for byte
those of the full registry (``tests/test_onnx_registry.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import warnings
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("dispatch")

# ONNX's own Gelu op arrived in opset 20.
_GELU_OPSET = 20


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The loggers ``names`` at ERROR for the block, their own levels restored after."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [q.level for q in loggers]
    for q in loggers:
        q.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for q, level in zip(loggers, levels):
            q.setLevel(level)


# The exporter and the ONNX optimizer passes it runs log their progress and
# notes (onnx_ir: "Skipped deduplication of initializer ...") at WARNING; none
# of it is the user's to act on, and a failed export raises anyway.
_EXPORT_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


@contextlib.contextmanager
def exporters_quiet() -> Iterator[None]:
    """The exporter's loggers and warnings silenced for the block."""
    with quiet_loggers(*_EXPORT_LOGGERS), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def export_opset() -> int:
    """The ONNX opset regions are exported at: ``torch.onnx.export``'s default (20 in
    torch 2.13), and never below 20. The registry's own default is torchlib's floor
    (18), where ``gelu`` becomes an Erf chain that ONNX Runtime does not fuse back:
    ConvNeXt's 12 GELUs ran as 60 ops and 24 more layout reorders, 1.27x the
    session time."""
    from torch.onnx import _constants

    return max(int(getattr(_constants, "ONNX_DEFAULT_OPSET", _GELU_OPSET)), _GELU_OPSET)


@functools.cache
def onnx_registry() -> Any:
    """The exporter's registry of torchlib translations at ``export_opset()``, built
    once per process.

    ``torch.onnx.export`` builds a full one on every call (0.8 s warm); the onnxrt
    route hands this one to the exporter instead. Where torch's or onnxscript's
    private names moved, the full registry is built."""
    # torchlib warns about every torchvision op it cannot find; that is noise here.
    with quiet_loggers("torch.onnx._internal.exporter._registration"):
        try:
            return deferred_registry(export_opset())
        except (ImportError, AttributeError, TypeError) as error:
            log.debug("onnxrt: the full torchlib registry is built (%s)", error)
            from torch.onnx._internal.exporter._registration import ONNXRegistry

            return ONNXRegistry.from_torchlib(opset_version=export_opset())


def deferred_registry(opset: int) -> Any:
    """``ONNXRegistry.from_torchlib(opset)``'s functions, each signature inferred on
    the first dispatch to it. Mirrors ``from_torchlib`` and onnxscript's
    ``get_torchlib_ops``, less their eager parse of every function."""
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401  (registers torchlib's functions)
    from onnxscript.function_libs.torch_lib.registration import default_registry
    from torch.onnx._internal.exporter import _registration
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    registry = _deferred_registry_class(_registration.ONNXRegistry)()
    registry._opset_version = opset
    for meta in _torchlib_registry.get_torchlib_ops():
        registry._register(meta.fx_target, meta)
    meta_class = _deferred_meta_class(_registration.OnnxDecompMeta)
    for name, functions in default_registry.items():
        if name.startswith("internal::"):
            continue  # onnxscript's own helpers, no aten op
        target = _registration._get_overload(name)
        if target is None:
            continue
        for function, is_complex in [(f, False) for f in functions.overloads] + [
            (f, True) for f in functions.complex
        ]:
            meta = meta_class(onnx_function=function, fx_target=target, signature=None, is_complex=is_complex)
            registry._register(target, meta)
    registry._cleanup_registry_based_on_opset_version()
    return registry


@functools.cache
def _deferred_meta_class(base: type) -> type:
    @dataclasses.dataclass
    class DeferredDecompMeta(base):
        """An ``OnnxDecompMeta`` whose signature is inferred on first use."""

        def __post_init__(self) -> None:
            pass

        def resolve(self) -> bool:
            """Whether the signature is known: inferred by torch's own code, as at
            construction; a function it fails on is left out, as ``from_torchlib``
            leaves it out of the registry."""
            if self.signature is None:
                try:
                    base.__post_init__(self)  # type: ignore[attr-defined]
                except Exception:
                    return False
            return True

    return DeferredDecompMeta


@functools.cache
def _deferred_registry_class(base: type) -> type:
    class DeferredRegistry(base):
        """An ``ONNXRegistry`` that infers a function's signature when the exporter
        first asks for the function."""

        def get_decomps(self, target: Any) -> list[Any]:
            decomps = super().get_decomps(target)
            return [meta for meta in decomps if not hasattr(meta, "resolve") or meta.resolve()]

    return DeferredRegistry
