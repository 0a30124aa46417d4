"""dispatch: one ``torch.compile`` backend, ``auto``, that routes every region of
every graph to the runtime that runs it best (ONNX Runtime, Inductor, eager, ...).

    import torch
    model = torch.compile(model, backend="auto")      # works without `import dispatch`
    print(dispatch.explain(model, x))                  # what ran where, and why

    program = dispatch.lower(model, (x,))              # one graph, routed, no Dynamo per call
    program.save("model.dispatch"); dispatch.load("model.dispatch")(x)

Importing ``dispatch`` is light: routes import their runtimes only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigError,
    DispatchError,
    InputSpecError,
    LoweringError,
    ProgramFileError,
    RouteFailedError,
    RouteUnavailableError,
    UnsupportedDeviceError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from .explanation import Explanation
    from .program import LoweredProgram
    from .region import Plan, Region

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DispatchError",
    "Explanation",
    "InputSpecError",
    "LoweredProgram",
    "LoweringError",
    "Plan",
    "ProgramFileError",
    "Region",
    "RouteFailedError",
    "RouteUnavailableError",
    "UnsupportedDeviceError",
    "UnsupportedOpError",
    "auto",
    "available_routes",
    "explain",
    "load",
    "lower",
    "plan",
]


def auto(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """The ``torch.compile`` backend (entry point ``torch_dynamo_backends: auto``)."""
    from .backend import auto as backend

    return backend(gm, example_inputs, **kwargs)


auto.__name__ = "auto"


def plan(model: Any, example_inputs: Any, *, device: str | None = None, **options: Any) -> Plan:
    """The routing decision for one FX graph (or module) without compiling or running it;
    ``device="mps"`` plans for a device this machine need not have."""
    from .dry_run import plan as plan_fn

    return plan_fn(model, example_inputs, device=device, **options)


def explain(fn: Any, *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn`` with ``auto``, run it once, and report what ran where."""
    from .explanation import explain as explain_fn

    return explain_fn(fn, *args, **kwargs)


def lower(
    model: Any, args: Any, kwargs: Any = None, *, dynamic_shapes: Any = None, **options: Any
) -> LoweredProgram:
    """``model`` exported (``torch.export``), planned and lowered route by route
    into a ``LoweredProgram`` that runs without Dynamo; ``options`` as ``auto``'s."""
    from .lowering import lower as lower_fn

    return lower_fn(model, args, kwargs, dynamic_shapes=dynamic_shapes, **options)


def load(path: Any) -> LoweredProgram:
    """The program that ``LoweredProgram.save`` wrote; runs no Dynamo, AOTAutograd
    or export, and imports only the runtimes its regions use."""
    from .archive import load_program

    return load_program(path)


def available_routes() -> dict[str, dict[str, Any]]:
    """Each route: available yes/no, version, and the reason when it is not."""
    from .routes import registry

    return {route.name: route.available().to_dict() for route in registry}


def __getattr__(name: str) -> Any:
    if name in ("Plan", "Region"):
        from . import region

        return getattr(region, name)
    if name == "Explanation":
        from .explanation import Explanation

        return Explanation
    if name == "LoweredProgram":
        from .program import LoweredProgram

        return LoweredProgram
    raise AttributeError(f"module 'dispatch' has no attribute {name!r}")


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # When torch is loading our entry point right now, _BACKENDS holds it and
    # lookup_backend registers ``auto`` itself; registering here too would clash.
    if "auto" not in _COMPILER_FNS and _BACKENDS.get("auto") is None:
        register_backend(compiler_fn=auto, name="auto")


_register()
