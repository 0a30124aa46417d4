"""``dispatch.explain``: compile with ``auto``, run once, report what ran where.

It wraps ``torch._dynamo.backends.debugging.ExplainWithBackend`` around
``auto``, so graph, break and op counts are Dynamo's own, and adds the
regions of every aten graph with each rejected route's reason. A frame that
Dynamo gave up on runs eagerly and reaches no backend (a module holding an
``nn.LSTM`` while ``allow_rnn`` is off is the common case): its reason, which
Dynamo counts but leaves out of its own explain, is reported too.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.utils import counters

from .backend import auto
from .record import recorder
from .region import GraphPlan, Region, region_table


@dataclass
class Explanation:
    """What ``auto`` did with one function: Dynamo's counts plus per-region routes."""

    graph_count: int
    graph_break_count: int
    break_reasons: list[Any]
    op_count: int
    graphs: list[torch.fx.GraphModule] = field(default_factory=list, repr=False)
    ops_per_graph: list[list[Any]] | None = None
    out_guards: list[Any] | None = None
    compile_times: str | None = None
    plans: list[GraphPlan] = field(default_factory=list)
    #: Dynamo's reason for each frame it ran eagerly, without a graph for ``auto``
    frames_run_eagerly: list[str] = field(default_factory=list)

    @property
    def regions(self) -> list[Region]:
        return [r for p in self.plans for r in p.regions]

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph_count": self.graph_count,
            "graph_break_count": self.graph_break_count,
            "break_reasons": [_reason_text(r) for r in self.break_reasons],
            "op_count": self.op_count,
            "graphs": [p.to_dict() for p in self.plans],
            "regions": [r.to_dict() for r in self.regions],
            "frames_run_eagerly": list(self.frames_run_eagerly),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [
            f"Graph Count: {self.graph_count}",
            f"Graph Break Count: {self.graph_break_count}",
            f"Dynamo Op Count (torch-level calls Dynamo traced, before lowering to aten): {self.op_count}",
        ]
        if self.frames_run_eagerly:
            lines.append(
                "Frames Dynamo ran eagerly (auto never saw them; Dynamo's reason for each):"
                if self.graph_count
                else "No graph reached auto: Dynamo ran this call eagerly. Its reason:"
            )
            lines += [f"  {i + 1}. {_indented(r)}" for i, r in enumerate(self.frames_run_eagerly)]
        elif not self.graph_count:
            lines.append("No graph reached auto: Dynamo compiled nothing for this call.")
        if self.break_reasons:
            lines.append("Break Reasons:")
            lines += [f"  {i + 1}. {_reason_text(r)}" for i, r in enumerate(self.break_reasons)]
        dynamic = [
            f"  graph {p.graph} ({p.kind}): {', '.join(p.dynamic_dims)}" for p in self.plans if p.dynamic_dims
        ]
        if dynamic:
            lines += ["Dynamic dims:", *dynamic]
        lines.append(region_table(self.regions))
        return "\n".join(lines)


def explain(
    fn: Callable[..., Any],
    *args: Any,
    options: Mapping[str, Any] | None = None,
    dynamic: bool | None = None,
    **kwargs: Any,
) -> Explanation:
    """Compile ``fn`` with ``auto`` (and ``options``), run it once on ``args``, report.

    ``dynamic`` is ``torch.compile``'s; ``torch._dynamo.mark_dynamic`` on an
    argument also makes its dimension symbolic, and the report lists it.

    Nothing else compiled in the process is touched: Dynamo's cache entries
    carry the backend they were made for, so this compile misses the user's own
    and makes new ones, and afterwards only the code objects compiled here are
    cleared (``fn``'s own frames, which compile again on their next call)."""
    from torch._dynamo.backends.debugging import ExplainWithBackend
    from torch._dynamo.convert_frame import register_bytecode_hook

    explainer = ExplainWithBackend("auto")
    explainer.backend = functools.partial(auto, options=options)
    compiled_codes: list[Any] = []
    unsupported_before = collections.Counter(counters["unimplemented"])
    hook = register_bytecode_hook(lambda code, new_code: compiled_codes.append(code))
    try:
        with recorder.recording() as plans:
            torch.compile(fn, backend=explainer, dynamic=dynamic)(*args, **kwargs)
    finally:
        hook.remove()
        for code in compiled_codes:
            torch._dynamo.reset_code(code)
    out = explainer.output()
    unsupported = collections.Counter(counters["unimplemented"]) - unsupported_before
    return Explanation(
        graph_count=out.graph_count,
        graph_break_count=max(out.graph_break_count, 0),  # Dynamo reports -1 for no graph
        frames_run_eagerly=[reason.strip() for reason in unsupported],
        break_reasons=list(out.break_reasons),
        op_count=out.op_count,
        graphs=list(out.graphs),
        ops_per_graph=out.ops_per_graph,
        out_guards=out.out_guards,
        compile_times=out.compile_times,
        plans=[record.outcome() for record in plans],
    )


def _reason_text(reason: Any) -> str:
    return str(getattr(reason, "reason", reason))


def _indented(text: str) -> str:
    return "\n     ".join(line.strip() for line in text.splitlines() if line.strip())
