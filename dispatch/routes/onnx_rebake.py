"""Another set of a region's weights baked into its ONNX model without exporting again.

One Dynamo graph runs with several sets of weights where a module's code is
shared: the blocks of a model compiled block by block (regional compilation,
which PyTorch recommends for a shorter cold start), every layer of a model with
a graph break inside its layer, the instances of one model class.
``BakedRegion`` gives each set a session of its own, and exporting each set from
the start cost about 1.1 s a set for a ViT block on 2 cores (``torch.export``
0.17 s, the exporter's decompositions 0.70, translation 0.08, the ONNX optimizer
0.15): 13 s of a 12-block ViT's 18 s first call, where inductor compiles the
block once.

The exporter's program after its decompositions (the traced program itself
where they had nothing to do, ``onnx_translate.py``) does not depend on the
values of the baked weights (an aten graph has no branch on data), so
``Rebake`` keeps it, its weights swapped for meta tensors, and for another set
puts that set's tensors in their place and runs only translation and the
optimizer again: the optimizer folds BatchNorm into convolutions and
constant expressions of the new values exactly as it did for the first set.
The exporter has no public entry for the steps after decomposition; where its
private ones are missing, every set is exported from the start, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .onnx_model import OnnxModel
from .onnx_registry import exporters_quiet
from .onnx_translate import translation

log = logging.getLogger("dispatch")


class Rebake:
    """The decomposed program of one region export, whose buffers ``buffers``
    (region input position -> buffer name) are the baked weights; ``model(args)``
    is the ONNX model with the weights at those positions of ``args`` baked in,
    made by ``finish`` from the optimised ONNX graph as the first export was.

    Between calls the program holds meta tensors only: a set's memory is let go
    with its model (``BakedRegion`` releases a deleted model's set)."""

    def __init__(self, program: Any, buffers: Mapping[int, str], finish: Callable[[Any], OnnxModel]) -> None:
        self.program = program
        self.buffers = dict(buffers)
        self.finish = finish
        state = program.state_dict
        self.stripped = {name: state[name].to("meta") for name in self.buffers.values()}
        state.update(self.stripped)
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls, onnx_program: Any, buffers: Mapping[int, str], finish: Callable[[Any], OnnxModel]
    ) -> Rebake | None:
        """The ``Rebake`` of an ``ONNXProgram``, or None where the exporter keeps no
        program or has not the steps this needs."""
        program = getattr(onnx_program, "exported_program", None)
        if program is None or translation() is None:
            return None
        if not all(name in program.state_dict for name in buffers.values()):
            return None  # a weight the exporter did not keep as a buffer
        return cls(program, buffers, finish)

    def model(self, args: Sequence[Any]) -> OnnxModel | None:
        """The ONNX model with the weights in ``args`` baked in, or None where they
        are not the shapes and dtypes of the first set's, or where translating
        failed (the caller exports them from the start)."""
        translate = translation()
        assert translate is not None, "Rebake.of checked the exporter's steps"
        tensors = {name: args[i].detach() for i, name in self.buffers.items()}
        for name, tensor in tensors.items():
            first = self.stripped[name]
            if tensor.shape != first.shape or tensor.dtype != first.dtype:
                return None
        state = self.program.state_dict
        # One program serves every set: two threads baking at once (shape classes
        # of one region) would each translate the other's weights.
        with self._lock:
            state.update(tensors)
            try:
                with exporters_quiet(), torch.no_grad():
                    return self.finish(translate(self.program).model)
            except Exception as error:  # the exporter's private steps; an export is the way that holds
                log.info(
                    "onnxrt: baking another set of weights into an earlier export failed (%s); exporting",
                    error,
                )
                return None
            finally:
                state.update(self.stripped)
