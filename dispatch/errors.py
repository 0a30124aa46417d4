"""Errors raised by dispatch.

Every error is a ``DispatchError`` (a ``RuntimeError``), so ``except RuntimeError``
in user code keeps working. Messages name the route, the device, the op and what
to do instead.
"""

from __future__ import annotations


def error_line(error: BaseException, width: int = 200) -> str:
    """``error`` as its type and the first line of its message, cut at ``width``:
    what a reason in ``explain`` or a warning quotes of an exception."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:width]


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
