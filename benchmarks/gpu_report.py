"""The GPU report: `pytest -m gpu` and the CUDA kernel bench, written under
``benchmarks/results/gpu-<stamp>.{json,md}``.

    python -m benchmarks.gpu_report          # on a machine with CUDA, no nox needed
    nox -s gpu                               # the same, in a nox environment

It records the GPU model, driver, torch, triton and CUDA versions, every GPU
test's outcome, every measured ratio and whether the CUDA targets hold:
softmax, layer norm and RMS norm >= 80% of the measured copy bandwidth,
matmul + GELU >= 0.9x inductor's throughput, the 20-op launch-bound graph
under cudagraphs <= 1/3 of its eager time. Without CUDA it writes nothing and
says so.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": installed("triton"),
        "onnxruntime": installed("onnxruntime"),
        "python": platform.python_version(),
    }


def gpu_tests(extra: list[str]) -> dict[str, str]:
    """Each GPU test's outcome ("passed", "failed: ...", "skipped: ...")."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gpu.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", f"--junitxml={junit}", *extra], check=False
        )
        if not junit.exists():
            return {"pytest": "failed: no report written"}
        outcomes = {}
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            if problem is None:
                outcomes[name] = "passed"
            else:
                word = "skipped" if problem.tag == "skipped" else "failed"
                outcomes[name] = f"{word}: {(problem.get('message') or '').splitlines()[0][:200]}"
        return outcomes


def targets(bench: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each CUDA target of the CUDA-correctness issue: the measured ratio and whether it holds."""
    found: dict[str, dict[str, Any]] = {}
    for name in ("softmax", "layer_norm", "rms_norm"):
        share = bench["kernels"][name]["kernels"]["of_peak"]
        found[f"{name} share of copy bandwidth"] = {"value": share, "target": ">= 0.80", "met": share >= 0.8}
    mm = bench["kernels"]["linear_gelu"]
    ratio = mm["kernels"]["TFLOP/s"] / mm["inductor"]["TFLOP/s"]
    found["linear+gelu / inductor throughput"] = {"value": ratio, "target": ">= 0.90", "met": ratio >= 0.9}
    graph = bench["launch_bound_20_ops"]
    ratio = graph["auto (cudagraphs)"] / graph["eager"]
    found["20-op graph, cudagraphs / eager time"] = {
        "value": ratio,
        "target": "<= 0.333",
        "met": ratio <= 1 / 3,
    }
    return found


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# GPU report {report['stamp']}", ""]
    lines += [f"- {k}: {v}" for k, v in report["machine"].items()]
    lines += ["", "## Targets", "", "| target | measured | wanted | met |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {t['value']:.3f} | {t['target']} | {'yes' if t['met'] else 'no'} |"
        for name, t in report["targets"].items()
    ]
    lines += ["", "## Kernels (seconds per call, share of copy bandwidth or TFLOP/s)", ""]
    lines += ["| op | column | seconds | rate |", "|---|---|---|---|"]
    for op, columns in report["bench"]["kernels"].items():
        for column, row in columns.items():
            rate = row.get("of_peak", row.get("TFLOP/s"))
            lines.append(f"| {op} | {column} | {row['seconds']:.3e} | {rate:.3f} |")
    lines += ["", "## Launch-bound 20-op graph (seconds per call)", ""]
    lines += [f"- {k}: {v:.3e}" for k, v in report["bench"]["launch_bound_20_ops"].items()]
    if "boundaries" in report:
        lines += ["", boundaries_section(report["boundaries"])]
    passed = sum(1 for v in report["tests"].values() if v == "passed")
    lines += ["", f"## GPU tests: {passed} of {len(report['tests'])} passed", ""]
    lines += [f"- {name}: {outcome}" for name, outcome in report["tests"].items()]
    return "\n".join(lines) + "\n"


def boundaries_section(result: dict[str, Any]) -> str:
    from .boundaries import markdown as boundaries_markdown

    return "#" + boundaries_markdown(result)  # one level below the report's title


def main(argv: list[str] | None = None) -> int:
    if not torch.cuda.is_available():
        print("[gpu] no CUDA device on this machine: nothing measured, no report written")
        return 0
    from .gpu import run as run_bench

    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {"stamp": stamp, "machine": machine(), "tests": gpu_tests(list(argv or []))}
    report["bench"] = run_bench()
    report["targets"] = targets(report["bench"])
    from .boundaries import measure as measure_boundaries

    report["boundaries"] = measure_boundaries("cuda", rounds=9)
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / f"gpu-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(report, indent=2))
    base.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"[gpu] wrote {base}.json/.md")
    failed = [name for name, outcome in report["tests"].items() if outcome.startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
