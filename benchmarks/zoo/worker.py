"""One zoo cell (model x column x mode) in a process of its own.

    python -m benchmarks.zoo.worker MODEL COLUMN MODE DEVICE DTYPE CACHE_DIR

MODE is ``infer`` or ``train``. It builds the cell on fresh caches (or warm
ones: a second worker on the same CACHE_DIR measures a warm start), times the
first call (the cold compile), judges accuracy the way PyTorch's benchmark
dashboard does (``torch._dynamo.utils.same`` against eager in the cell's dtype on
its device, with an fp64 run as the truth: in float32 that is fp32 eager; in
bfloat16 a result passes when it is about as close to fp64 as bfloat16 eager
is), prints ``ZOO_READY {json}``, then answers timing requests on stdin as
``benchmarks.worker`` does, after ``WARM_UP_CALLS`` untimed calls (``warm_up.warmed_up``);
on ``quit`` it reports the warm-up's length, the routes as they ran last, and
its accuracy judged again (the program auto's trials left running).
Once the cell is built, before it compiles, it prints ``WORKER_LOADED`` and
waits for ``go`` (``Worker.release``).
"""

from __future__ import annotations

import copy
import io
import json
import os
import resource
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stdout

import torch

from dispatch.errors import error_line
from dispatch.record import recorder
from dispatch.region import region_table

from ..accuracy import (
    accurate,
    copies,
    floating_leaves,
    fp64_inference,
    fp64_truth,
    give_new_values,
    in_float64,
    inference_accurate_now,
)
from ..process import LOADED, collect_set_up_garbage
from ..warm_up import serve_timing_requests
from . import columns
from .wider import EVERY_MODEL


