"""The cudagraphs route without a GPU: ``wrap()`` against a stand-in for CUDA
graph trees that enforces what torch's trees enforce (the boxed calling
convention, one tree per thread, outputs in a pool that the next replay
overwrites), and the plan-time refusals."""

from __future__ import annotations

import threading

import pytest
import torch

import dispatch
from dispatch.routes import registry
from tests.test_cuda_plan import Launchy, cuda_plan


class StandInTrees:
    """``cudagraphify_impl`` as torch's trees behave: the model gets its inputs as
    one list, and must have emptied it when it returns (torch asserts
    ``len(inputs) == 0`` after warm-up and capture); every replay writes the
    outputs into the same pool tensors, while an output that is an input is
    handed back as that input; each thread records its own tree."""

    def __init__(self) -> None:
        self.captures: list[int] = []

    def __call__(self, model, inputs, static_input_idxs, **kwargs):
        assert kwargs["is_inference"] and not kwargs["is_backward"]
        self.captures.append(threading.get_ident())
        pool: list[torch.Tensor] = []

        def replay(new_inputs: list) -> list:
            assert isinstance(new_inputs, list)
            given = {t.untyped_storage().data_ptr() for t in new_inputs}
            out = model(new_inputs)
            assert len(new_inputs) == 0, "the boxed function must clear its inputs"
            if not pool:
                pool.extend(o.clone() for o in out)
            for kept, fresh in zip(pool, out):
                kept.copy_(fresh)
            return [o if o.untyped_storage().data_ptr() in given else p for o, p in zip(out, pool)]

        return replay


@pytest.fixture
def trees(monkeypatch):
    import torch._inductor.cudagraph_trees as cudagraph_trees

    stand_in = StandInTrees()
    monkeypatch.setattr(cudagraph_trees, "cudagraphify_impl", stand_in)
    return stand_in


def _region():
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() * 2,))
    return gm, gm.forward


def test_wrap_follows_the_boxed_convention_and_outputs_survive(trees):
    gm, inner = _region()
    run = registry.get("cudagraphs").wrap(inner, gm, [torch.randn(5)])
    x, y = torch.randn(5), torch.randn(5)
    (first,) = run(x)
    (second,) = run(y)
    torch.testing.assert_close(first, x.sin() * 2)  # not overwritten by the second call
    torch.testing.assert_close(second, y.sin() * 2)


def test_reduce_overhead_contract_hands_out_the_pool(trees):
    gm, inner = _region()
    run = registry.get("cudagraphs").wrap(inner, gm, [torch.randn(5)], outputs_survive=False)
    x, y = torch.randn(5), torch.randn(5)
    (first,) = run(x)
    run(y)
    torch.testing.assert_close(first, y.sin() * 2)  # valid until the next call, as documented


def test_an_output_that_is_an_input_is_not_copied(trees):
    gm = torch.fx.symbolic_trace(lambda x: (x, x + 1))
    run = registry.get("cudagraphs").wrap(gm.forward, gm, [torch.randn(3)])
    x = torch.randn(3)
    same, _ = run(x)
    assert same.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_each_thread_captures_its_own_graph(trees):
    gm, inner = _region()
    run = registry.get("cudagraphs").wrap(inner, gm, [torch.randn(4)])
    results: dict[int, torch.Tensor] = {}
    together = threading.Barrier(3)  # all alive at once: thread idents are reused after a thread ends

    def call(i: int) -> None:
        x = torch.full((4,), float(i))
        together.wait()
        for _ in range(3):
            (results[i],) = run(x)
        together.wait()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(trees.captures)) == 3 and len(trees.captures) == 3
    for i, out in results.items():
        torch.testing.assert_close(out, torch.full((4,), float(i)).sin() * 2)


def test_reduce_overhead_option_and_variable():
    from dispatch.config import Config

    assert Config.resolve({}, env={}).reduce_overhead is False
    assert Config.resolve({"reduce_overhead": True}, env={}).reduce_overhead is True
    assert Config.resolve({}, env={"DISPATCH_REDUCE_OVERHEAD": "1"}).reduce_overhead is True
    with pytest.raises(dispatch.ConfigError, match="DISPATCH_REDUCE_OVERHEAD"):
        Config.resolve({}, env={"DISPATCH_REDUCE_OVERHEAD": "sometimes"})
    with pytest.raises(dispatch.ConfigError, match="reduce_overhead"):
        Config.resolve({"reduce_overhead": "yes"}, env={})


