"""The ``inductor`` route: TorchInductor (C++/OpenMP on CPU, Triton on CUDA).

The region is compiled with ``torch._inductor.compile`` on the real inputs of its
first call. Inductor never runs on ``mps``: forcing it there is an
``UnsupportedDeviceError``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .base import Availability, CompiledFn, Route
from .registry import registry


@registry.register
class InductorRoute(Route):
    name = "inductor"
    devices = frozenset({"cpu", "cuda"})

    def available(self) -> Availability:
        compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if compiler is None and not torch.cuda.is_available():
            return Availability(False, torch.__version__, "no C++ compiler (g++/clang++) on PATH")
        return Availability(True, torch.__version__)

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        from torch._inductor import compile as inductor_compile

        return inductor_compile(gm, list(example_inputs))
