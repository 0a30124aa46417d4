"""`nox -s bench`: every peer (eager, inductor, direct ONNX Runtime, OpenVINO) and
auto with measuring off and on, on the benchmark models, in one run; cold and
warm (median of three later processes, same caches) compile times, peak RSS per column, and the
1024-wide MLP's share of this machine's peak GEMM throughput. Writes benchmarks/results/<stamp>.json, .md and .png (and
latest.*). Compare ratios within one run, never absolute times across runs.

    python -m benchmarks.run [--models tiny_mlp,mlp_1024] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from .columns import COLUMNS, OURS, PEERS
from .machine import cpu
from .models import MODELS
from .process import Worker, time_in_turn, warm_start_error
from .warm_up import WARM_UP_CALLS

RESULTS = Path(__file__).parent / "results"


def _Worker(model: str, column: str, cache_dir: str) -> Worker:
    """A ``benchmarks.worker`` process for one (model, column)."""
    return Worker("benchmarks.worker", [model, column, cache_dir], "BENCH_READY ")


WARM_STARTS = 3  # one warm process varied by up to 40% (0.69 to 0.97 s on the transformer layer)


def _warm_start_s(model: str, column: str, cache_dir: str) -> tuple[float | None, str | None]:
    """Median compile time of ``WARM_STARTS`` later processes on the first one's
    caches, or why one failed: each is a fresh-process round trip of what the caches
    keep, judged on its first call and again after one more on new input values."""
    print(f"[bench] {model}: warm starts of {column} (later processes, same caches)", flush=True)
    times = []
    for _ in range(WARM_STARTS):
        worker = _Worker(model, column, cache_dir)
        error = warm_start_error(worker, lambda final: _after_timing(final.get("error_after_timing")))
        if error:
            return None, error
        times.append(worker.ready["compile_s"])
    return sorted(times)[len(times) // 2], None


def _after_timing(error: str | None) -> str | None:
    """Why a column failed its check after timing (``worker.py``), as the report says it."""
    return f"after timing: {error}" if error else None


def run(models: list[str], seconds: float) -> dict:
    rows = []
    peak, peak_engine = peak_gemm_flops()
    for name in models:
        print(f"[bench] {name}: compiling each column in a fresh process", flush=True)
        caches = {col: tempfile.mkdtemp(prefix=f"bench-{name}-{col}-") for col in COLUMNS}
        workers = {col: _Worker(name, col, caches[col]) for col in COLUMNS}
        print(f"[bench] {name}: timing side by side", flush=True)
        per_call = time_in_turn(workers, seconds)
        rss = {col: w.close() for col, w in workers.items()}
        warm = {col: _warm_start_s(name, col, caches[col]) for col in ("inductor", "auto", "auto_tuned")}
        warm_s = {col: compile_s for col, (compile_s, _) in warm.items()}
        warm_errors = {col: error for col, (_, error) in warm.items() if error}
        row = {"model": name, "columns": {}}
        for col in COLUMNS:
            ready = workers[col].ready
            final = workers[col].final
            after = final.get("error_after_timing")  # None: still accurate, or not timed
            row["columns"][col] = {
                "ok": bool(ready.get("ok")) and not after and col not in warm_errors,
                "per_call_s": per_call.get(col),
                "compile_s": ready.get("compile_s"),
                "warm_compile_s": warm_s.get(col),
                "max_error": ready.get("max_error"),
                "peak_rss_mb": rss.get(col),
                "error": ready.get("error") or _after_timing(after) or warm_errors.get(col),
                # as they ran after the warm-up, where it ran: a trial may move regions
                "routes": final.get("routes") or ready.get("routes") or [],
                "warm_up_s": final.get("warm_up_s"),
                "load_s": ready.get("load_s"),
            }
        flops = model_flops(name)
        if flops and peak:
            row["gemm_peak_fraction"] = {
                col: flops / v["per_call_s"] / peak for col, v in row["columns"].items() if v["per_call_s"]
            }
        rows.append(_with_ratios(row))
    return {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            **cpu(),
            "peak_gemm_gflops": peak / 1e9 if peak else None,
            "peak_gemm_engine": peak_engine,
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
    }


def peak_gemm_flops(n: int = 2048) -> tuple[float, str]:
    """This machine's GEMM throughput and the engine that reached it: one large
    fp32 matmul, best of several, by torch.mm and by ONNX Runtime's MatMul where
    it is installed. torch.mm alone is no peak: on an AMD EPYC with AVX-512 it ran
    at less than half ONNX Runtime's MLAS, and the routes read "209% of peak"."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = {"torch.mm": min(_timed(lambda: torch.mm(a, b)) for _ in range(5))}
    matmul = _ort_matmul(a, b)
    if matmul is not None:
        matmul()
        best["onnxruntime MatMul"] = min(_timed(matmul) for _ in range(5))
    engine = min(best, key=best.get)
    return 2 * n**3 / best[engine], engine


