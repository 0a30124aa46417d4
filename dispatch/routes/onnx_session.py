"""An ONNX Runtime session bound to torch tensors: IO binding in, DLPack out.

``bound_session`` opens a region's session with the options every session here
takes (the thread count ``onnx_threads.py`` decided, spinning stopped after each
run, no memory pattern), and ``BoundRunner`` runs it: ORT reads the inputs
where torch keeps them and hands its outputs back without a copy or a numpy
conversion, on CPU and on CUDA alike.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from .base import CompiledFn
from .onnx_model import OnnxModel
from .onnx_threads import ONE, POOL_TRIAL, TRIAL, ThreadCountTrial, pool_threads


def threaded_session(
    model: OnnxModel,
    device: torch.device,
    threads: str,
    positions: list[int],
    bools: list[int],
    output_count: int,
) -> CompiledFn:
    """``bound_session`` on the thread count ``threads`` names (``onnx_threads.py``):
    one thread, the pool, or a trial of both on the first calls (CPU only). Where
    torch runs on one thread, so does every session: the pool is that size."""
    if pool_threads() == 1:
        threads = ONE
    if threads in (TRIAL, POOL_TRIAL) and device.type == "cpu":
        return ThreadCountTrial(
            lambda one: bound_session(model, device, one, positions, bools, output_count),
            pool_first=threads == POOL_TRIAL,
        )
    return bound_session(model, device, threads == ONE, positions, bools, output_count)


def bound_session(
    model: OnnxModel,
    device: torch.device,
    one_thread: bool,
    positions: list[int],
    bools: list[int],
    output_count: int,
) -> BoundRunner:
    """An ORT session of ``model`` on ``device``, run through IO binding: the region's
    inputs at ``positions`` feed the model's inputs in order; the region has
    ``output_count`` outputs, booleans at ``bools``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Fatal only: a run that fails (an index out of range) raises, and the region
    # reports it as torch does; ORT's own line on stderr said it twice.
    options.log_severity_level = 4
    # The memory pattern pre-plans one block per run for all intermediates, on
    # top of the arena: +10 MB resident on the transformer layer after ten calls,
    # for no speed measurable on any benchmark model (benchmarks/README.md).
    options.enable_mem_pattern = False
    options.intra_op_num_threads = 1 if one_thread else pool_threads()
    # ORT's workers spin while a run lasts and stop as it returns: left spinning
    # after it, they took the cores from whatever ran next (eager regions,
    # Python between Dynamo graphs, the caller's next line); a model with graph
    # breaks ran 8.0 ms against 0.34 ms (benchmarks/README.md).
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if device.type == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(model.graph, model.session_options(options), providers=providers)
    feed_names = [i.name for i in session.get_inputs()]
    # The model's inputs are the region's tensor inputs that were not baked in,
    # in order (the exporter may rename them).
    if len(feed_names) != len(positions):
        raise RuntimeError(f"onnxrt: exported model has {len(feed_names)} inputs, expected {len(positions)}")
    outputs = [o.name for o in session.get_outputs()]
    if len(outputs) != output_count:
        raise RuntimeError(
            f"onnxrt: exported model has {len(outputs)} outputs, the region has {output_count}"
        )
    return BoundRunner(session, feed_names, positions, outputs, device, bools)


class BoundRunner:
    """Runs a session through IO binding.

    ORT reads the input tensors' memory where it lies (inputs are re-bound only
    when their address or shape changes, so weights never are) and allocates
    each call's outputs from its own arena; DLPack hands those buffers to torch
    without a copy. Torch-allocated outputs were tried first: a fresh 12 MB
    output then page-faults on every call (0.6 ms of Conv-BN-ReLU's 3 ms),
    while ORT's arena reuses warm memory. Each thread keeps its own binding,
    since an ORT binding is not thread-safe.

    The pybind objects are called directly, not through onnxruntime's Python
    wrappers: those build a device object per bind and a wrapper per output,
    and cost 10 to 30 µs a call on a tiny region (measured, benchmarks/README.md).
    """

    def __init__(
        self,
        session: Any,
        names: list[str],
        inputs: list[int],
        outputs: list[str],
        device: torch.device,
        bools: list[int],
    ) -> None:
        import onnxruntime as ort

        self.session = session
        self.bools = bools
        self._run = session._sess.run_with_iobinding
        self.feeds = list(zip(names, inputs))
        self.outputs = outputs
        # The device exactly as onnxruntime's own wrapper builds it: another
        # spelling of the same device made ORT allocate outside its arena (3x slower).
        self.device = ort.OrtDevice.make(device.type, device.index or 0)._get_c_device()
        self.run_options = ort.RunOptions()
        self.local = threading.local()

    def _binding(self) -> tuple[Any, list[Any]]:
        local = self.local
        try:
            return local.binding, local.bound
        except AttributeError:
            from onnxruntime.capi import _pybind_state

            local.binding = _pybind_state.SessionIOBinding(self.session._sess)
            local.bound = [None] * len(self.feeds)
            return local.binding, local.bound

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        binding, bound = self._binding()
        alive = []  # contiguous copies must outlive the run
        for k, (name, i) in enumerate(self.feeds):
            t = args[i]
            if not t.is_contiguous():
                t = t.contiguous()
                alive.append(t)
            key = (t.data_ptr(), t.shape, t.dtype)
            if bound[k] != key:
                binding.bind_input(name, self.device, np_dtype(t.dtype), list(t.shape), t.data_ptr())
                bound[k] = key
        # Outputs kept bound from the last run would be written again, under the
        # caller's feet: a fresh binding makes ORT take new buffers from its arena
        # (the caller's tensors keep theirs alive), also of a new shape for dynamic axes.
        binding.clear_binding_outputs()
        for name in self.outputs:
            binding.bind_output(name, self.device)
        self._run(binding, self.run_options)
        tensors = binding.get_outputs().to_dlpacks(torch._C._from_dlpack)
        for k in self.bools:
            if tensors[k].dtype != torch.bool:
                tensors[k] = tensors[k].view(torch.bool)  # DLPack may carry ORT's bool as uint8
        return tuple(tensors)


@functools.cache
def np_dtype(dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype
