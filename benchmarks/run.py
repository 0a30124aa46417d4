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


def _worker(*args: str) -> dict:
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("DISPATCH_"):
            del env[name]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parent.parent,
        timeout=1800,
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line.removeprefix("BENCH_RESULT "))
    return {
        "ok": False,
        "error": f"worker exited {out.returncode}: {out.stderr.strip().splitlines()[-1:] or ''}",
    }


def run(models: list[str], seconds: float) -> dict:
    rows = []
    for name in models:
        print(f"[bench] {name}: cold compiles", flush=True)
        compiles = {col: _worker("compile", name, col) for col in COLUMNS}
        print(f"[bench] {name}: per-call times", flush=True)
        timing = _worker("time", name, ",".join(COLUMNS), str(seconds))
        row = {"model": name, "columns": {}}
        for col in COLUMNS:
            t = timing.get("columns", {}).get(col, {"ok": False, "error": timing.get("error")})
            c = compiles[col]
            ok = t.get("ok", False) and c.get("ok", False)
            row["columns"][col] = {
                "ok": ok,
                "per_call_s": t.get("per_call_s"),
                "compile_s": c.get("compile_s"),
                "max_error": t.get("max_error"),
                "error": None if ok else (t.get("error") or c.get("error")),
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
        "Per-call time (median of interleaved batches) | cold compile time (first call, fresh caches) | max |error| vs eager.",
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
                cells.append(
                    f"{_fmt_time(v['per_call_s'])} \\| {v['compile_s']:.2f} s \\| {v['max_error']:.1e}"
                )
        ratio = f"{row['auto_over_best']:.2f}x ({row['best_peer']})" if row["auto_over_best"] else "-"
        comp = f"{row['auto_compile_over_inductor']:.2f}" if row["auto_compile_over_inductor"] else "-"
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {ratio} | {comp} |")
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
