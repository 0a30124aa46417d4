"""One benchmark process. Two jobs, each printing one JSON line:

    python -m benchmarks.worker compile MODEL COLUMN   # cold compile time, fresh caches
    python -m benchmarks.worker time MODEL COL,COL,..  # per-call times, interleaved

Per-call times are taken side by side: every column runs a short batch of calls
in turn, round after round, and the median of each column's batch means is
kept, so that drift on a shared machine hits all columns alike.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback

import torch

from . import columns
from .models import build


def _warm_up_process() -> None:
    # One-off costs of any torch.compile in a fresh process (importing Dynamo,
    # its first trace) are not the backend's compile time.
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    torch._dynamo.reset()


def compile_time(model_name: str, column: str) -> dict:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["DISPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-dispatch-")
    model, inputs = build(model_name)
    _warm_up_process()
    with torch.no_grad():
        start = time.perf_counter()
        try:
            fn = columns.make(column, model, inputs)
            fn()
        except Exception as error:
            return {"model": model_name, "column": column, "ok": False, "error": _short(error)}
        return {"model": model_name, "column": column, "ok": True, "compile_s": time.perf_counter() - start}


def per_call(model_name: str, names: list[str], seconds: float) -> dict:
    model, inputs = build(model_name)
    results: dict[str, dict] = {}
    fns = {}
    with torch.no_grad():
        expected = model(*inputs)
        for name in names:
            try:
                fn = columns.make(name, model, inputs)
                out = fn()
                fns[name] = fn
                results[name] = {"ok": True, "max_error": _max_error(out, expected)}
            except Exception as error:
                results[name] = {"ok": False, "error": _short(error)}
        batch = {name: _calls_per_batch(fn) for name, fn in fns.items()}
        means: dict[str, list[float]] = {name: [] for name in fns}
        deadline = time.perf_counter() + seconds
        rounds = 0
        while rounds < 5 or (time.perf_counter() < deadline and rounds < 100):
            for name, fn in fns.items():
                n = batch[name]
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                means[name].append((time.perf_counter() - start) / n)
            rounds += 1
    for name, samples in means.items():
        samples.sort()
        results[name]["per_call_s"] = samples[len(samples) // 2]
        results[name]["rounds"] = len(samples)
    return {"model": model_name, "columns": results}


def _calls_per_batch(fn, target: float = 0.1) -> int:
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-6)
    return max(1, min(2000, int(target / one)))


def _max_error(out, expected) -> float:
    if isinstance(expected, torch.Tensor):
        out, expected = (out,), (expected,)
    return max(float((o.float() - e.float()).abs().max()) for o, e in zip(out, expected))


def _short(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(error, file=sys.stderr)
    return text[:300]


def main(argv: list[str]) -> None:
    job, model_name, spec = argv[:3]
    if job == "compile":
        result = compile_time(model_name, spec)
    else:
        seconds = float(argv[3]) if len(argv) > 3 else 6.0
        result = per_call(model_name, spec.split(","), seconds)
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
