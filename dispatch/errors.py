"""Errors raised by dispatch.

Every error is a ``DispatchError`` (a ``RuntimeError``), so ``except RuntimeError``
in user code keeps working. Messages name the route, the device, the op and what
to do instead.
"""

from __future__ import annotations

import re

# Colour codes some libraries put in their messages (torch.onnx.export's steps).
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def error_line(error: BaseException, width: int = 200) -> str:
    """``error`` as its type and the first line of its message, cut at ``width``:
    what a reason in ``explain`` or a warning quotes of an exception.

    An error raised from another (``raise ... from``) is quoted by its first
    cause, which says what went wrong where the outer one says where:
    ``torch.onnx.export`` raises "ConversionError: Failed to convert the exported
    program to an ONNX model" from "No ONNX function found for prims.hypot"."""
    root, seen = error, {id(error)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    line = _first_line(root)
    if root is not error:
        line += f" (raised as {type(error).__name__})"
    return line[:width]


def _first_line(error: BaseException) -> str:
    text = _TERMINAL_CODES.sub("", f"{type(error).__name__}: {error}")
    return next((line for line in text.splitlines() if line.strip()), type(error).__name__)


class DispatchError(RuntimeError):
    """Base class of every error that dispatch raises on purpose."""


class UnsupportedDeviceError(DispatchError):
    """A route was forced onto a device it cannot serve (``mps`` with ``inductor``)."""


class RouteUnavailableError(DispatchError):
    """A forced route whose dependency or hardware is missing on this machine."""


class UnsupportedOpError(DispatchError):
    """Under ``strict``, an op that none of the allowed routes can run."""


class RouteFailedError(DispatchError):
    """A forced route failed to compile or run a region and ``strict`` forbids falling back."""


class ConfigError(DispatchError, ValueError):
    """An unknown option, or an option or environment variable with a bad value."""


class LoweringError(DispatchError):
    """``dispatch.lower`` cannot make a saved program of this model (an export that
    fails, a program that updates its inputs or buffers, a region that cannot be saved)."""


class ProgramFileError(DispatchError):
    """A saved program that cannot be read: truncated or altered, a format this
    version does not read, or an operator or type this process has not registered."""


class InputSpecError(DispatchError, ValueError):
    """A lowered program called with inputs that do not match what it was lowered for."""
