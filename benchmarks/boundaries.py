"""The host cost of a region boundary, per route: what cutting a graph costs each call.

    python -m benchmarks.boundaries [--device cpu|cuda] [--rounds 15]

A chain of ``B`` blocks on a tiny tensor, so that the work is nothing and the
time is host cost. Each block is two ops that the route under test runs
(``tanh``, ``mul``) and a barrier op that it does not (a custom op,
``dispatch_bench::barrier``, a copy), so the stitched program alternates a
region of the route and an eager region: ``2 B`` regions. The same chain under
a ``torch.compile`` backend that returns the graph unchanged is the floor.

    µs per boundary = (slope of auto over B - slope of the floor over B) / 2

that is, what each region costs beyond running its ops eagerly in the Dynamo
graph. ONNX Runtime refuses the custom op itself; inductor runs custom ops, so
for its row this harness refuses the barrier on the inductor route (and only
in this process). Columns are timed in turn, ``--rounds`` rounds, median per
column. Writes ``benchmarks/results/boundaries-<device>-<stamp>.{json,md}``.

Budget (``BUDGET_US``): a boundary costs at most the two eager ops it replaces
would cost; above that, cutting a graph there cannot pay on small work. The
planner's ``min_region_size`` is what keeps regions big enough.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"
BLOCKS = (2, 4, 8, 16)
ROUTES = ("onnxrt", "inductor")
BUDGET_US = {"cpu": 10.0, "cuda": 10.0}


@torch.library.custom_op("dispatch_bench::barrier", mutates_args=())
def barrier(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@barrier.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def chain(blocks: int, tag: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The chain, under a code object of its own: Dynamo keeps compiled code per
    code object, so each (column, blocks) is compiled once and never evicted."""

    def run(x: torch.Tensor) -> torch.Tensor:
        for _ in range(blocks):
            x = torch.tanh(x) * 1.01
            x = barrier(x)
        return x

    code = run.__code__.replace(co_name=f"chain_{tag}_{blocks}")
    return types.FunctionType(code, run.__globals__, code.co_name, None, run.__closure__)


def _floor(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm.forward


def _refuse_barrier_on_inductor() -> None:
    from dispatch.routes.inductor import InductorRoute

    def supports(self: Any, node: torch.fx.Node, graph: Any) -> str | None:
        if "dispatch_bench" in str(node.target):
            return "the boundary benchmark's barrier (refused here to cut the graph)"
        return None

    InductorRoute.supports = supports  # type: ignore[method-assign]


def _compiled(column: str, blocks: int) -> Callable[[torch.Tensor], torch.Tensor]:
    fn = chain(blocks, column)
    if column == "floor":
        return torch.compile(fn, backend=_floor)
    return torch.compile(fn, backend="auto", options={"routes": [column, "eager"], "min_region_size": 1})


def _per_call_s(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, budget_s: float) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    calls = 0
    sync()
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s:
        fn(x)
        calls += 1
    sync()
    return (time.perf_counter() - start) / calls


def _slope(points: dict[int, float]) -> float:
    """Least-squares slope of seconds over blocks."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def measure(device: str, rounds: int) -> dict[str, Any]:
    import dispatch

    _refuse_barrier_on_inductor()
    x = torch.randn(4, device=device)
    status = dispatch.available_routes()
    routes = [r for r in ROUTES if status[r]["available"]]
    columns = ["floor", *routes]
    compiled = {}
    regions = {}
    with torch.no_grad():
        for column in columns:
            for blocks in BLOCKS:
                fn = _compiled(column, blocks)
                fn(x)
                compiled[column, blocks] = fn
            if column != "floor":
                options = {"routes": [column, "eager"], "min_region_size": 1}
                explanation = dispatch.explain(chain(BLOCKS[0], "explained"), x, options=options)
                regions[column] = [r.route for r in explanation.regions]
        samples: dict[tuple[str, int], list[float]] = {key: [] for key in compiled}
        for _ in range(rounds):
            for key, fn in compiled.items():
                samples[key].append(_per_call_s(fn, x, 0.05))
    per_call = {key: statistics.median(v) for key, v in samples.items()}
    floor = _slope({b: per_call["floor", b] for b in BLOCKS})
    rows = {}
    for route in routes:
        slope = _slope({b: per_call[route, b] for b in BLOCKS})
        rows[route] = {
            "us_per_boundary": (slope - floor) / 2 * 1e6,
            "us_per_call": {str(b): per_call[route, b] * 1e6 for b in BLOCKS},
            "regions_at_2_blocks": regions[route],
        }
    return {
        "device": device,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": _machine(device),
        "floor_us_per_call": {str(b): per_call["floor", b] * 1e6 for b in BLOCKS},
        "floor_us_per_block": floor * 1e6,
        "budget_us": BUDGET_US[device],
        "routes": rows,
    }


def _machine(device: str) -> dict[str, Any]:
    from benchmarks.zoo.run import machine

    return machine(device)


def markdown(result: dict[str, Any]) -> str:
    budget = result["budget_us"]
    lines = [
        f"# Region boundaries, {result['device']} ({result['time']})",
        "",
        f"- machine: {result['machine']}",
        f"- floor (Dynamo, graph unchanged): {result['floor_us_per_block']:.1f} µs per block "
        "(two ops and the barrier, eagerly)",
        "",
        "| route | µs per boundary | budget | per call at " + ", ".join(f"{b}" for b in BLOCKS) + " blocks |",
        "|---|---|---|---|",
    ]
    for route, row in result["routes"].items():
        cost = row["us_per_boundary"]
        verdict = "met" if cost <= budget else "NOT met"
        calls = ", ".join(f"{v:.0f}" for v in row["us_per_call"].values())
        lines.append(f"| {route} | {cost:.1f} | {budget:.0f} ({verdict}) | {calls} µs |")
    floor = ", ".join(f"{v:.0f}" for v in result["floor_us_per_call"].values())
    lines.append(f"| floor | 0 | | {floor} µs |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    result = measure(args.device, args.rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / f"boundaries-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2))
    base.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"[boundaries] wrote {base}.json/.md")


if __name__ == "__main__":
    main()
