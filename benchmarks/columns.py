"""How each benchmark column turns a model into a callable.

eager: the module itself. inductor: torch.compile(backend="inductor").
onnxrt_direct: the whole model exported with torch.onnx.export and run by an
ONNX Runtime session, fed and read through numpy as a user would. openvino:
torch.compile(backend="openvino") at fp32 precision where OpenVINO is installed
(reported as failed where it is not); left to its default, OpenVINO runs fp32
models in bf16 on CPUs with AVX512_BF16 or AMX (max error 2e-3 against fp32
eager's 2e-7 on mlp_1024), a different answer from every other column's. auto: ours with its rules; auto_tuned: ours with
measured routing (options={"autotune": True}). lowered: ``dispatch.lower``,
saved to a file and loaded back (``dispatch.load``): the program runs without
Dynamo; its ``load_s`` is the load plus the first call.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

PEERS = ("eager", "inductor", "onnxrt_direct", "openvino")
OURS = ("auto", "auto_tuned", "lowered")
COLUMNS = PEERS + OURS


def make(column: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """A zero-argument callable running ``model`` on ``inputs`` through ``column``."""
    if column == "eager":
        return lambda: model(*inputs)
    if column == "inductor":
        compiled = torch.compile(model, backend="inductor")
        return lambda: compiled(*inputs)
    if column == "openvino":
        import openvino.torch  # noqa: F401  (registers the backend)

        compiled = torch.compile(
            model, backend="openvino", options={"config": {"INFERENCE_PRECISION_HINT": "f32"}}
        )
        return lambda: compiled(*inputs)
    if column == "lowered":
        return _lowered(model, inputs)
    if column in OURS:
        compiled = torch.compile(model, backend="auto", options={"autotune": column == "auto_tuned"})
        return lambda: compiled(*inputs)
    if column == "onnxrt_direct":
        return _onnxrt_direct(model, inputs)
    raise ValueError(f"unknown column {column!r}; columns: {COLUMNS}")


def _onnxrt_direct(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import onnxruntime as ort

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False, report=False)
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def run() -> Any:
        feeds = {n: t.numpy() for n, t in zip(names, inputs)}
        outs = [torch.from_numpy(o) for o in session.run(None, feeds)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def _lowered(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import os
    import tempfile
    import time

    import dispatch

    with tempfile.TemporaryDirectory(prefix="bench-lowered-") as folder:
        path = os.path.join(folder, "model.dispatch")
        dispatch.lower(model, inputs).save(path)
        start = time.perf_counter()
        program = dispatch.load(path)
        program(*inputs)
        load_s = time.perf_counter() - start

    def run() -> Any:
        return program(*inputs)

    run.load_s = load_s  # type: ignore[attr-defined]
    return run
