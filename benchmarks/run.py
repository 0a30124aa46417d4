"""`nox -s bench`: eager, inductor, direct ONNX Runtime and auto on the benchmark
models, in one run. Writes benchmarks/results/<stamp>.json, .md and .png (and
latest.*). Compare ratios within one run, never absolute times across runs.

    python -m benchmarks.run [--models tiny_mlp,mlp_1024] [--seconds 6]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from .columns import COLUMNS
from .models import MODELS

RESULTS = Path(__file__).parent / "results"


class _Worker:
    """A running ``benchmarks.worker`` process for one (model, column)."""

    def __init__(self, model: str, column: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", model, column],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=Path(__file__).parent.parent,
        )
        self.ready = self._expect("BENCH_READY ") or {"ok": False, "error": "worker died while compiling"}
        self.ready = json.loads(self.ready) if isinstance(self.ready, str) else self.ready

    def _expect(self, prefix: str) -> str | None:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        return None

    def time(self, calls: int) -> float:
        self.proc.stdin.write(f"{calls}\n")
        self.proc.stdin.flush()
        return float(self._expect("BENCH_TIME ")) / calls

    def close(self) -> float | None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            rss = self._expect("BENCH_RSS ")
            self.proc.wait(timeout=60)
            return json.loads(rss)["peak_rss_mb"] if rss else None
        return None


def _time_side_by_side(workers: dict[str, _Worker], seconds: float) -> dict[str, float]:
    """Median per-call time of each column, from batches taken in turn.

    Every batch lasts about 0.1 s; a pause before each lets the previous
    column's idle threads stop spinning, so no column pays for another."""
    live = {c: w for c, w in workers.items() if w.ready.get("ok")}
    calls = {c: max(1, min(5000, int(0.1 / max(w.ready["first_call_s"], 1e-6)))) for c, w in live.items()}
    samples: dict[str, list[float]] = {c: [] for c in live}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while live and (rounds < 5 or (time.perf_counter() < deadline and rounds < 60)):
        for column, worker in live.items():
            time.sleep(0.05)
            samples[column].append(worker.time(calls[column]))
        rounds += 1
    return {c: sorted(v)[len(v) // 2] for c, v in samples.items()}


def run(models: list[str], seconds: float) -> dict:
    rows = []
    for name in models:
        print(f"[bench] {name}: compiling each column in a fresh process", flush=True)
        workers = {col: _Worker(name, col) for col in COLUMNS}
        print(f"[bench] {name}: timing side by side", flush=True)
        per_call = _time_side_by_side(workers, seconds)
        rss = {col: w.close() for col, w in workers.items()}
        row = {"model": name, "columns": {}}
        for col in COLUMNS:
            ready = workers[col].ready
            row["columns"][col] = {
                "ok": bool(ready.get("ok")),
                "per_call_s": per_call.get(col),
                "compile_s": ready.get("compile_s"),
                "max_error": ready.get("max_error"),
                "peak_rss_mb": rss.get(col),
                "error": ready.get("error"),
            }
        rows.append(_with_ratios(row))
    return {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
    }


def _with_ratios(row: dict) -> dict:
    cols = row["columns"]
    peers = {c: v["per_call_s"] for c, v in cols.items() if c != "auto" and v["ok"] and v["per_call_s"]}
    best = min(peers.values()) if peers else None
    auto = cols["auto"]
    row["best_peer"] = min(peers, key=peers.get) if peers else None
    row["auto_over_best"] = auto["per_call_s"] / best if best and auto["ok"] else None
    ind = cols["inductor"]
    row["auto_compile_over_inductor"] = (
        auto["compile_s"] / ind["compile_s"] if auto["ok"] and ind["ok"] and ind["compile_s"] else None
    )
    return row


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"Run {result['time']} on {m['platform']}, {m['cpus']} CPUs, torch {m['torch']}.",
        "",
        "Each cell: per-call time (median of batches taken in turn, each column in its own process) \\| "
        "cold compile time (first call, fresh caches) \\| max abs error vs eager \\| peak RSS.",
        "",
        "| model | " + " | ".join(COLUMNS) + " | auto / best peer | auto compile / inductor compile |",
        "|---|" + "---|" * (len(COLUMNS) + 2),
    ]
    for row in result["rows"]:
        cells = []
        for col in COLUMNS:
            v = row["columns"][col]
            if not v["ok"]:
                cells.append(f"failed: {(v['error'] or '')[:60]}")
            else:
                rss = f"{v['peak_rss_mb']:.0f} MB" if v["peak_rss_mb"] else "-"
                cells.append(
                    f"{_fmt_time(v['per_call_s'])} \\| {v['compile_s']:.2f} s \\| {v['max_error']:.1e} \\| {rss}"
                )
        ratio = f"{row['auto_over_best']:.2f}x ({row['best_peer']})" if row["auto_over_best"] else "-"
        comp = f"{row['auto_compile_over_inductor']:.2f}" if row["auto_compile_over_inductor"] else "-"
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {ratio} | {comp} |")
    cuda = result.get("cuda", {})
    if "skipped" in cuda:
        lines += ["", f"CUDA benchmarks skipped: {cuda['skipped']}."]
    elif cuda:
        lines += ["", f"CUDA ({cuda['device']}, copy bandwidth {cuda['copy_GB/s']:.0f} GB/s):", ""]
        lines += [f"- {name}: " + json.dumps(v) for name, v in cuda["kernels"].items()]
        lines += ["- 20-op launch-bound graph: " + json.dumps(cuda["launch_bound_20_ops"])]
    ratios = [r["auto_over_best"] for r in result["rows"] if r["auto_over_best"]]
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines += ["", f"Geometric mean of auto / best peer: {geo:.2f}"]
    return "\n".join(lines) + "\n"


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(COLUMNS)
    for i, col in enumerate(COLUMNS):
        values = []
        for row in rows:
            eager = row["columns"]["eager"]["per_call_s"]
            v = row["columns"][col]
            values.append(v["per_call_s"] / eager if v["ok"] and eager else 0.0)
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, values, width, label=col)
        for x, row in zip(xs, rows):
            if not row["columns"][col]["ok"]:
                ax.text(x, 0.02, "failed", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks([j + width * (len(COLUMNS) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["model"] for r in rows])
    ax.set_ylabel("per-call time / eager (lower is better)")
    ax.set_title(f"dispatch benchmarks ({result['time']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seconds", type=float, default=6.0, help="timing budget per model")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; models: {list(MODELS)}")
    result = run(models, args.seconds)
    from .gpu import run as run_gpu

    result["cuda"] = run_gpu()
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    table = markdown(result)
    for base in (RESULTS / stamp, RESULTS / "latest"):
        base.with_suffix(".json").write_text(json.dumps(result, indent=2))
        base.with_suffix(".md").write_text(table)
        plot(result, base.with_suffix(".png"))
    print(table)
    print(f"[bench] wrote {RESULTS / stamp}.json/.md/.png")


if __name__ == "__main__":
    main()