def _ort_matmul(a: torch.Tensor, b: torch.Tensor):
    """A zero-argument callable multiplying ``a`` by ``b`` in ONNX Runtime, or None
    where onnxruntime or onnx is missing."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        return None
    h = onnx.helper
    shape = list(a.shape)
    graph = h.make_graph(
        [h.make_node("MatMul", ["a", "b"], ["c"])],
        "gemm",
        [h.make_tensor_value_info(x, onnx.TensorProto.FLOAT, shape) for x in ("a", "b")],
        [h.make_tensor_value_info("c", onnx.TensorProto.FLOAT, shape)],
    )
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"a": a.numpy(), "b": b.numpy()}
    return lambda: session.run(None, feeds)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def model_flops(name: str) -> float | None:
    """Multiply-add FLOPs of the Linear layers in one call, for the models whose
    time they dominate."""
    if name not in ("mlp_1024", "custom_op_mlp"):
        return None
    from .models import build

    model, (x,) = build(name)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return sum(2.0 * x.shape[0] * m.in_features * m.out_features for m in linears)


def _with_ratios(row: dict) -> dict:
    cols = row["columns"]
    peers = {c: cols[c]["per_call_s"] for c in PEERS if cols[c]["ok"] and cols[c]["per_call_s"]}
    best = min(peers.values()) if peers else None
    row["best_peer"] = min(peers, key=peers.get) if peers else None
    eager = cols["eager"]
    for col in OURS:
        ours = cols[col]
        row[f"{col}_over_best"] = ours["per_call_s"] / best if best and ours["ok"] else None
        row[f"{col}_warm_over_cold"] = (
            ours["warm_compile_s"] / ours["compile_s"] if ours["ok"] and ours["warm_compile_s"] else None
        )
        row[f"{col}_rss_over_eager"] = (
            ours["peak_rss_mb"] / eager["peak_rss_mb"]
            if ours["peak_rss_mb"] and eager["peak_rss_mb"]
            else None
        )
    lowered, auto = cols["lowered"], cols["auto"]
    row["lowered_load_over_auto_compile"] = (
        lowered["load_s"] / auto["compile_s"]
        if lowered["ok"] and auto["ok"] and lowered.get("load_s")
        else None
    )
    row["lowered_over_eager"] = (
        lowered["per_call_s"] / eager["per_call_s"] if lowered["ok"] and eager["per_call_s"] else None
    )
    row["auto_over_eager"] = (
        cols["auto"]["per_call_s"] / eager["per_call_s"]
        if cols["auto"]["ok"] and eager["per_call_s"]
        else None
    )
    return row


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"Run {result['time']} on {m['platform']}, {m['cpus']} CPUs, torch {m['torch']}.",
        "",
        f"CPU: {m.get('cpu', 'unknown')}; vector flags: {', '.join(m.get('vector_flags') or ['unknown'])}.",
        "",
        f"Per-call time (median of batches taken in turn, each column in its own process, after "
        f"{WARM_UP_CALLS} untimed calls) \\| "
        "cold compile (first call, fresh caches) \\| warm compile (median of three later processes, same caches) "
        "\\| peak RSS; for auto, the routes its regions ran on after those calls. auto: rules; "
        "auto_tuned: measured routing.",
        "",
        "| model | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for row in result["rows"]:
        cells = []
        for col in COLUMNS:
            v = row["columns"][col]
            if not v["ok"]:
                cells.append(f"failed: {(v['error'] or '')[:60]}")
                continue
            parts = [_fmt_time(v["per_call_s"]), f"{v['compile_s']:.2f} s"]
            if v.get("warm_compile_s"):
                parts.append(f"warm {v['warm_compile_s']:.2f} s")
            if v.get("load_s"):
                parts.append(f"load {v['load_s'] * 1e3:.0f} ms")
            if v.get("routes"):
                parts.append("+".join(dict.fromkeys(v["routes"])))
            parts.append(f"{v['peak_rss_mb']:.0f} MB" if v["peak_rss_mb"] else "-")
            cells.append(" \\| ".join(parts))
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ratios (targets: per call <= 1.0x the best peer, 1.05x noise; geomean <= 0.95; "
        "warm <= 0.20x cold; RSS <= 1.2x eager):",
        "",
        "| model | best peer | auto / best | auto_tuned / best | auto / eager | warm / cold (auto, tuned) "
        "| RSS / eager (auto, tuned) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['model']} | {row['best_peer'] or '-'} | {_x(row['auto_over_best'])} "
            f"| {_x(row['auto_tuned_over_best'])} | {_x(row['auto_over_eager'])} "
            f"| {_x(row['auto_warm_over_cold'])}, {_x(row['auto_tuned_warm_over_cold'])} "
            f"| {_x(row['auto_rss_over_eager'])}, {_x(row['auto_tuned_rss_over_eager'])} |"
        )
    lines += [
        "",
        "lowered (targets: load + first call <= 0.05x auto's cold compile; per call <= 1.0x eager on the "
        "tiny MLP, <= 1.05x the best peer elsewhere):",
        "",
        "| model | lowered / best | lowered / eager | load / auto cold compile |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['model']} | {_x(row['lowered_over_best'])} | {_x(row['lowered_over_eager'])} "
            f"| {_x(row['lowered_load_over_auto_compile'])} |"
        )
    for col in OURS:
        ratios = [r[f"{col}_over_best"] for r in result["rows"] if r[f"{col}_over_best"]]
        if ratios:
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            lines += ["", f"Geometric mean of {col} / best peer: {geo:.2f}"]
    for row in result["rows"]:
        if row.get("gemm_peak_fraction"):
            peak = m.get("peak_gemm_gflops")
            fractions = ", ".join(f"{c} {f:.0%}" for c, f in row["gemm_peak_fraction"].items())
            lines += [
                "",
                f"{row['model']}: share of this machine's peak GEMM ({peak:.0f} GFLOP/s, "
                f"{m.get('peak_gemm_engine', 'torch.mm')} on 2048x2048 fp32): {fractions}",
            ]
            floor = _gemm_floor_speedup(row)
            if floor:
                lines.append(floor)
    cuda = result.get("cuda", {})
    if "skipped" in cuda:
        lines += ["", f"CUDA benchmarks skipped: {cuda['skipped']}."]
    elif cuda:
        lines += ["", f"CUDA ({cuda['device']}, copy bandwidth {cuda['copy_GB/s']:.0f} GB/s):", ""]
        lines += [f"- {name}: " + json.dumps(v) for name, v in cuda["kernels"].items()]
        lines += ["- 20-op launch-bound graph: " + json.dumps(cuda["launch_bound_20_ops"])]
    return "\n".join(lines) + "\n"


def _gemm_floor_speedup(row: dict) -> str | None:
    """The most any route could gain over the faster of eager and inductor: the
    model's GEMMs alone at this machine's peak, every other op free."""
    cols = row["columns"]
    fraction = row["gemm_peak_fraction"].get("eager")
    baseline = [
        cols[c]["per_call_s"] for c in ("eager", "inductor") if cols[c]["ok"] and cols[c]["per_call_s"]
    ]
    if row["model"] != "custom_op_mlp" or not fraction or not baseline:
        return None
    floor_s = fraction * cols["eager"]["per_call_s"]  # the GEMM FLOPs at 100% of peak
    return (
        f"{row['model']}: its GEMMs alone take {floor_s * 1e3:.2f} ms at 100% of peak, so no route can be "
        f"more than {min(baseline) / floor_s:.2f}x faster than the faster of eager and inductor here"
    )


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio else "-"


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
    parser.add_argument("--seconds", type=float, default=20.0, help="timing budget per model")
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
