"""What a lowered program takes: each input's dtype, device and shape, with its
dynamic dimensions and their ranges, checked on every call.

A dimension is an ``int`` or the name of a symbol of ``torch.export``'s
(``"s31"``): inputs sharing a symbol must agree, and each symbol stays within
the range export proved. The specs are JSON in a saved program's manifest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import InputSpecError


@dataclass(frozen=True)
class InputSpec:
    """One flattened input: a tensor (dtype, device, shape) or a constant that
    export specialised (``value``)."""

    name: str
    dtype: str | None = None
    device: str | None = None
    shape: tuple[int | str, ...] = ()
    value: Any = None

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    def describe(self, ranges: Mapping[str, tuple[int, int | None]]) -> str:
        if not self.is_tensor:
            return f"the constant {self.value!r}"
        dims = ", ".join(str(d) for d in self.shape)
        bounds = [
            f"{s} in {ranges[s][0]}..{ranges[s][1] if ranges[s][1] is not None else 'inf'}"
            for s in dict.fromkeys(d for d in self.shape if isinstance(d, str))
            if s in ranges
        ]
        where = f" ({', '.join(bounds)})" if bounds else ""
        return f"a {self.dtype} tensor of shape [{dims}] on {self.device}{where}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "device": self.device,
            "shape": list(self.shape),
            "value": self.value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputSpec:
        shape = tuple(d if isinstance(d, (int, str)) else _bad(f"dimension {d!r}") for d in data["shape"])
        return cls(str(data["name"]), data["dtype"], data["device"], shape, data.get("value"))


def _bad(what: str) -> Any:
    raise ValueError(f"malformed input spec: {what}")


class InputSpecs:
    """Every flattened input's spec, checked against a call's inputs."""

    def __init__(self, specs: Sequence[InputSpec], ranges: Mapping[str, tuple[int, int | None]]) -> None:
        self.specs = list(specs)
        self.ranges = dict(ranges)
        # Per call only tensors' fields are compared: the torch objects, made once.
        self._expected = [
            (
                getattr(torch, s.dtype) if s.dtype else None,
                torch.device(s.device) if s.device else None,
                torch.Size([int(d) for d in s.shape]) if all(isinstance(d, int) for d in s.shape) else None,
            )
            for s in self.specs
        ]
        for dtype, _, _ in self._expected:
            if dtype is not None and not isinstance(dtype, torch.dtype):
                raise ValueError("malformed input spec: not a dtype")

    def check(self, flat: Sequence[Any]) -> None:
        """Raise ``InputSpecError`` naming the input and its expected spec."""
        if len(flat) != len(self.specs):
            names = ", ".join(s.name for s in self.specs)
            raise InputSpecError(f"the program takes {len(self.specs)} inputs ({names}), got {len(flat)}")
        sizes: dict[str, int] | None = None
        for value, spec, (dtype, device, static) in zip(flat, self.specs, self._expected):
            if dtype is None:
                if value != spec.value:
                    self._fail(spec, value, "it was lowered for")
                continue
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.device != device:
                self._fail(spec, value)
            if static is not None:
                if value.shape != static:
                    self._fail(spec, value)
                continue
            if value.dim() != len(spec.shape):
                self._fail(spec, value)
            sizes = {} if sizes is None else sizes
            for expected, size in zip(spec.shape, value.shape):
                if isinstance(expected, int):
                    if size != expected:
                        self._fail(spec, value)
                    continue
                seen = sizes.setdefault(expected, size)
                low, high = self.ranges.get(expected, (0, None))
                if seen != size or size < low or (high is not None and size > high):
                    self._fail(
                        spec,
                        value,
                        f"{expected} is {seen} in another input; expected" if seen != size else "expected",
                    )

    def _fail(self, spec: InputSpec, value: Any, expected: str = "expected") -> None:
        if isinstance(value, torch.Tensor):
            got = f"a {str(value.dtype).removeprefix('torch.')} tensor of shape [{', '.join(map(str, value.shape))}] on {value.device}"
        else:
            got = f"{type(value).__name__} {value!r:.60}"
        raise InputSpecError(
            f"input {spec.name}: {expected} {spec.describe(self.ranges)}, got {got}. "
            "Instead: pass inputs like the ones the program was lowered with, or lower it again "
            "(dynamic_shapes= makes a dimension dynamic)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "leaves": [s.to_dict() for s in self.specs],
            "ranges": {k: list(v) for k, v in self.ranges.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputSpecs:
        ranges = {str(k): (int(v[0]), None if v[1] is None else int(v[1])) for k, v in data["ranges"].items()}
        return cls([InputSpec.from_dict(s) for s in data["leaves"]], ranges)
