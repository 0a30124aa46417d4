"""AOTAutograd's own cache for the graphs that ``auto`` compiles as plain inductor does,
with each graph's plan kept beside its entry.

A warm start of a CPU training step took 3.8 s under ``auto`` and 2.3 s under
plain inductor (hf_bert, 2 layers): with AOTAutograd's cache off, ``auto``
traced forward and backward again on every start. It was off because a hit
skips the inner compile, where each aten graph is planned, and that raised two
problems, which this module solves:

- ``explain`` would show no plan for the graph. The plans that the inner
  compile made are stored in our cache, keyed by the Dynamo graph and the
  settings, and published again on a hit. A hit with no plan stored (our cache
  cleared, inductor's kept) compiles again with the cache off.
- an entry that plain inductor (or ``auto`` under other settings) wrote for the
  same graph would serve a graph whose plan departs from inductor. The key
  carries ``auto``'s fingerprint (settings, source, versions) through the hook
  that torch keys custom passes by: a post-grad pass whose ``uuid()`` is the
  fingerprint. It changes nothing in the graph.

A training graph's entry is written at the first backward call, outside
``auto``'s call, in inductor's own directory; so its compiles all use that
directory (``cache.inductor_cache``).

Torch writes an entry only for inductor's own output (an ``OutputCode`` with a
graph-cache key), so a graph that was split among routes, or captured with its
outputs copied out, is never stored: only the graphs inductor took whole are.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .cache import ArtifactCache, code_digest, versions
from .config import Config
from .record import GraphRecord, recorder
from .region import GraphPlan

log = logging.getLogger("dispatch")

KIND = "served-plans"
_FORMAT = 1


def settings_fingerprint(config: Config) -> str:
    """What decides how ``auto`` plans a graph besides the graph: its settings, its
    source and the versions of what it runs."""
    settings = (
        config.routes,
        sorted(config.disabled),
        config.strict,
        config.autotune,
        config.verify,
        config.reduce_overhead,
        config.min_region_size,
    )
    return hashlib.sha256(f"{_FORMAT}|{settings}|{code_digest()}|{versions()}".encode()).hexdigest()


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], fingerprint: str) -> str:
    """The key of a Dynamo graph's plans: its code, its inputs' metadata, grad mode."""
    h = hashlib.sha256(gm.code.encode())
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            h.update(f"{tuple(x.shape)}|{x.stride()}|{x.dtype}|{x.device}|{x.requires_grad}\n".encode())
        else:
            h.update(f"{type(x).__name__}|{x}\n".encode())
    h.update(f"{torch.is_grad_enabled()}|{torch.is_inference_mode_enabled()}|{fingerprint}".encode())
    return h.hexdigest()


def fingerprint_pass(fingerprint: str) -> Any:
    """A post-grad pass for inductor's config that changes nothing and names
    ``fingerprint`` in the cache keys, run after the user's own pass if there is one."""
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Fingerprint(CustomGraphPass):
        def __init__(self, then: Any) -> None:
            self.then = then

        def __call__(self, graph: torch.fx.Graph) -> None:
            if self.then is not None:
                self.then(graph)

        def uuid(self) -> Any:
            then = None if self.then is None else self.then.uuid()
            return f"dispatch-{fingerprint}-{then}"

    return Fingerprint(inductor_config.post_grad_custom_post_pass)


class ServedPlans:
    """The plans published for one Dynamo graph compiled through ``compile_fx``,
    stored as they come (the backward graph's comes on the first backward call)."""

    def __init__(self, config: Config, key: str, graph_index: int) -> None:
        self.cache = ArtifactCache(config.cache_dir)
        self.key = key
        self.graph_index = graph_index
        self.plans: list[GraphPlan] = []

    def add(self, plan: GraphPlan) -> None:
        self.plans.append(plan)
        self.cache.put_json(KIND, self.key, [p.to_dict() for p in self.plans])

    def stored(self) -> list[GraphPlan] | None:
        """The plans stored for this graph, numbered as this graph; None where there are none."""
        stored = self.cache.get_json(KIND, self.key)
        if not stored:
            return None
        try:
            return [GraphPlan.from_dict(p, self.graph_index) for p in stored]
        except (KeyError, TypeError, ValueError) as error:  # an old or altered entry: a miss
            log.info("stored plans %s do not read back (%s)", self.key[:12], error)
            return None


def publish(plans: Sequence[GraphPlan]) -> None:
    """Publish plans read back for a graph that AOTAutograd's cache served."""
    for plan in plans:
        recorder.publish(GraphRecord(plan, None))
        routes = ", ".join(f"{r.name} -> {r.route}" for r in plan.regions)
        log.info("graph %d (%s): %s (inductor's own compile, from its cache)", plan.graph, plan.kind, routes)