def test_onnxrt_regions_are_never_captured(monkeypatch):
    import dispatch.routes.onnxrt as onnxrt

    monkeypatch.setattr(onnxrt, "_providers", lambda: ("CUDAExecutionProvider", "CPUExecutionProvider"))
    plan = cuda_plan(Launchy(), (8, 16), routes=["onnxrt", "eager", "cudagraphs"])
    onnx_regions = [r for r in plan.regions if r.route == "onnxrt"]
    assert onnx_regions, plan
    for region in onnx_regions:
        assert "its own stream" in region.rejected["cudagraphs"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cudagraphs_is_unavailable_without_cuda_but_still_planned_on_cuda_tensors():
    status = dispatch.available_routes()["cudagraphs"]
    assert status["available"] is False and "no CUDA device" in status["reason"]
    assert [r.route for r in cuda_plan(Launchy(), (8, 16)).regions] == ["cudagraphs"]


def test_timing_waits_for_the_cuda_device(monkeypatch):
    """A CUDA call returns once its kernels are queued: timing must synchronize."""
    import time

    from torch._subclasses.fake_tensor import FakeTensorMode

    from dispatch import autotune

    with FakeTensorMode():
        x = torch.empty(4, device="cuda")
    waits = []

    def synchronize(device=None):  # the queued work finishing
        waits.append(device)
        time.sleep(2e-3)

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(autotune, "PAUSE_S", 0.0)
    monkeypatch.setattr(autotune, "BATCHES", 2)
    seconds = autotune.median_call_s({"queued": lambda x: None}, [x])
    assert waits and all(d.type == "cuda" for d in waits)
    assert seconds["queued"] > 1e-4  # the device's time is counted, not only the launch


def _traced_with_fake_values(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _views_and_work(x, w):
    return x.view(-1), x @ w, (x @ w).relu(), w


def test_which_outputs_alias_inputs_is_read_from_the_graphs_fake_values():
    from dispatch.routes.cudagraphs import outputs_aliasing_inputs

    gm = _traced_with_fake_values(_views_and_work, torch.randn(4, 4), torch.randn(4, 4))
    assert outputs_aliasing_inputs(gm) == {0, 3}  # the view of x and w itself
    assert outputs_aliasing_inputs(torch.fx.symbolic_trace(_views_and_work)) is None  # no fake values


def test_pool_outputs_are_copied_without_reading_every_inputs_storage(monkeypatch):
    """On an H200 the per-call scan of every input's storage (parameters are inputs)
    cost 55-70 µs of a 200 µs BERT replay; aliasing is the graph's, read once."""
    from dispatch.routes.cudagraphs import PoolOutputs

    gm = _traced_with_fake_values(_views_and_work, torch.randn(4, 4), torch.randn(4, 4))
    pool_outputs = PoolOutputs(gm)
    pool = [torch.zeros(4, 4), torch.zeros(4, 4)]

    def replay(args):
        x, w = args
        args.clear()  # the trees' boxed convention
        pool[0].copy_(x @ w)
        pool[1].copy_((x @ w).relu())
        return [x.view(-1), pool[0], pool[1], w]

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    reads = []
    original = torch.Tensor.untyped_storage
    monkeypatch.setattr(torch.Tensor, "untyped_storage", lambda t: reads.append(t) or original(t))
    view, product, relu, same_w = pool_outputs.survive(replay, [x, w])
    monkeypatch.undo()
    assert reads == []
    assert view.data_ptr() == x.data_ptr() and same_w is w  # inputs' storage, handed back
    assert product.data_ptr() != pool[0].data_ptr() and relu.data_ptr() != pool[1].data_ptr()
    replay([torch.ones(4, 4), torch.ones(4, 4)])  # the next replay overwrites the pool
    torch.testing.assert_close(product, x @ w)
    torch.testing.assert_close(relu, (x @ w).relu())


def test_several_outputs_are_copied_with_their_strides_in_one_call():
    """A graph's outputs (any dtype and layout) are copied by one op, not an
    allocation per output from Python: a replay is bound by host time."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dispatch.routes.cudagraphs import copied

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    tensors = [
        torch.randn(3, 5),
        torch.randn(5, 3).t(),
        torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last),
        torch.arange(6, dtype=torch.int32),
        torch.tensor([True, False]),
        torch.randn(4, 6)[:, 1:],  # not dense: copied contiguous, as clone does
    ]
    with Ops() as ops:
        copies = copied(tensors)
    assert ops.seen == ["aten._foreach_clone"]
    for tensor, copy in zip(tensors, copies):
        assert copy.dtype == tensor.dtype and torch.equal(copy, tensor)
        assert copy.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    assert [c.stride() for c in copies[:4]] == [t.stride() for t in tensors[:4]]
    assert copies[5].is_contiguous()
