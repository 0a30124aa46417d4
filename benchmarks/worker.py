"""One benchmark column for one model, in a process of its own.

    python -m benchmarks.worker MODEL COLUMN [CACHE_DIR]

It starts with fresh Inductor and dispatch caches (or those under CACHE_DIR:
a second worker on the same CACHE_DIR measures a warm start), builds the column (the cold
compile time is the first call, compile included), judges the output against
fp32 eager by the dashboard's rule (``benchmarks/accuracy.py``; a column that
fails it is reported failed, never timed, and never the best peer), prints one
``BENCH_READY {json}`` line, then serves timing requests on stdin: a line ``N``
runs N calls and answers ``BENCH_TIME seconds``, the first after
``WARM_UP_CALLS`` untimed calls (``warm_up.py``), as the zoo's workers do;
``quit`` ends it with ``BENCH_RSS {json}``: peak memory, the warm-up's length,
the routes as they run then, and the output judged again on new input values
(auto's trials swap in other programs after the first call). A column lives alone in its
process so that no other runtime's thread pool (torch's OpenMP workers, another
ORT session) spins beside it.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import sys
import tempfile
import time
import traceback

import torch

from dispatch.errors import error_line
from dispatch.record import recorder

from . import columns
from .accuracy import accurate, give_new_values, in_float64
from .models import build
from .process import collect_set_up_garbage
from .warm_up import serve_timing_requests


def _warm_up_process() -> None:
    # One-off costs of any torch.compile in a fresh process (importing Dynamo,
    # its first trace, the modules it imports on its first nn.Module call) are
    # not the backend's compile time.
    torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)), backend="eager")(torch.ones(1, 2))
    torch._dynamo.reset()


def _max_error(out, expected) -> float:
    if isinstance(expected, torch.Tensor):
        out, expected = (out,), (expected,)
    return max(float((o.float() - e.float()).abs().max()) for o, e in zip(out, expected))


def accuracy_error(out, expected, fp64) -> str | None:
    """Why ``out`` fails the dashboard's rule against fp32 eager's ``expected``
    (``fp64`` the truth), or None where it passes."""
    if accurate(expected, fp64, out, torch.float32):
        return None
    return (
        f"accuracy: max error {_max_error(out, fp64):.1e} against fp64, fp32 eager's "
        f"{_max_error(expected, fp64):.1e}: beyond the dashboard's tolerance"
    )


def _short(error: BaseException) -> str:
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(error, file=sys.stderr)
    return error_line(error, 300)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _references(model, inputs):
    """What a column's output is judged against: ``model`` in float64, and in float32."""
    return copy.deepcopy(model).double()(*in_float64(inputs)), model(*inputs)


def main(model_name: str, column: str, cache_dir: str | None = None) -> None:
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="bench-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    os.environ["DISPATCH_CACHE_DIR"] = os.path.join(cache_dir, "dispatch")
    model, inputs = build(model_name)
    _warm_up_process()
    with torch.no_grad():
        fp64, expected = _references(model, inputs)
        collect_set_up_garbage()
        start = time.perf_counter()
        try:
            with recorder.recording() as plans:
                fn = columns.make(column, model, inputs)
                out = fn()
        except Exception as error:  # a failing peer is reported, not dropped
            print("BENCH_READY " + json.dumps({"ok": False, "error": _short(error)}), flush=True)
            return
        compile_s = time.perf_counter() - start
        error = accuracy_error(out, expected, fp64)
        if error:
            print("BENCH_READY " + json.dumps({"ok": False, "error": error}), flush=True)
            return
        one = time.perf_counter()
        fn()
        one = time.perf_counter() - one
        ready = {
            "ok": True,
            "compile_s": compile_s,
            "max_error": _max_error(out, expected),
            "first_call_s": one,
            "load_s": getattr(fn, "load_s", None),  # lowered: load plus first call
            # what auto ran, region by region (after the first call: fallbacks and measuring are done)
            "routes": [r.route for p in plans for r in p.regions],
        }
        print("BENCH_READY " + json.dumps(ready), flush=True)
        warm_up = serve_timing_requests(fn)
        # The routes as they run now: a trial may have moved regions since the first call.
        final = {
            "peak_rss_mb": _peak_rss_mb(),
            **warm_up,
            "routes": list(dict.fromkeys(r.route for p in plans for r in p.regions)),
        }
        if warm_up:  # judged again, on new input values: auto's trials swap programs after the first call
            give_new_values(inputs)
            try:
                fp64, expected = _references(model, inputs)
                final["error_after_timing"] = accuracy_error(fn(), expected, fp64)
            except Exception as error:
                final["error_after_timing"] = _short(error)
        print("BENCH_RSS " + json.dumps(final), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
