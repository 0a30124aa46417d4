"""``dispatch.plan``: auto's routing decision without compiling or running, also
for a device this machine may not have (a model and its inputs as fake tensors there).

    plan = dispatch.plan(model, (x,))                   # what auto would do here
    plan = dispatch.plan(model, (x,), device="mps")     # ... on a Mac
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

from .backend import _GraphCompiler
from .cache import ArtifactCache, using
from .config import Config
from .errors import DispatchError, error_line
from .region import Plan


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


def plan(
    model: torch.nn.Module, example_inputs: Sequence[Any], *, device: str | None = None, **options: Any
) -> Plan:
    """The routing decision for one FX graph, without compiling or running anything.

    ``model`` is a graph from Dynamo or ``torch.fx.symbolic_trace``, or a module,
    which is traced with ``symbolic_trace``. ``example_inputs`` may be real or
    fake tensors on any device. ``device="mps"`` (or ``"cuda"``) plans for that
    device on a machine without it: a copy of the model with fake weights and
    fake inputs there (``on_device``); the model itself is untouched.
    Gradients are planned for when grad mode is on and a parameter or input
    requires grad.
    """
    config = Config.resolve(options)
    if device is not None:
        model, example_inputs = on_device(model, example_inputs, device)
    check_devices(model, example_inputs)
    gm = model if isinstance(model, torch.fx.GraphModule) else _traced(model, example_inputs)
    compiler = _GraphCompiler(config, 0, plan_only=True)
    with using(ArtifactCache(config.cache_dir)):
        compiler.aot(_returning_tuple(gm), example_inputs)
    return Plan(compiler.plans)


def _traced(model: torch.nn.Module, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """``model`` as one FX graph: ``symbolic_trace``, or where that cannot follow its
    code (transformers' models assign into their keyword arguments, branch on
    sizes), ``torch.export`` of it on ``example_inputs``."""
    try:
        return torch.fx.symbolic_trace(model)
    except Exception as traced:
        try:
            gm = torch.export.export(model, tuple(example_inputs), strict=False).module()
        except Exception as exported:
            devices = sorted({str(t.device) for t in example_inputs if isinstance(t, torch.Tensor)})
            raise DispatchError(
                f"dispatch.plan cannot make one graph of {type(model).__name__} on {', '.join(devices)}: "
                f"torch.fx.symbolic_trace failed ({error_line(traced)}) and so did torch.export "
                f"({error_line(exported)}). Instead: run dispatch.explain(model, *inputs) where that device is: "
                "it compiles and runs the model and reports the plan of each graph "
                "Dynamo makes of it, graph breaks included"
            ) from exported
    # Flat inputs and a flat tuple of outputs, as a Dynamo graph has: the exported
    # module's code would rebuild the model's output objects (a ModelOutput).
    gm.graph._codegen = torch.fx.graph.CodeGen()
    gm.recompile()
    return gm


def _returning_tuple(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """AOTAutograd wants tuple outputs; ``symbolic_trace`` may return a bare tensor."""
    (output,) = gm.graph.find_nodes(op="output")
    if isinstance(output.args[0], (tuple, list)):
        return gm
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    (output,) = gm.graph.find_nodes(op="output")
    output.args = ((output.args[0],),)
    gm.recompile()
    return gm
