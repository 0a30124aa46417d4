"""Zoo columns timed side by side in one process, for a lent GPU's few minutes.

    python -m benchmarks.zoo.in_turn --models hf_llama,hf_bert --dtype bfloat16 --out DIR

The zoo's runner gives each column processes of its own; on a GPU a host-bound
column's time moved up to 1.4x from one process to the next (auto on hf_bert: 254
and 185 µs, ``results/gpu-h200-20261126-3.md``), more than the gaps it was asked
to measure. Here every column of a model is built in one process and timed in
turn: ``ROUNDS`` rounds of ``CALLS`` calls, the device synchronised around each
batch, the column order rotated each round, the median kept. Compile times are
taken on fresh cache folders for each column (inductor's, Triton's, dispatch's),
in the order the columns compile, auto first: a later column may still reuse
kernels already loaded in the process or compiled by inductor's worker pool, so
auto's compile time over another column's is an upper bound.
Each model's row is appended to ``DIR/in_turn.jsonl`` as soon as it is done, so
that a run cut off by its time limit keeps the rows it finished.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import statistics
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import torch

from ..accuracy import accurate, fp64_inference, inference_accurate_now
from . import columns
from .wider import EVERY_MODEL
from .worker import moved

# The floor (Dynamo with a backend that runs its graphs as traced) is the bar for
# graph-break code, whose Dynamo frames cost more than its kernels.
COLUMNS = ("auto", "auto_reduce_overhead", "reduce_overhead", "inductor", "eager", "floor")
ROUNDS = 8
CALLS = 100
WARM_UP_CALLS = 50


def _fresh_caches() -> None:
    """Empty cache folders for the next column, so that it cannot load what an
    earlier column compiled from disk (inductor's FX graph and AOTAutograd caches)."""
    root = tempfile.mkdtemp(prefix="in-turn-cache-")
    for variable, folder in (
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
        ("DISPATCH_CACHE_DIR", "dispatch"),
    ):
        os.environ[variable] = os.path.join(root, folder)


def _peak_mb(before: int, device: str) -> float:
    return (torch.cuda.max_memory_allocated() - before) / 2**20 if device == "cuda" else 0.0


def profile_table(fn: Any, calls: int, device: str) -> str:
    """torch.profiler's table of ``calls`` calls of ``fn``, by self CPU time: on a
    host-bound replay, where the host's time per call goes (the launches and
    allocations a column adds), with the device's time beside it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def model_row(
    name: str, device: str, dtype: torch.dtype, chosen: tuple[str, ...], profiled: int = 0
) -> dict[str, Any]:
    """One model's columns: compile time, accuracy (on the first call, and again
    after the timed calls: a CUDA graph's replays and auto's trials come after
    the first), the memory its compile and warm-up added, and the median per-call
    time of batches taken in turn; with ``profiled`` calls, each column's
    profiler table under ``row["profiles"]``."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, inputs = EVERY_MODEL[name].build()
    model.eval()
    row: dict[str, Any] = {"model": name, "dtype": str(dtype).removeprefix("torch."), "columns": {}}
    with torch.no_grad(), redirect_stdout(io.StringIO()):
        fp64 = fp64_inference(model, inputs)
        model, inputs = moved(model, inputs, device, dtype)
        reference = copy.deepcopy(model)(*inputs)
        runs = {}
        for column in chosen:
            cell: dict[str, Any] = {}
            _fresh_caches()
            try:
                before = torch.cuda.memory_allocated() if device == "cuda" else 0
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                fn = columns.inference(column, model, inputs)
                out = fn()
                sync()
                cell["compile_s"] = round(time.perf_counter() - start, 2)
                cell["accurate"] = accurate(reference, fp64, out, dtype)
                del out
                for _ in range(WARM_UP_CALLS):
                    fn()
                sync()
                cell["added_mb"] = round(_peak_mb(before, device), 1)
                runs[column] = fn
            except Exception as error:  # one failing column is reported, the rest run
                cell["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            row["columns"][column] = cell
        samples: dict[str, list[float]] = {c: [] for c in runs}
        order = list(runs)
        for r in range(ROUNDS):
            for column in order[r % len(order) :] + order[: r % len(order)]:
                fn = runs[column]
                sync()
                start = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                sync()
                samples[column].append((time.perf_counter() - start) / CALLS * 1e6)
        for column, fn in runs.items():  # once replayed and past auto's trials
            try:
                ok = inference_accurate_now(fn, model, inputs, dtype)
            except Exception as error:
                row["columns"][column]["error"] = f"after timing: {type(error).__name__}: {str(error)[:300]}"
                ok = False
            row["columns"][column]["accurate_after_timing"] = ok
        if profiled:
            row["profiles"] = {c: profile_table(fn, profiled, device) for c, fn in runs.items()}
    for column, times in samples.items():
        row["columns"][column]["us"] = round(statistics.median(times), 1)
        row["columns"][column]["spread_us"] = [round(min(times), 1), round(max(times), 1)]
    return row


def model_parser(description: str) -> argparse.ArgumentParser:
    """The options of a lent GPU's per-model script: --models, --dtype, --device, --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=".")
    return parser


def append_row(path: Path, row: dict[str, Any]) -> None:
    """``row`` as one JSON line at the end of ``path`` (a run cut short keeps the
    rows it finished) and on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = model_parser(__doc__.splitlines()[0])
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument(
        "--profile", type=int, default=0, help="calls per column under torch.profiler, to DIR/profiles.txt"
    )
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "in_turn.jsonl"
    for name in args.models.split(","):
        torch._dynamo.reset()
        start = time.perf_counter()
        chosen = tuple(args.columns.split(","))
        row = model_row(name, args.device, getattr(torch, args.dtype), chosen, args.profile)
        row["wall_s"] = round(time.perf_counter() - start, 1)
        profiles = row.pop("profiles", {})
        if profiles:
            with (Path(args.out) / "profiles.txt").open("a") as f:
                for column, table in profiles.items():
                    f.write(f"== {name} {args.dtype} {column}, {args.profile} calls\n{table}\n")
        append_row(out, row)


if __name__ == "__main__":
    main()
