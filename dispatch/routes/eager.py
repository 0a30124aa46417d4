"""The ``eager`` route: the region's aten graph, run op by op by PyTorch itself.

It runs every op on every device, and it is the fallback of last resort. In a
saved program an eager region is its aten graph, stored as data (every region's
graph is: ``dispatch/archive.py``), so its payload is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch.fx

from .base import CompiledFn, PreprocessResult, RegionProgram, Route, op_handles
from .registry import registry


@registry.register
class EagerRoute(Route):
    name = "eager"
    devices = frozenset({"cpu", "cuda", "mps", "xpu", "meta", "hpu", "privateuseone"})

    def serves_device(self, device: str) -> bool:
        return True

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        return gm.forward

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        return PreprocessResult(b"", op_handles(region.gm), dict(compile_specs))

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        return region.gm.forward
