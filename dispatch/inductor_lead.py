"""Which Dynamo graphs have inductor as their baseline, and what that asks for.

A graph whose tensors are on one device type whose route order starts with
inductor (CPU training, CUDA inference and training, inductor forced by the
user) compiles as plain inductor compiles it (``inductor_baseline.py``);
``InductorLead`` says whether its CUDA graph trees capture it, whether the
kernels/ are tried inside its graph, and whether its whole graph is timed
against the graph as traced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .config import Config
from .errors import DispatchError
from .inspect import GRAPH_FORWARD, GRAPH_INFERENCE, holds_bfloat16, needs_gradients
from .kernel_trial import trials_kernels
from .planner import availability, route_order
from .routes import registry
from .update_step import is_update_step

INDUCTOR = "inductor"
CUDAGRAPHS = "cudagraphs"


@dataclass(frozen=True)
class InductorLead:
    """A Dynamo graph whose baseline is inductor, and whether inductor's CUDA graph
    trees capture it (CUDA inference, with cudagraphs in the device's order)."""

    capture: bool
    #: under autotune: try the kernels/ inside inductor's graph (``kernel_trial.py``)
    trial: bool = False
    #: CPU inference and training: inductor's whole graph (a training step: its
    #: forward and backward) is timed against the graph as traced
    #: (``capture_check.py``), as a captured one is on CUDA
    cpu_check: bool = False
    #: gradients are needed: a forward and a backward graph
    training: bool = False


def inductor_lead(
    config: Config, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> InductorLead | None:
    """The lead where Dynamo's graph ``gm`` has inductor as its baseline: its tensors are
    on one device type whose route order starts with inductor, and nothing asks for
    the region-by-region path (verify checks regions; autotune measures regions,
    except where the kernels/ are tried inside inductor's whole graph instead,
    ``kernel_trial.py``). None otherwise."""
    if config.verify:
        return None
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if len(devices) != 1:
        return None
    (device,) = devices
    if config.autotune and not trials_kernels(config, device):
        return None
    inference = not needs_gradients(example_inputs)
    try:
        kind = GRAPH_INFERENCE if inference else GRAPH_FORWARD
        order, _ = route_order(device, kind, config, holds_bfloat16(gm), is_update_step(gm))
    except DispatchError:
        return None  # the ordinary path raises it, when the graph is called
    leading = [name for name in order if not registry.get(name).wraps]
    if leading[:1] != [INDUCTOR] or not availability(registry.get(INDUCTOR)).ok:
        return None
    return InductorLead(
        capture=inference and device == "cuda" and CUDAGRAPHS in order,
        trial=inference and config.autotune,
        cpu_check=device == "cpu" and not config.autotune,
        training=not inference,
    )
