"""``LoweredProgram``: a routed program as an ``nn.Module``, called like the model.

It holds the stitched graph (one call per region, and the item accesses
between them), each region's loaded callable, the weights that some region
reads at run time (a region that baked a weight into its payload, as ONNX
Runtime's does, needs no copy of it), and the signature: how the inputs
flatten, what each must be, how the outputs unflatten. A call checks the
inputs against the signature and runs the graph: no Dynamo, no guards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree

from .errors import InputSpecError
from .program_inputs import InputSpecs
from .region import Region, region_table
from .routes import CompiledFn, PreprocessResult


@dataclass
class LoweredRegion:
    """One region of a lowered program: the outcome record (route, ops, devices,
    why not the others), its aten graph, what its route made of it, the loaded
    callable, and each op's place in the model's source (``lowering.node_source``)."""

    record: Region
    gm: torch.fx.GraphModule = field(repr=False)
    result: PreprocessResult = field(repr=False)
    fn: CompiledFn = field(repr=False)
    sources: list[dict[str, Any]] = field(repr=False)


@dataclass(frozen=True)
class ProgramSignature:
    """How a call's inputs flatten and what each must be; how outputs unflatten."""

    inputs: InputSpecs
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    kwarg_names: tuple[str, ...]


class LoweredProgram(torch.nn.Module):
    """A lowered model (``dispatch.lower``, ``dispatch.load``). ``print(program)``
    shows what runs where; ``program.save(path)`` writes it to one file."""

    graph: torch.fx.GraphModule
    lowered_regions: dict[str, LoweredRegion]
    weights: dict[str, torch.Tensor]

    def __init__(
        self,
        graph: torch.fx.GraphModule,
        regions: Mapping[str, LoweredRegion],
        weights: Mapping[str, torch.Tensor],
        signature: ProgramSignature,
    ) -> None:
        super().__init__()
        if isinstance(graph, _LazyGraphModule) and graph._needs_recompile():
            graph.real_recompile()
        # Plain attributes, not submodules or buffers: ``.to()`` cannot move an
        # ORT session or a compiled library, so it must not move their inputs.
        self.__dict__["graph"] = graph
        self.__dict__["lowered_regions"] = dict(regions)
        self.__dict__["weights"] = dict(weights)
        self.signature = signature
        self._weights = tuple(weights.values())
        self._run = type(graph).forward.__get__(graph)
        spec = signature.in_spec
        # The common call, positional tensors only: flattening is the identity.
        self._positional = (
            not signature.kwarg_names and spec.child(0).num_children == spec.child(0).num_leaves
        )

    @classmethod
    def assemble(
        cls,
        split: torch.fx.GraphModule,
        regions: Mapping[str, LoweredRegion],
        weights: Mapping[str, torch.Tensor],
        signature: ProgramSignature,
    ) -> LoweredProgram:
        """The program from a split graph whose regions are lowered: inputs baked
        into a region's payload are no longer passed to it, weights no region
        reads are dropped, and each region submodule becomes its loaded callable."""
        graph = split.graph
        for node in graph.find_nodes(op="call_module"):
            baked = regions[node.target].result.baked
            node.args = tuple(None if i in baked else a for i, a in enumerate(node.args))
        kept = {}
        for node in graph.find_nodes(op="placeholder"):
            if node.name in weights:
                if node.users:
                    kept[node.name] = weights[node.name]
                else:
                    graph.erase_node(node)
        for name, region in regions.items():
            delattr(split, name)
            setattr(split, name, region.fn)
        split.recompile()
        return cls(split, regions, kept, signature)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        signature = self.signature
        if self._positional and not kwargs:
            flat: list[Any] | tuple[Any, ...] = args
            if len(args) != len(signature.inputs.specs):
                signature.inputs.check(args)  # raises, naming the inputs
        else:
            if set(kwargs) - set(signature.kwarg_names):
                raise InputSpecError(
                    f"unexpected keyword arguments {sorted(set(kwargs) - set(signature.kwarg_names))}; "
                    f"the program was lowered with {list(signature.kwarg_names)}"
                )
            ordered = {k: kwargs[k] for k in signature.kwarg_names if k in kwargs}
            flat, spec = pytree.tree_flatten((args, ordered))
            if spec != signature.in_spec:
                raise InputSpecError(
                    f"the inputs are structured as {spec}, the program was lowered for {signature.in_spec}"
                )
        signature.inputs.check(flat)
        # Inference only: an ONNX Runtime or AOTInductor region passes no gradient,
        # so a mixed program under autograd would give gradients through its eager
        # regions alone. No output requires grad; backward raises torch's own error.
        with torch.no_grad():
            out = self._run(*self._weights, *flat)
        return pytree.tree_unflatten(list(out), signature.out_spec)

    @property
    def regions(self) -> list[Region]:
        """What runs where: one record per region, as ``explain`` reports them."""
        return [r.record for r in self.lowered_regions.values()]

    def save(self, path: str | PathLike[str]) -> None:
        """Write the program to one file that ``dispatch.load`` reads (``archive.py``)."""
        from .archive import save_program

        save_program(self, path)

    def extra_repr(self) -> str:
        return "\n" + region_table(self.regions)
