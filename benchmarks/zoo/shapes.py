"""The zoo's models under auto on shapes other than their own, judged for accuracy.

    python -m benchmarks.zoo.shapes [--models NAMES|wider] [--calls 300]

Each model is called with other batch sizes, and where it takes them, other
sequence lengths (2-d integer inputs) and image sizes (4-d floating inputs),
and images stored channels-last:
each shape in turn for a few calls (Dynamo compiles a graph for the first
shape, again for the second, then a graph of symbolic sizes), then ``--calls``
calls of the shapes mixed, so that auto's in-place trials run and settle on
the graph of symbolic sizes, then each shape once more. Every output is judged,
the mixed calls' too (a trial's side runs some of them),
against fp32 eager as the zoo judges (``benchmarks/accuracy.py``); a shape
that eager itself refuses (a ViT's fixed image size, a position table's
length) is left out. Each model runs in a process of its own on fresh caches,
then in a second one on the same caches: a warm start, whose cached trial
decisions apply to its first calls. Found this way (2026-12-07): the trial's
plain inductor program of cond_branches, compiled on a call of batch 2,
returned 2 rows for batches of 3.

Results: ``benchmarks/results/zoo-shapes-cpu-<time>.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..machine import cpu
from ..process import marked_report
from .wider import EVERY_MODEL, model_names

RESULTS = Path(__file__).resolve().parent.parent / "results"
# (batch, change in sequence length, change in image side) of each other shape
OTHER_SHAPES = ((1, 0, 0), (3, 0, 0), (2, -16, -32), (3, 8, 16), (1, 24, 48))
CALLS_EACH = 3  # calls of each shape in turn: the last one's output is judged
MARKER = "ZOO_SHAPES "


def other_inputs(inputs: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """``inputs`` at each of ``OTHER_SHAPES``: the first dimension of every input
    that has one is the batch; a 2-d integer input's second is its sequence, a 4-d
    floating input's last two its image. New values, of the inputs' kind."""
    shapes = []
    for batch, more_tokens, more_pixels in OTHER_SHAPES:
        changed = []
        for t in inputs:
            shape = list(t.shape)
            if shape:
                shape[0] = batch
            if t.dim() == 2 and not t.is_floating_point() and t.dtype != torch.bool:
                shape[1] = max(4, shape[1] + more_tokens)
            if _image_input(t):
                shape[2], shape[3] = max(32, shape[2] + more_pixels), max(32, shape[3] + more_pixels)
            changed.append(_like(t, shape))
        shapes.append(tuple(changed))
    if any(_image_input(t) for t in inputs):
        # The same images stored channels-last, as a CNN user's loader or
        # ``x.to(memory_format=torch.channels_last)`` hands them over: Dynamo
        # compiles again for their strides, and each route reads them its own way.
        first = shapes[OTHER_SHAPES.index((3, 0, 0))]  # batch 3, the inputs' own sizes
        shapes.append(tuple(t.to(memory_format=torch.channels_last) if _image_input(t) else t for t in first))
    return shapes


def _image_input(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_floating_point()


def _like(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    if t.is_floating_point():
        return torch.randn(*shape, generator=g, dtype=t.dtype)
    if t.dtype == torch.bool:
        return torch.ones(*shape, dtype=torch.bool)
    high = max(int(t.max()) + 1 if t.numel() else 2, 2)  # token ids within the model's vocabulary
    return torch.randint(0, high, shape, generator=g, dtype=t.dtype)


def _shape(inputs: tuple[torch.Tensor, ...]) -> str:
    return " ".join("x".join(map(str, t.shape)) + _layout(t) for t in inputs)


def _layout(t: torch.Tensor) -> str:
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return " channels-last"
    return ""


def _accurate(reference: Any, fp64: Any, out: Any) -> bool:
    """The zoo's judgement; an output of another shape is inaccurate, not an error."""
    from ..accuracy import accurate

    try:
        return accurate(reference, fp64, out, torch.float32)
    except RuntimeError:  # torch.allclose on tensors of different shapes
        return False


