"""Routes and their registry. Importing this registers the built-in routes."""

from . import eager, inductor, onnxrt  # noqa: F401  (registration side effect)
from .base import Availability, CompiledFn, Route
from .registry import RouteRegistry, registry

__all__ = ["Availability", "CompiledFn", "Route", "RouteRegistry", "registry"]
