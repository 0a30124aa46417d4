"""The CUDA part of `nox -s bench`: kernels/ against torch eager and inductor
(GB/s and the fraction of the device's measured copy bandwidth; TFLOP/s for
the matmul), and a 20-op launch-bound graph with and without cudagraphs.
On a machine without CUDA it says so and returns nothing."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _time_cuda(fn: Callable[[], object], repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return sorted(samples)[len(samples) // 2]


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy: the achievable peak we compare with."""
    a = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    seconds = _time_cuda(lambda: b.copy_(a))
    return 2 * a.numel() / seconds


def run() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine: kernel and cudagraphs benchmarks need one"}
    import dispatch.kernels.layer_norm as ln
    import dispatch.kernels.matmul as mm
    import dispatch.kernels.rms_norm as rms
    import dispatch.kernels.softmax as sm

    peak = copy_bandwidth()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    w = torch.randn(8192, device="cuda", dtype=torch.float16)
    moved = 2 * x.numel() * x.element_size()
    cases = {
        "softmax": (lambda: sm.softmax(x), lambda t: torch.softmax(t, -1)),
        "layer_norm": (
            lambda: ln.layer_norm(x, (8192,), w, w),
            lambda t: torch.nn.functional.layer_norm(t, (8192,), w, w),
        ),
        "rms_norm": (
            lambda: rms.rms_norm(x, w, 1e-6),
            lambda t: torch.nn.functional.rms_norm(t, (8192,), w, 1e-6),
        ),
    }
    rows = {}
    for name, (ours, torch_fn) in cases.items():
        inductor = torch.compile(torch_fn, backend="inductor")
        times = {
            "kernels": _time_cuda(ours),
            "eager": _time_cuda(lambda f=torch_fn: f(x)),
            "inductor": _time_cuda(lambda f=inductor: f(x)),
        }
        rows[name] = {
            k: {"seconds": v, "GB/s": moved / v / 1e9, "of_peak": moved / v / peak} for k, v in times.items()
        }
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    bias = torch.randn(4096, device="cuda", dtype=torch.float16)
    flops = 2 * 4096**3
    mm_ref = torch.compile(lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b)), backend="inductor")
    mm_times = {
        "kernels": _time_cuda(lambda: mm.linear_act(a, b, bias, "gelu")),
        "eager": _time_cuda(lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b))),
        "inductor": _time_cuda(mm_ref),
    }
    rows["linear_gelu"] = {k: {"seconds": v, "TFLOP/s": flops / v / 1e12} for k, v in mm_times.items()}

    def launch_bound(t):
        for i in range(20):
            t = t * 1.01 + i if i % 2 else t.sin()
        return t

    small = torch.randn(64, device="cuda")
    with torch.no_grad():
        auto = torch.compile(launch_bound, backend="auto")
        torch._dynamo.reset()
        no_capture = torch.compile(launch_bound, backend="auto", options={"routes": ["inductor", "eager"]})
        graph_times = {
            "eager": _time_cuda(lambda: launch_bound(small)),
            "auto (cudagraphs)": _time_cuda(lambda: auto(small)),
            "auto without cudagraphs": _time_cuda(lambda: no_capture(small)),
        }
    return {
        "device": torch.cuda.get_device_name(),
        "copy_GB/s": peak / 1e9,
        "kernels": rows,
        "launch_bound_20_ops": graph_times,
    }
