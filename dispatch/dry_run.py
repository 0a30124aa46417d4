"""Plans for a device this machine may not have: a model and its inputs as fake tensors there.

    plan = dispatch.plan(model, (x,), device="mps")     # what auto would do on a Mac
    plan = dispatch.plan(model, (x,), device="cuda")    # ... or on a GPU

``FakeTensorMode`` makes tensors that carry a device, shape and dtype but no
memory, on any device, so a plan needs neither the hardware nor the model's
memory twice: the user's model is left as it is, and a copy that shares
nothing but fake weights is planned.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .errors import DispatchError


def on_device(
    model: torch.nn.Module, example_inputs: Sequence[Any], device: str
) -> tuple[torch.nn.Module, list[Any]]:
    """A copy of ``model`` with fake weights on ``device``, and fake inputs there."""
    mode = FakeTensorMode(allow_non_fake_inputs=False)

    def fake(t: torch.Tensor) -> torch.Tensor:
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    memo: dict[int, Any] = {}
    for t in (*model.parameters(), *model.buffers()):
        memo[id(t)] = (
            torch.nn.Parameter(fake(t), requires_grad=False) if isinstance(t, torch.nn.Parameter) else fake(t)
        )
    moved = copy.deepcopy(model, memo)  # the memo hands back the fake tensors: no weight is copied
    inputs = [fake(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    return moved, inputs


def check_devices(model: torch.nn.Module, example_inputs: Sequence[Any]) -> None:
    """Raise where the model's weights and its inputs are on different devices
    (a 0-dim CPU tensor, which torch lets any device read, does not count)."""
    weights = {t.device.type for t in (*model.parameters(), *model.buffers()) if t.dim() > 0}
    inputs = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor) and t.dim() > 0}
    if weights and inputs and weights != inputs:
        raise DispatchError(
            f"the model's weights are on {', '.join(sorted(weights))} and its inputs on "
            f"{', '.join(sorted(inputs))}: move one to the other (model.to(device)), or pass "
            f"device='{sorted(inputs - {'cpu'} or inputs)[0]}' to dispatch.plan, which moves both as fake tensors"
        )
