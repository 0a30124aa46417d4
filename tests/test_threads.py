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
