"""The CPU a result was measured on: its model name and vector flags (these
machines differ: some have AVX-512, some only AVX2), for every report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatch.cache import cpu_name


def cpu() -> dict[str, Any]:
    """``cpu`` (the model name, as dispatch keys its timed decisions by) and, on
    Linux, ``vector_flags`` (AVX, AMX, FMA, SSE4)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        return {"cpu": cpu_name()}
    return {
        "cpu": cpu_name(),
        "vector_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4"))),
    }
