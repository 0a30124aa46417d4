"""`nox -s zoo`: the zoo's models under every column, one process per cell.

    python -m benchmarks.zoo.run [--models a,b] [--device cpu|cuda] [--dtype float32|bfloat16]
                                 [--seconds 10] [--no-train] [--no-warm] [--skip-columns a,b]
                                 [--logs DIR] [--compile-together] [--processes N]

Per cell: pass or fail with the reason, accuracy against eager in the cell's
dtype with an fp64 truth (as PyTorch's benchmark dashboard judges it),
per-call median (batches taken in turn across the columns' processes, after
``warm_up.WARM_UP_CALLS`` untimed calls in each; with --processes N, the
fastest of each column's N processes), cold compile (first call, fresh caches),
warm compile (a second process on the same caches, inductor and auto), peak
memory (RSS on CPU, allocated GPU memory on CUDA). Per column: pass rate and
geomean speedup over eager; then auto against its targets (``targets``).
Writes benchmarks/results/zoo-<device>-<stamp>.json, .md and .png with the
machine (CPU model and vector flags; GPU, driver and versions). The files
are written again after every model, so a run cut short (a lent GPU's time
running out) keeps the models it finished. Runs
without nox on a machine whose Python has torch, transformers and timm:
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..machine import cpu
from ..process import Worker, time_in_turn, warm_start_error
from ..run import _fmt_time as format_time
from ..warm_up import WARM_UP_CALLS
from .columns import CPU_COLUMNS, CUDA_COLUMNS, TRAIN_COLUMNS
from .models import ZOO
from .wider import EVERY_MODEL, model_names

RESULTS = Path(__file__).resolve().parent.parent / "results"
WARM = ("inductor", "auto")


def machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    info.update(cpu())
    info["threads"] = torch.get_num_threads()
    if device == "cuda":
        from ..gpu_report import machine as gpu_machine

        info.update(gpu_machine())
    for package in ("transformers", "timm", "onnxruntime", "triton"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    return info


def run_model(name: str, mode: str, columns: tuple[str, ...], args: argparse.Namespace) -> dict[str, Any]:
    processes = args.processes
    print(f"[zoo] {name} ({mode}): compiling each column in {processes} fresh process(es)", flush=True)
    replicas = [(c, k) for c in columns for k in range(processes)]
    caches = {(c, k): tempfile.mkdtemp(prefix=f"zoo-{name}-{c}-{k}-") for c, k in replicas}

    def start(column: str, replica: int, suffix: str = "") -> Worker:
        log = f"{name}-{mode}-{column}{f'-p{replica}' if replica else ''}{suffix}.log"
        return Worker(
            "benchmarks.zoo.worker",
            [name, column, mode, args.device, args.dtype, caches[column, replica]],
            "ZOO_READY ",
            Path(args.logs) / log if args.logs else None,
            gated=True,
        )

    # Every column builds its model at once; they compile in turn (cold compile
    # times are not taken beside another compile), or together with --compile-together.
    workers = {_key(c, k): start(c, k) for c, k in replicas}
    if args.compile_together:
        for worker in workers.values():
            worker.let_compile()
    for worker in workers.values():
        worker.release()
    medians = time_in_turn(workers, args.seconds)
    for worker in workers.values():
        worker.quit()  # processes end together: a compile pool takes seconds to shut down
    peaks = {key: w.close() for key, w in workers.items()}
    warm: dict[str, tuple[float | None, dict[str, Any]]] = {}  # its first call, its final report
    warm_errors: dict[str, str] = {}
    if not args.no_warm:
        seconds = {
            c: start(c, 0, "-warm") for c in WARM if c in columns and workers[_key(c, 0)].ready.get("ok")
        }
        # Each ends before the next compiles: a process that is ending (inductor's
        # compile pool shutting down) takes cores from a warm start compiling beside
        # it (auto's on hf_llama and hf_bert: 1.1 s each, then 1.0 and 0.9 s).
        for column, second in seconds.items():
            error = _warm_start(second, args.dtype)
            if error:
                warm_errors[column] = error
            else:
                warm[column] = (second.ready.get("compile_s"), second.final)
    cells = {}
    for column in columns:
        first = workers[_key(column, 0)]
        ready = first.ready  # the first process's compile, accuracy and routes
        runs = [medians[_key(column, k)] for k in range(processes) if _key(column, k) in medians]
        peak = [m for k in range(processes) if (m := peaks[_key(column, k)]) is not None]
        after = first.final.get("accurate_after_warm_up")  # None where it never ran
        per_call = min(runs) if runs else None
        warm_compile, warm_final = warm.get(column, (None, {}))
        cells[column] = {
            "ok": bool(ready.get("ok")) and bool(runs) and after is not False and column not in warm_errors,
            "error": ready.get("error")
            or _error_after_warm_up(first.final, args.dtype)
            or warm_errors.get(column),
            "accurate": ready.get("accurate"),
            "accurate_after_warm_up": after,
            # The fastest process's median: a process's own speed moved host-bound
            # columns by up to 1.5x on an H200 (benchmarks/results/gpu-h200-20261126-2.md).
            "per_call_s": per_call,
            "per_call_runs_s": runs,
            "compile_s": ready.get("compile_s"),
            "later_compile_s": later_compile_s(first.final, per_call),
            "warm_compile_s": warm_compile,
            "warm_later_compile_s": later_compile_s(warm_final, per_call) if warm_compile else None,
            "peak_mb": max(peak) if peak else None,
            # As they ran after the warm-up (a trial may move regions), else at the first call.
            "routes": first.final.get("routes") or ready.get("routes") or [],
            "first_call_routes": ready.get("routes") or [],
            "warm_up_s": first.final.get("warm_up_s"),
        }
    return {"model": name, "mode": mode, "source": EVERY_MODEL[name].source, "cells": cells}


def _warm_start(second: Worker, dtype: str) -> str | None:
    """Why a warm start failed, or None (its times are then in ``second``'s reports):
    a second process on the first's caches is a fresh-process round trip of
    everything they keep, judged as the first process was, on its first call and,
    after its warm-up and one call, again on new input values
    (``worker._accurate_after_warm_up``)."""
    second.release()
    return warm_start_error(second, lambda final: _error_after_warm_up(final, dtype))


def later_compile_s(final: dict[str, Any], per_call_s: float | None) -> float | None:
    """What a process compiled after its first call: its warm-up's time beyond its
    calls at the cell's per-call median (None where either is unknown). auto's
    trial compiles inductor tens of calls in (hf_bert: 7.4 s at its 80th call),
    which a compile time taken on the first call alone leaves out; the trial's
    timed calls on its slower sides count here too, as a process pays them once."""
    warm_up, calls = final.get("warm_up_s"), final.get("warm_up_calls")
    if warm_up is None or calls is None or per_call_s is None:
        return None
    return max(0.0, warm_up - calls * per_call_s)


def _error_after_warm_up(final: dict[str, Any], dtype: str) -> str | None:
    """Why a cell that was accurate on its first call failed when judged again at its end."""
    if final.get("accurate_after_warm_up") is not False:
        return None
    why = final.get("error_after_warm_up") or f"differs from {dtype} eager beyond the dashboard's tolerance"
    return f"after the warm-up: {why}"


def _key(column: str, replica: int) -> str:
    """A worker's name: its column, and which of the column's processes it is."""
    return f"{column}#{replica}"


def summary(rows: list[dict[str, Any]], columns: tuple[str, ...], mode: str) -> dict[str, dict[str, Any]]:
    """Per column: pass rate and geomean speedup over eager (on the models both ran)."""
    rows = [r for r in rows if r["mode"] == mode]
    out = {}
    for column in columns:
        passed = [r for r in rows if r["cells"][column]["ok"]]
        speedups = [
            r["cells"]["eager"]["per_call_s"] / r["cells"][column]["per_call_s"]
            for r in passed
            if r["cells"]["eager"]["ok"]
        ]
        out[column] = {
            "pass_rate": len(passed) / len(rows) if rows else None,
            "geomean_speedup_over_eager": math.exp(sum(map(math.log, speedups)) / len(speedups))
            if speedups
            else None,
        }
    return out


# auto's targets: per-call time within this factor of the best other column.
WITHIN = 1.05


def targets(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """auto against the zoo's targets, from this run's rows of ``mode``: the rows
    where auto's per-call time is over ``WITHIN`` times the best other column
    (and the best other than direct ONNX Runtime, which runs without Dynamo),
    and, as ratios of geomeans over the rows where both sides passed, its
    speedup over eager against inductor's, its cold compile against inductor's,
    and its warm compile against its own cold."""
    rows = [r for r in rows if r["mode"] == mode and r["cells"]["auto"]["ok"]]

    def cell(row: dict[str, Any], column: str) -> dict[str, Any] | None:
        found = row["cells"].get(column)
        return found if found is not None and found["ok"] else None

    def over(row: dict[str, Any], leave_out: str | None) -> bool:
        best = _best_other(row, leave_out)
        return best is not None and row["cells"]["auto"]["per_call_s"] > WITHIN * best

    speedups, colds, warms, whole_colds, whole_warms = [], [], [], [], []
    for row in rows:
        auto, eager, inductor = row["cells"]["auto"], cell(row, "eager"), cell(row, "inductor")
        if eager and inductor:
            speedups.append(
                (eager["per_call_s"] / auto["per_call_s"], eager["per_call_s"] / inductor["per_call_s"])
            )
        if inductor and auto["compile_s"] and inductor["compile_s"]:
            colds.append((auto["compile_s"], inductor["compile_s"]))
        if auto["warm_compile_s"] and auto["compile_s"]:
            warms.append((auto["warm_compile_s"], auto["compile_s"]))
        whole_auto = _with_later(auto, "compile_s", "later_compile_s")
        whole_inductor = _with_later(inductor, "compile_s", "later_compile_s") if inductor else None
        if whole_auto and whole_inductor:
            whole_colds.append((whole_auto, whole_inductor))
        whole_warm = _with_later(auto, "warm_compile_s", "warm_later_compile_s")
        if whole_warm and whole_auto:
            whole_warms.append((whole_warm, whole_auto))
    return {
        "rows": len(rows),
        "over_best_other": [r["model"] for r in rows if over(r, None)],
        "over_best_other_than_direct_ort": [r["model"] for r in rows if over(r, "onnxrt_direct")]
        if any("onnxrt_direct" in r["cells"] for r in rows)
        else None,
        "speedup_over_inductors": _geomean_ratio(speedups),
        "cold_compile_over_inductors": _geomean_ratio(colds),
        "warm_over_cold": _geomean_ratio(warms),
        "cold_compile_with_later_over_inductors": _geomean_ratio(whole_colds),
        "warm_over_cold_with_later": _geomean_ratio(whole_warms),
    }


def _with_later(cell: dict[str, Any], first: str, later: str) -> float | None:
    """A cell's compile time on its first call plus what it compiled after it, where both are known."""
    if not cell.get(first) or cell.get(later) is None:
        return None
    return cell[first] + cell[later]


def _geomean_ratio(pairs: list[tuple[float, float]]) -> float | None:
    """The geomean of the first members over that of the second (None for no pairs)."""
    if not pairs:
        return None
    return math.exp(sum(math.log(a) - math.log(b) for a, b in pairs) / len(pairs))


def _targets_lines(t: dict[str, Any]) -> list[str]:
    def x(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    def listed(names: list[str]) -> str:
        return f"{t['rows'] - len(names)} of {t['rows']}" + (f" (over: {', '.join(names)})" if names else "")

    lines = [
        "",
        "| auto | this run |",
        "|---|---|",
        f"| rows within {WITHIN}x the best other column | {listed(t['over_best_other'])} |",
    ]
    if t["over_best_other_than_direct_ort"] is not None:
        lines.append(
            f"| ... the best other than direct ONNX Runtime | {listed(t['over_best_other_than_direct_ort'])} |"
        )
    lines += [
        f"| geomean speedup over eager, over inductor's | {x(t['speedup_over_inductors'])} |",
        f"| cold compile over inductor's (geomean) | {x(t['cold_compile_over_inductors'])} |",
        f"| warm compile over its own cold (geomean) | {x(t['warm_over_cold'])} |",
    ]
    with_later = {  # older results lack what each compiled after its first call
        "cold compile over inductor's": t.get("cold_compile_with_later_over_inductors"),
        "warm compile over its own cold": t.get("warm_over_cold_with_later"),
    }
    lines += [
        f"| {what}, with what each compiled after its first call (geomean) | {x(ratio)} |"
        for what, ratio in with_later.items()
        if ratio is not None
    ]
    return lines


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"# Model zoo, {result['device']} {result['dtype']}, {result['time']}", ""]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    if result.get("processes", 1) > 1:
        lines.append(
            f"- per call: each column ran in {result['processes']} processes, timed in turn with the "
            "others; a cell shows the fastest process's median"
        )
    for mode, columns in result["columns"].items():
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if not rows:
            continue
        lines += [
            "",
            f"## {mode}",
            "",
            f"Per call (after {WARM_UP_CALLS} untimed calls) \\| cold compile \\| warm compile \\| peak MB; auto "
            "also shows its routes as they ran then, with the warm-up's length where it took over "
            "twice its calls' time (a trial compiled on a later call).",
            "",
        ]
        lines += [
            "| model | " + " | ".join(columns) + " | auto / best other |",
            "|---|" + "---|" * (len(columns) + 1),
        ]
        for row in rows:
            cells = []
            for column in columns:
                c = row["cells"][column]
                if not c["ok"]:
                    cells.append(f"FAIL: {(c['error'] or '')[:70]}")
                    continue
                parts = [format_time(c["per_call_s"]), f"{c['compile_s']:.1f} s"]
                if c["warm_compile_s"] is not None:
                    parts.append(f"warm {c['warm_compile_s']:.1f} s")
                parts.append(f"{c['peak_mb']:.0f} MB" if c["peak_mb"] else "-")
                if column == "auto":
                    parts.append("+".join(c["routes"]))
                    warm_up = c.get("warm_up_s")
                    if warm_up and warm_up > 2 * WARM_UP_CALLS * c["per_call_s"]:
                        parts.append(f"warm-up {warm_up:.1f} s")
                cells.append(" \\| ".join(parts))
            lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {_ratio(row)} |")
        lines += ["", "| column | pass rate | geomean speedup over eager |", "|---|---|---|"]
        for column, s in result["summary"][mode].items():
            rate = f"{s['pass_rate']:.0%}" if s["pass_rate"] is not None else "-"
            geo = f"{s['geomean_speedup_over_eager']:.2f}x" if s["geomean_speedup_over_eager"] else "-"
            lines.append(f"| {column} | {rate} | {geo} |")
        lines += _targets_lines(targets(result["rows"], mode))
    return "\n".join(lines) + "\n"


def _ratio(row: dict[str, Any]) -> str:
    """auto's per-call time over the fastest column that passed and is not auto's own."""
    best = _best_other(row)
    if not row["cells"]["auto"]["ok"] or best is None:
        return "-"
    return f"{row['cells']['auto']['per_call_s'] / best:.2f}x"


def _best_other(row: dict[str, Any], leave_out: str | None = None) -> float | None:
    """The fastest per-call time among the row's columns that passed, other than
    auto's own and ``leave_out``; None where there is none."""
    others = [
        c["per_call_s"]
        for name, c in row["cells"].items()
        if not name.startswith("auto") and name != leave_out and c["ok"] and c["per_call_s"]
    ]
    return min(others) if others else None


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["mode"] == "infer"]
    columns = result["columns"]["infer"]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.6), 4.5))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        values = []
        for row in rows:
            eager, cell = row["cells"]["eager"], row["cells"][column]
            values.append(eager["per_call_s"] / cell["per_call_s"] if cell["ok"] and eager["ok"] else 0.0)
        ax.bar([j + i * width for j in range(len(rows))], values, width, label=column)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks([j + width * (len(columns) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["model"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speedup over eager (higher is better; 0: failed)")
    ax.set_title(f"dispatch model zoo, {result['device']} {result['dtype']} ({result['time']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(ZOO), help="names, comma-separated; 'wider' for the on-demand set"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seconds", type=float, default=8.0, help="timing budget per model")
    parser.add_argument("--no-train", action="store_true", help="inference only")
    parser.add_argument("--train-only", action="store_true", help="the training rows only")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-start processes")
    parser.add_argument(
        "--skip-columns",
        default="",
        help="columns left out, comma-separated (eager and auto always run): "
        "max_autotune_no_cudagraphs compiles for minutes where GPU time is short",
    )
    parser.add_argument(
        "--compile-together",
        action="store_true",
        help="every column compiles at once (faster where GPU time is short; compile times then overlap)",
    )
    parser.add_argument("--logs", default=None, help="a folder for each cell's stderr (warnings, tracebacks)")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes per column, timed in turn with the others; a cell's per-call time is the "
        "fastest process's median (a process's own speed moves host-bound GPU columns)",
    )
    args = parser.parse_args(argv)
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    try:
        names = model_names(args.models)
    except ValueError as error:
        parser.error(str(error))
    if args.processes < 1:
        parser.error("--processes takes 1 or more")
    skipped = {c for c in args.skip_columns.split(",") if c}
    if skipped & {"eager", "auto"}:
        parser.error("eager and auto are always measured: the ratios are taken against them")
    infer_columns = tuple(
        c for c in (CUDA_COLUMNS if args.device == "cuda" else CPU_COLUMNS) if c not in skipped
    )
    train_columns = tuple(c for c in TRAIN_COLUMNS if c not in skipped)
    columns = {"infer": infer_columns, "train": train_columns}
    work = [] if args.train_only else [(n, "infer") for n in names]
    if not args.no_train:
        work += [(n, "train") for n in names if EVERY_MODEL[n].trains]
    base = RESULTS / f"zoo-{args.device}-{args.dtype}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = {
        "device": args.device,
        "dtype": args.dtype,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(args.device),
        "processes": args.processes,
        "columns": columns,
        "rows": [],
    }
    for name, mode in work:
        result["rows"].append(run_model(name, mode, columns[mode], args))
        write(result, base)
    print(markdown(result))
    print(f"[zoo] wrote {base}.json/.md/.png")


def write(result: dict[str, Any], base: Path) -> None:
    """The result so far, as JSON, Markdown and a plot under ``base``."""
    result["summary"] = {
        mode: summary(result["rows"], cols, mode) for mode, cols in result["columns"].items()
    }
    result["targets"] = {mode: targets(result["rows"], mode) for mode in result["columns"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(result, indent=2))
    base.with_suffix(".md").write_text(markdown(result))
    plot(result, base.with_suffix(".png"))


if __name__ == "__main__":
    main()
