"""Every zoo model through ``dispatch.lower``: saved in one process, loaded in a fresh one.

    python -m benchmarks.zoo.lowered [--models a,b] [--seconds 3]

For each model (CPU inference): process A builds it, runs eager and ``auto``,
lowers it, saves the program and the outputs; process B (fresh) loads the
program, makes the first call (timed: load plus first call), checks its
outputs against auto's and eager's, and times calls against eager in turn.
A model that ``torch.export`` cannot export is reported with the reason.
Writes ``benchmarks/results/zoo-lowered-*.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from ..process import marked_report

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _leaves(x):
    import torch
    from torch.utils import _pytree as pytree

    return [t.float() for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _max_error(a, b) -> float:
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return float("inf")
    return max(((x - y).abs().max().item() for x, y in zip(la, lb)), default=0.0)


def lower_and_save(name: str, folder: str) -> dict:
    import torch

    import dispatch

    from .wider import EVERY_MODEL

    model, inputs = EVERY_MODEL[name].build()
    model.eval()
    no_cache = _without_kv_cache(model)
    with torch.no_grad():
        eager = model(*inputs)
        start = time.perf_counter()
        auto = torch.compile(model, backend="auto")(*inputs)
        auto_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            program = dispatch.lower(model, inputs)
            program.save(os.path.join(folder, "model.dispatch"))
        except dispatch.DispatchError as error:
            return {"ok": False, "stage": "lower", "error": f"{type(error).__name__}: {error}"[:300]}
        lower_s = time.perf_counter() - start
    torch.save({"inputs": inputs, "eager": eager, "auto": auto}, os.path.join(folder, "io.pt"))
    return {
        "ok": True,
        "auto_compile_s": auto_s,
        "lower_s": lower_s,
        "routes": [r.route for r in program.regions],
        "lowered_vs_auto_in_process": _max_error(program(*inputs), auto),
        "use_cache_false": no_cache,
    }


def _without_kv_cache(model) -> bool:
    """Turn off the KV cache of a transformers decoder, as ``lower``'s error tells a
    user to: torch.export cannot return transformers' cache objects. True where a
    cache was turned off (eager, auto and the program then all run without one)."""
    turned_off = False
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False
            turned_off = True
    return turned_off


def load_and_time(folder: str, seconds: float) -> dict:
    start = time.perf_counter()
    import torch

    import dispatch

    imported_s = time.perf_counter() - start
    io = torch.load(os.path.join(folder, "io.pt"), weights_only=False)  # our own outputs, not the program
    inputs = io["inputs"]
    with torch.no_grad():
        start = time.perf_counter()
        program = dispatch.load(os.path.join(folder, "model.dispatch"))
        out = program(*inputs)
        load_s = time.perf_counter() - start
        per_call_s = _median_call_s(lambda: program(*inputs), seconds)
    return {
        "load_s": load_s,
        "import_s": imported_s,
        "vs_auto": _max_error(out, io["auto"]),
        "vs_eager": _max_error(out, io["eager"]),
        "lowered_per_call_s": per_call_s,
    }


def eager_time(name: str, seconds: float) -> float:
    """Eager's median call, in a process of its own (the loading process has no model)."""
    import torch

    from .wider import EVERY_MODEL

    model, inputs = EVERY_MODEL[name].build()
    model.eval()
    _without_kv_cache(model)
    with torch.no_grad():
        return _median_call_s(lambda: model(*inputs), seconds)


def _median_call_s(fn, seconds: float) -> float:
    """The median of ``fn``'s calls over ``seconds`` (at least five), after three warm-up calls."""
    import statistics

    for _ in range(3):
        fn()
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _child(args: list[str]) -> dict:
    report, error = marked_report("benchmarks.zoo.lowered", args, "ZOO_LOWERED ", timeout=1800)
    return report if report is not None else {"ok": False, "stage": args[0], "error": error}


def run(models: list[str], seconds: float) -> dict:
    rows = []
    for name in models:
        print(f"[zoo-lowered] {name}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"zoo-lowered-{name}-") as folder:
            row = {"model": name, **_child(["--lower", name, folder])}
            if row["ok"]:
                loaded = _child(["--load", name, folder, str(seconds)])
                row.update(loaded)
                row["ok"] = "load_s" in loaded
                if row["ok"]:
                    row["eager_per_call_s"] = _child(["--eager", name, folder, str(seconds)])["eager_s"]
        rows.append(row)
    return {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
    }


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"Run {result['time']} on {m['platform']}, {m['cpus']} CPUs (CPU inference, float32).",
        "",
        "Lowered and saved in one process, loaded in a fresh one. load: `dispatch.load` plus the "
        "first call; vs auto / vs eager: largest absolute difference of the outputs.",
        "",
        "| model | routes | lower | load | load / auto compile | vs auto | vs eager | lowered / eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if not r["ok"]:
            lines.append(
                f"| {r['model']} | not lowered ({r.get('stage')}): {r.get('error', '')[:120]} | | | | | | |"
            )
            continue
        routes = "+".join(dict.fromkeys(r["routes"])) + (
            " (use_cache=False)" if r.get("use_cache_false") else ""
        )
        lines.append(
            f"| {r['model']} | {routes} | {r['lower_s']:.1f} s | {r['load_s'] * 1e3:.0f} ms "
            f"| {r['load_s'] / r['auto_compile_s']:.3f} | {r['vs_auto']:.1e} | {r['vs_eager']:.1e} "
            f"| {r['lowered_per_call_s'] / r['eager_per_call_s']:.2f}x |"
        )
    done = sum(r["ok"] for r in result["rows"])
    lines += [
        "",
        f"{done} of {len(result['rows'])} models lowered, saved and loaded. use_cache=False: a "
        "transformers decoder lowered (and compared) without its KV cache, as lower's error asks, "
        "since torch.export cannot return the cache object.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--lower"]:
        print("ZOO_LOWERED " + json.dumps(lower_and_save(sys.argv[2], sys.argv[3])), flush=True)
        return
    if sys.argv[1:2] == ["--load"]:
        print("ZOO_LOWERED " + json.dumps(load_and_time(sys.argv[3], float(sys.argv[4]))), flush=True)
        return
    if sys.argv[1:2] == ["--eager"]:
        print(
            "ZOO_LOWERED " + json.dumps({"eager_s": eager_time(sys.argv[2], float(sys.argv[4]))}), flush=True
        )
        return
    from .models import ZOO
    from .wider import model_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(ZOO), help="names, comma-separated; 'wider' for the on-demand set"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    args, _ = parser.parse_known_args()  # nox -s zoo passes the zoo run's arguments here too
    try:
        names = model_names(args.models)
    except ValueError as error:
        parser.error(str(error))
    result = run(names, args.seconds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = RESULTS / f"zoo-lowered-cpu-float32-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    base.with_suffix(".md").write_text(table)
    print(table)
    print(f"[zoo-lowered] wrote {base}.json/.md")


if __name__ == "__main__":
    main()
