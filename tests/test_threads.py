"""One compiled model called from many threads: every result right.

The ORT runner keeps one IO binding per thread; this would catch a shared
binding. The model is compiled by one call first. Eight threads making the
very first call together are not supported: torch.export (behind the ONNX
export) patches ``nn.Module.__call__`` process-wide while it traces, and a
module called meanwhile by another thread is caught in that trace. Compiles
of our own are serialised (``dispatch.stitch.COMPILE_LOCK``); module calls of
other threads cannot be."""

import threading

import torch

from tests.models import CustomOpMLP


@torch.no_grad()
def test_eight_threads_share_one_compiled_model():
    model = CustomOpMLP().eval()
    compiled = torch.compile(model, backend="auto")
    inputs = [torch.randn(4, 16) for _ in range(8)]
    expected = [model(x) for x in inputs]
    compiled(inputs[0])
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            start.wait()
            with torch.no_grad():
                for _ in range(500):
                    torch.testing.assert_close(compiled(inputs[i]), expected[i], rtol=1e-5, atol=1e-5)
        except BaseException as error:  # reported below, from the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_call_never_fails_because_another_thread_compiles_a_region(monkeypatch):
    """A region compiles lazily, on its first call, outside Dynamo; while its
    compiler FX-traces (inductor's AOTAutograd, an exporter), another thread
    calls the compiled model. On the H100 3 of 4 such threads raised
    "Detected that you are using FX to symbolically trace a dynamo-optimized
    function". The trace is made here as ``torch._inductor.compile`` makes it:
    without marking the process as compiling."""
    import torch.fx._symbolic_trace as fx_trace

    import dispatch.routes.onnx_export as onnx_export

    tracing, called = threading.Event(), threading.Event()
    export = onnx_export._export

    def export_while_another_thread_calls(*args, **kwargs):
        flag = fx_trace._is_fx_tracing_flag
        fx_trace._is_fx_tracing_flag = True  # as inside make_fx
        try:
            tracing.set()
            assert called.wait(60), "the other thread never called"
        finally:
            fx_trace._is_fx_tracing_flag = flag
        return export(*args, **kwargs)

    model = CustomOpMLP().eval()
    compiled = torch.compile(model, backend="auto", dynamic=False)
    small, large = torch.randn(4, 16), torch.randn(64, 16)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            assert tracing.wait(60), "no region was exported"
            with torch.no_grad():
                torch.testing.assert_close(compiled(small), model(small), rtol=1e-5, atol=1e-5)
        except BaseException as error:  # reported below, from the main thread
            errors.append(error)
        finally:
            called.set()

    with torch.no_grad():
        compiled(small)
        monkeypatch.setattr(onnx_export, "_export", export_while_another_thread_calls)
        thread = threading.Thread(target=caller)
        thread.start()
        torch.testing.assert_close(compiled(large), model(large), rtol=1e-5, atol=1e-5)
        thread.join()
    assert not errors, errors[0]
    assert torch._dynamo.config.error_on_nested_fx_trace  # Dynamo's option is back as it was
