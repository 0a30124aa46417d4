"""The ``eager`` route: the region's aten graph, run op by op by PyTorch itself.

It runs every op on every device, and it is the fallback of last resort.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from .base import CompiledFn, Route
from .registry import registry


@registry.register
class EagerRoute(Route):
    name = "eager"
    devices = frozenset({"cpu", "cuda", "mps", "xpu", "meta", "hpu", "privateuseone"})

    def serves_device(self, device: str) -> bool:
        return True

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        return gm.forward