def moved(model, inputs, device, dtype):
    """``model`` and its floating inputs in ``dtype`` on ``device`` (other inputs keep theirs)."""
    model = model.to(device=device, dtype=dtype)
    return model, tuple(
        t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for t in inputs
    )


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Training mode with every dropout at 0, so that one step is deterministic
    and comparable (attention layers keep their rate as a float attribute)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("dropout", "attention_dropout", "dropout_prob"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def _gradients(model, inputs, column):
    return _gradients_of(model, columns.compiled(column, model), inputs)


def _gradients_of(model, forward, inputs):
    """``model``'s gradients of the zoo's loss, with ``forward`` (``model`` as a column runs it)."""
    model.zero_grad(set_to_none=True)
    loss = sum(t.float().mean() for t in floating_leaves(forward(*inputs)))
    loss.backward()
    return [p.grad.cpu() for p in model.parameters() if p.grad is not None]


def _fp64_gradients(model, inputs):
    """The truth for a training cell: a copy of ``model``'s gradients in float64, or None (``fp64_truth``)."""
    return fp64_truth(lambda: _gradients(copy.deepcopy(model).double(), in_float64(inputs), "eager"))


def _training_accurate_now(step: columns.TrainingStep, model, inputs, dtype) -> bool:
    """``inference_accurate_now`` for a training cell: the gradients of the column's
    compiled forward, once its decisions are made, on new input values, against
    eager's on the weights the steps so far have left."""
    give_new_values(inputs)
    fp64 = _fp64_gradients(model, inputs)
    reference = _gradients(copy.deepcopy(model), inputs, "eager")
    return accurate(reference, fp64, _gradients_of(model, step.forward, inputs), dtype)


def _accurate_after_warm_up(fn, model, inputs, mode: str, dtype) -> dict:
    """The cell's accuracy judged again once it has been warmed up and timed; an
    error in that call is the cell's error."""
    try:
        with redirect_stdout(io.StringIO()):
            if mode == "train":
                ok = _training_accurate_now(fn, model, inputs, dtype)
            else:
                ok = inference_accurate_now(fn, model, inputs, dtype)
    except Exception as error:
        traceback.print_exc()
        return {"accurate_after_warm_up": False, "error_after_warm_up": error_line(error, 300)}
    return {"accurate_after_warm_up": ok}


def _peak_mb(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _loaded() -> None:
    """Says the cell is built and waits for ``go``: the runner lets cells compile in turn.
    Then collects the set-up's garbage, so that the compile timed next does not walk it."""
    sys.__stdout__.write(LOADED + "\n")
    sys.__stdout__.flush()
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)
    collect_set_up_garbage()


def _regions(plans) -> list:
    """The recorded plans' regions, as they run now (a trial may move them)."""
    return [r for p in plans for r in p.regions]


def _routes(plans) -> list[str]:
    """The routes the recorded plans' regions run on now."""
    return sorted({r.route for r in _regions(plans)})


def main(name: str, column: str, mode: str, device: str, dtype_name: str, cache_dir: str | None) -> None:
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="zoo-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    os.environ["DISPATCH_CACHE_DIR"] = os.path.join(cache_dir, "dispatch")
    dtype = getattr(torch, dtype_name)
    torch.compile(torch.nn.Linear(2, 2), backend="eager")(torch.ones(1, 2))  # Dynamo's one-off start
    torch._dynamo.reset()
    model, inputs = EVERY_MODEL[name].build()
    model.train(mode == "train")
    if mode == "train":
        _without_dropout(model)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    report: dict = {"ok": False}
    try:
        with redirect_stdout(io.StringIO()):  # models that print
            if mode == "train":
                ref64 = _fp64_gradients(model, inputs)
                model, inputs = moved(model, inputs, device, dtype)
                ref_grads = _gradients(copy.deepcopy(model), inputs, "eager")
                _loaded()
                start = time.perf_counter()
                with recorder.recording() as plans:
                    grads = _gradients(model, inputs, column)
                    sync()
                report["compile_s"] = time.perf_counter() - start
                report["accurate"] = accurate(ref_grads, ref64, grads, dtype)
                fn = columns.TrainingStep(column, model, inputs)
            else:
                with torch.no_grad():
                    model.eval()
                    fp64 = fp64_inference(model, inputs)
                    model, inputs = moved(model, inputs, device, dtype)
                    reference = copy.deepcopy(model)(*copies(inputs))
                    _loaded()
                    start = time.perf_counter()
                    with recorder.recording() as plans:
                        fn = columns.inference(column, model, inputs)
                        out = fn()
                        sync()
                    report["compile_s"] = time.perf_counter() - start
                    report["accurate"] = accurate(reference, fp64, out, dtype)
                    del out  # a held output keeps a CUDA graph tree from replaying its recording
            report["routes"] = _routes(plans)
            if column == "auto":  # for the cell's log (run.py --logs): what ran where, and why
                print(region_table(_regions(plans)), file=sys.stderr)
            report["ok"] = report["accurate"]
            if not report["accurate"]:
                report["error"] = (
                    f"accuracy: differs from {dtype_name} eager beyond the dashboard's tolerance"
                )
            context = torch.no_grad() if mode == "infer" else torch.enable_grad()
            with context:
                start = time.perf_counter()
                fn()
                sync()
                report["first_call_s"] = time.perf_counter() - start
    except Exception as error:  # a failing cell is reported, not dropped
        traceback.print_exc()  # to the cell's log, where run.py keeps one
        report["error"] = error_line(error, 300)
    print("ZOO_READY " + json.dumps(report), flush=True)
    if not report.get("ok"):
        return
    context = torch.no_grad() if mode == "infer" else torch.enable_grad()
    with context, redirect_stdout(sys.stderr):  # the model's prints stay off the answers
        warm_up = serve_timing_requests(fn, sync, sys.__stdout__)
    if column == "auto" and warm_up:  # the cell's log: where the trials left each region, and why
        print(f"After {warm_up['warm_up_calls']} calls of warm-up and the timed calls:", file=sys.stderr)
        print(region_table(_regions(plans)), file=sys.stderr)
    # The routes as they run now: a trial may have moved regions since the first call.
    final = {"peak_rss_mb": _peak_mb(device), **warm_up, "routes": _routes(plans)}
    if warm_up:  # after the peak is read: the check holds copies of the model
        with context:
            final.update(_accurate_after_warm_up(fn, model, inputs, mode, dtype))
    sys.__stdout__.write("BENCH_RSS " + json.dumps(final) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    main(*sys.argv[1:7])