def check_model(name: str, calls: int) -> dict[str, Any]:
    """One model under auto on its own inputs and ``other_inputs``; each judged."""
    from ..accuracy import copies, fp64_inference

    model, inputs = EVERY_MODEL[name].build()
    model.eval()
    compiled = torch.compile(model, backend="auto")
    checks: list[dict[str, Any]] = []
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # models that print
        shapes = []
        for candidate in (inputs, *other_inputs(inputs)):
            try:
                reference = model(*copies(candidate))
            except Exception:  # eager refuses the shape: not one this model takes
                continue
            shapes.append((candidate, reference, fp64_inference(model, candidate)))

        def judged(phase: str, candidate, reference, fp64, repeat: int) -> None:
            entry: dict[str, Any] = {"phase": phase, "shape": _shape(candidate)}
            try:
                for _ in range(repeat):
                    out = compiled(*copies(candidate))
                entry["ok"] = _accurate(reference, fp64, out)
            except Exception as error:
                entry["ok"], entry["error"] = False, f"{type(error).__name__}: {str(error)[:300]}"
            checks.append(entry)

        for candidate, reference, fp64 in shapes:
            judged("in turn", candidate, reference, fp64, CALLS_EACH)
        mixed = shapes[1:] or shapes
        wrong: dict[str, int] = {}
        try:
            for i in range(calls):
                candidate, reference, fp64 = mixed[i % len(mixed)]
                if not _accurate(reference, fp64, compiled(*copies(candidate))):
                    wrong[_shape(candidate)] = wrong.get(_shape(candidate), 0) + 1
        except Exception as error:
            wrong[f"{type(error).__name__}: {str(error)[:300]}"] = 1
        checks += [
            {"phase": "mixed", "shape": shape, "ok": False, "error": f"{count} inaccurate call(s)"}
            for shape, count in wrong.items()
        ]
        for candidate, reference, fp64 in shapes:
            judged("after mixed calls", candidate, reference, fp64, 1)
    return {"model": name, "checks": checks}


def _one(name: str, cache: str, calls: int) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    os.environ["DISPATCH_CACHE_DIR"] = os.path.join(cache, "dispatch")
    try:
        result = check_model(name, calls)
    except Exception as error:  # the model failed to build or compile: reported, not dropped
        result = {
            "model": name,
            "checks": [{"phase": "build", "shape": "", "ok": False, "error": str(error)[:300]}],
        }
    print(MARKER + json.dumps(result), flush=True)


def _run(name: str, cache: str, calls: int) -> dict[str, Any]:
    args = ["--one", name, "--cache", cache, "--calls", str(calls)]
    report, error = marked_report("benchmarks.zoo.shapes", args, MARKER, timeout=1800)
    if report is not None:
        return report
    return {"model": name, "checks": [{"phase": "process", "shape": "", "ok": False, "error": error}]}


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Zoo on other shapes, cpu float32, {report['time']}",
        "",
        f"- cpu: {report['cpu'].get('cpu')}; vector flags: {', '.join(report['cpu'].get('vector_flags', []))}",
        f"- torch {report['torch']}; {report['calls']} mixed calls per process",
        "",
        "| model | process | shapes | judged | accurate | failures |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        checks = row["checks"]
        bad = [f"{c['phase']} {c['shape']}: {c.get('error', 'inaccurate')}" for c in checks if not c["ok"]]
        shapes = len({c["shape"] for c in checks if c["shape"]})
        good = sum(c["ok"] for c in checks)
        lines.append(
            f"| {row['model']} | {row['process']} | {shapes} | {len(checks)} | {good} | {'; '.join(bad)[:400]} |"
        )
    passed = sum(all(c["ok"] for c in r["checks"]) for r in report["rows"])
    lines += ["", f"{passed} of {len(report['rows'])} processes accurate on every shape."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="names, comma-separated, or 'wider'; default: the zoo")
    parser.add_argument("--calls", type=int, default=300, help="mixed calls of the other shapes per process")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        _one(args.one, args.cache, args.calls)
        return
    from .models import ZOO

    try:
        names = model_names(args.models) if args.models else [n for n in ZOO if n in EVERY_MODEL]
    except ValueError as error:
        parser.error(str(error))
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="zoo-shapes-") as cache:
            for process in ("cold", "warm"):
                start = time.perf_counter()
                row = {**_run(name, cache, args.calls), "process": process}
                rows.append(row)
                failed = [c for c in row["checks"] if not c["ok"]]
                print(
                    f"[shapes] {name} {process}: {len(row['checks']) - len(failed)}/{len(row['checks'])} "
                    f"accurate ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    report = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpu": cpu(),
        "torch": torch.__version__,
        "calls": args.calls,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / f"zoo-shapes-cpu-{time.strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(report, indent=1))
    base.with_suffix(".md").write_text(_markdown(report))
    print(f"[shapes] wrote {base}.json/.md")


if __name__ == "__main__":
    main()
