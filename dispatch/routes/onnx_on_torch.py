"""Calls of an onnxrt region whose answer ONNX Runtime's session cannot give as
torch does: torch runs them where the region's inputs are at hand (under
``torch.compile``), and a lowered region refuses them with a clear error.

- a NaN reached an op that ORT passes over (``onnx_nan.flag_nan_inputs``);
- the call's shapes break the guards its model was exported under
  (``onnx_guards.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from ..errors import InputSpecError
from .base import CompiledFn
from .onnx_guards import shape_check
from .onnx_outputs import traced_form

log = logging.getLogger("dispatch")


class TorchWhereNaN:
    """A flagged session's runner (``onnx_nan.flag_nan_inputs``): ORT's outputs, or
    where a NaN reached an op that ORT passes over, torch's, from the region run
    by torch on the same call. Computing torch's answer inside the model instead
    made hf_resnet's ORT run 28% slower."""

    def __init__(self, run: CompiledFn, gm: torch.fx.GraphModule) -> None:
        self.run = run
        self.gm = gm
        self.form = traced_form(gm)
        self.said = False

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        *outputs, nan_seen = self.run(*args)
        if nan_seen.item():
            if not self.said:
                self.said = True
                log.info(
                    "onnxrt region: a NaN (or -inf, in a padded max pooling) reached an op where "
                    "ONNX Runtime's answer is not torch's; torch runs each such call of this region"
                )
            return run_by_torch(self.gm, *args)
        return self.form(outputs) if self.form is not None else tuple(outputs)


def run_by_torch(gm: torch.fx.GraphModule, *args: Any) -> tuple[Any, ...]:
    """The region's outputs as torch computes them, in the form a session's runner returns."""
    result = gm(*args)
    return tuple(result) if isinstance(result, (list, tuple)) else (result,)


def refusing_other_shapes(run: CompiledFn, guards: tuple[str, ...]) -> CompiledFn:
    """``run``, raising ``InputSpecError`` for a call whose shapes break the guards
    its export holds under: a lowered region has no torch beside it to run them."""
    holds = shape_check(guards)

    def checked(*args: Any) -> Any:
        if not holds(args):
            raise InputSpecError(
                "onnxrt: this region's ONNX model computes what torch does only for inputs where "
                f"{' and '.join(guards)} (region arguments by position); this call's shapes break "
                "that. Instead: lower the model with example inputs of these shapes, or run it "
                'under torch.compile(backend="auto"), which exports once per such class of shapes'
            )
        return run(*args)

    return checked
