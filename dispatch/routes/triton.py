"""The ``triton`` route: the aten patterns that ``kernels/`` implements.

It claims exactly the nodes of a pattern match (``triton_patterns.py``) and
nothing else; a pattern whose shapes, dtypes, strides or uses its kernel does
not handle is refused at plan time with the reason. A region is compiled by
rewriting its graph: each match's nodes are replaced by one call to its
Triton kernel. It runs on CUDA, and on CPU
only under ``TRITON_INTERPRET=1`` (the Triton interpreter, for tests).

In a saved program a triton region's payload names its kernels in order; the
kernels and their launch configuration come from ``kernels/`` of the loading
process (code is never read from the file), matched again on the region's
stored graph, and a file whose kernels differ from the ones found is refused.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..inspect import META_PATTERN, META_PATTERN_REFUSED, GraphFacts
from .base import Availability, CompiledFn, PreprocessResult, RegionProgram, Route, install_hint
from .registry import registry
from .triton_patterns import PatternMatch, find_patterns


def _interpreting() -> bool:
    from dispatch.kernels._launch import interpreting

    return interpreting()


@registry.register
class TritonRoute(Route):
    name = "triton"
    devices = frozenset({"cuda"})
    trains = False  # the kernels are forward-only
    min_region_size = 1  # one fused kernel is worth a region of its own

    def available(self) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, None, f"triton is not installed; {install_hint('triton')}")
        from importlib.metadata import version

        return Availability(True, version("triton"))

    def serves_device(self, device: str) -> bool:
        return device == "cuda" or (device == "cpu" and _interpreting())

    def device_reason(self, device: str) -> str:
        if device == "cpu":
            return "device cpu: triton runs on CPU only under TRITON_INTERPRET=1 (the interpreter, for tests)"
        return f"device {device} is not served by triton (cuda)"

    def prepare(self, gm: torch.fx.GraphModule, graph: GraphFacts) -> None:
        for node in gm.graph.nodes:
            node.meta.pop(META_PATTERN, None)
            node.meta.pop(META_PATTERN_REFUSED, None)
        matches, refusals = find_patterns(gm)
        for refusal in refusals:
            for node in refusal.nodes:
                node.meta[META_PATTERN_REFUSED] = f"kernels/ {refusal.name} pattern refused: {refusal.reason}"
        for i, match in enumerate(matches):
            for node in match.nodes:
                node.meta[META_PATTERN] = (i, match.name)

    def supports(self, node: torch.fx.Node, graph: GraphFacts) -> str | None:
        if META_PATTERN in node.meta:
            return None
        return node.meta.get(META_PATTERN_REFUSED, f"no kernels/ pattern covers {node.target}")

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        module = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        matches, _ = find_patterns(module)
        covered = {n for m in matches for n in m.nodes}
        loose = [
            n
            for n in module.graph.nodes
            if n.op == "call_function" and n not in covered and n.target is not operator.getitem
        ]
        if loose:
            raise RuntimeError(
                f"triton: region holds ops outside any kernels/ pattern: {sorted({str(n.target) for n in loose})}"
            )
        replaced: dict[torch.fx.Node, torch.fx.Node] = {}
        for match in matches:
            _rewrite(module.graph, match, replaced)
        module.graph.eliminate_dead_code()
        module.graph.lint()
        module.recompile()
        return module.forward

    def preprocess(self, region: RegionProgram, compile_specs: Mapping[str, Any]) -> PreprocessResult:
        """The names of the region's kernels, in order, with the nodes each one runs."""
        self.compile(region.gm, region.example_inputs or ())  # refuses what it cannot run, as at run time
        matches, _ = find_patterns(region.gm)
        handles = {f"{i}:{m.name}": [n.name for n in m.nodes] for i, m in enumerate(matches)}
        payload = json.dumps({"kernels": [m.name for m in matches]}).encode()
        return PreprocessResult(payload, handles, dict(compile_specs))

    def load(self, processed_bytes: bytes, region: RegionProgram, specs: Mapping[str, Any]) -> CompiledFn:
        stored = json.loads(processed_bytes)["kernels"]
        matches, _ = find_patterns(region.gm)
        found = [m.name for m in matches]
        if found != stored:
            raise RuntimeError(f"triton: the file's kernels {stored} are not this version's {found}")
        return self.compile(region.gm, ())


def _rewrite(
    graph: torch.fx.Graph, match: PatternMatch, replaced: dict[torch.fx.Node, torch.fx.Node]
) -> None:
    """Replace ``match`` by one kernel call placed where its output was.

    An input may be the output of a match rewritten before: ``replaced`` maps it
    to that match's call (the match still holds the erased node)."""
    inputs = tuple(replaced.get(n, n) for n in match.inputs)
    with graph.inserting_after(match.output):
        call = graph.call_function(match.call(), inputs)
    match.output.replace_all_uses_with(call)
    replaced[match.output] = call
    for node in reversed(match.nodes):
        if not node.users:
            graph.erase_node(node)
