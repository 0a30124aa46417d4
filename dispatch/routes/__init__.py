"""Routes and their registry. Importing this registers the built-in routes."""

from . import cudagraphs, eager, inductor, onnxrt, triton  # noqa: F401  (registration side effect)
from .base import Availability, CompiledFn, PreprocessResult, RegionProgram, Route, WrappingRoute
from .registry import RouteRegistry, registry

__all__ = [
    "Availability",
    "CompiledFn",
    "PreprocessResult",
    "RegionProgram",
    "Route",
    "RouteRegistry",
    "WrappingRoute",
    "registry",
]
