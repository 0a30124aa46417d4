"""Graphs whose baseline is inductor compile as plain inductor compiles them:
one AOTAutograd pass, parameters as static inputs, a departure only where the
plan records one, and a failing inductor compile falling back for that graph."""

import contextlib

import pytest
import torch
import torch._inductor.compile_fx as compile_fx_module
from torch._dynamo.utils import counters

import dispatch
from dispatch.routes.inductor import InductorRoute
from dispatch.stitch import FallbackWarning


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def gelu_tanh_gelu():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Tanh(), torch.nn.Linear(32, 4), torch.nn.GELU()
    )


@pytest.fixture
def inner_calls(monkeypatch):
    """Each call of inductor's ``compile_fx_inner``: its keyword arguments."""
    calls = []
    real = compile_fx_module.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        calls.append(kwargs)
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", spy)
    return calls


def train_step(model, x):
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out, [p.grad.clone() for p in model.parameters()]


def assert_trains_as_eager(model, reference, x):
    """One training step of ``model`` under auto: output and gradients as ``reference``'s in eager."""
    out, grads = train_step(torch.compile(model, backend="auto"), x)
    ref_out, ref_grads = train_step(reference, x)
    torch.testing.assert_close(out, ref_out)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_cpu_training_is_one_aot_pass_with_parameters_static(inner_calls):
    model, reference = mlp(), mlp()
    x = torch.randn(8, 16)
    before = counters["aot_autograd"]["total"]
    assert_trains_as_eager(model, reference, x)
    # One AOTAutograd trace for the Dynamo graph; the region path traced each region again.
    assert counters["aot_autograd"]["total"] - before == 1
    forward, backward = inner_calls
    assert backward.get("is_backward") and not forward.get("is_backward")
    # The four parameters are static inputs of the forward graph, as under plain inductor.
    assert len(forward["static_input_idxs"]) >= 4


@torch.no_grad()
def test_forced_inductor_inference_is_inductor_whole(inner_calls, monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "inductor")
    model = mlp().eval()
    x = torch.randn(8, 16)
    explanation = dispatch.explain(model, x)
    assert [(r.route, r.kind) for r in explanation.regions] == [("inductor", "inference")]
    assert len(inner_calls) == 1 and inner_calls[0]["is_inference"]
    assert len(inner_calls[0]["static_input_idxs"]) == 4
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


@torch.no_grad()
@pytest.mark.parametrize("how", ["bfloat16 model", "autocast"])
@pytest.mark.parametrize("timed", [{"inductor": 1.0, "as traced (eager)": 2.0}], indirect=True)
def test_cpu_inference_in_bfloat16_is_inductor_whole(inner_calls, how, timed):
    # Dynamo's graph decides the lead: under autocast its inputs are float32 and only
    # the values inside are bfloat16. Inductor's whole graph is timed against the
    # graph as traced (test_capture_check.py); here the fake clock has it win.
    model = mlp().eval()
    x = torch.randn(8, 16)
    if how == "bfloat16 model":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
        context = contextlib.nullcontext()
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)
    with context:
        explanation = dispatch.explain(model, x)
        assert [r.route for r in explanation.regions] == ["inductor"]
        assert timed == [{"inductor", "as traced (eager)"}]
        assert len(inner_calls) == 1 and len(inner_calls[0]["static_input_idxs"]) == 4
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


def test_a_departure_is_split_inside_the_one_aot_pass(monkeypatch):
    def no_tanh(self, node, graph):
        return "tanh: refused by this test" if "tanh" in str(node.target) else None

    monkeypatch.setattr(InductorRoute, "supports", no_tanh)
    model, reference = gelu_tanh_gelu(), gelu_tanh_gelu()
    x = torch.randn(8, 16)
    explanation = dispatch.explain(model, x)
    routes = {(r.kind, r.route) for r in explanation.regions}
    assert ("forward", "eager") in routes and ("forward", "inductor") in routes
    eager = next(r for r in explanation.regions if r.route == "eager")
    assert eager.ops == ("aten.tanh.default",)
    assert "refused by this test" in eager.rejected["inductor"]
    torch._dynamo.reset()
    before = counters["aot_autograd"]["total"]
    assert_trains_as_eager(model, reference, x)
    # One trace of the Dynamo graph, plus one per inductor region (the region route).
    inductor_regions = sum(1 for r in explanation.regions if r.route == "inductor")
    assert counters["aot_autograd"]["total"] - before == 1 + inductor_regions


def test_a_failing_inductor_compile_falls_back_for_that_graph(monkeypatch):
    def broken(gm, example_inputs, **kwargs):
        raise RuntimeError("inductor lowering crashed (test)")

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", broken)
    model, reference = mlp(), mlp()
    x = torch.randn(8, 16)
    with pytest.warns(FallbackWarning, match="inductor lowering crashed") as caught:
        assert_trains_as_eager(model, reference, x)
    assert len([w for w in caught if issubclass(w.category, FallbackWarning)]) == 2  # forward, backward
    with pytest.warns(FallbackWarning):
        explanation = dispatch.explain(model, x)
    (region,) = explanation.regions
    assert region.route == "eager"
    assert "inductor lowering crashed" in region.rejected["inductor"]


def test_a_graph_inductor_rewrote_before_failing_falls_back_intact(monkeypatch):
    """Inductor's graph passes rewrite the graph in place before lowering can fail
    (on hf Mamba, training at a second batch size: "cannot determine truth value
    of Relational"); the fallback planned that rewritten graph and raised
    ``AssertionError: embedding doesn't belong to passed in graph module``."""

    def rewrites_then_fails(gm, example_inputs, **kwargs):
        torch.fx.GraphModule(gm, gm.graph)  # as inductor's passes do: the graph gets another owner
        (tanh,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.tanh.default)
        with gm.graph.inserting_after(tanh):
            clone = gm.graph.call_function(torch.ops.aten.clone.default, (tanh,))
        tanh.replace_all_uses_with(clone, delete_user_cb=lambda user: user is not clone)
        raise RuntimeError("inductor lowering crashed after its passes (test)")

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", rewrites_then_fails)
    model, reference = mlp(), mlp()
    x = torch.randn(8, 16)
    with pytest.warns(FallbackWarning, match="crashed after its passes") as caught:
        assert_trains_as_eager(model, reference, x)
    assert len([w for w in caught if issubclass(w.category, FallbackWarning)]) == 2  # forward, backward
    with torch.no_grad(), pytest.warns(FallbackWarning):
        explanation = dispatch.explain(model, x, options={"routes": ["inductor", "eager"]})
    (region,) = explanation.regions
    assert region.route == "eager" and "clone" not in " ".join(region.ops)


def test_a_failing_inductor_compile_raises_under_strict(monkeypatch):
    def broken(gm, example_inputs, **kwargs):
        raise RuntimeError("inductor lowering crashed (test)")

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", broken)
    monkeypatch.setenv("DISPATCH_STRICT", "1")
    with pytest.raises(Exception, match="inductor lowering crashed"):
        train_step(torch.compile(mlp(), backend="auto"), torch.randn(8, 16))


@torch.no_grad()
def test_cpu_inference_keeps_the_onnx_runtime_baseline(inner_calls):
    """Where ONNX Runtime leads (CPU inference), the graph is not inductor's."""
    pytest.importorskip("onnxruntime")
    explanation = dispatch.explain(mlp().eval(), torch.randn(8, 16))
    assert {r.route for r in explanation.regions} == {"onnxrt"}
    assert inner_calls == []


def test_a_cuda_graph_that_inductor_fails_falls_back_to_eager_not_to_a_forced_capture():
    from dispatch.config import Config
    from dispatch.inductor_baseline import _without_inductor
    from dispatch.region import GraphPlan, Region

    region = Region(0, "inductor_cuda0_0", "inductor", ("aten.mm.default",), frozenset({"cuda"}), 1)
    plan = GraphPlan(
        0, "inference", frozenset({"cuda"}), False, 1, {"cuda": ("inductor", "eager", "cudagraphs")}, [region]
    )
    with pytest.warns(FallbackWarning, match="boom"):
        config = _without_inductor(plan, Config(), RuntimeError("boom"))
    assert config.routes == ("eager",)
    assert config.forced is None
    assert "boom" in config.source("routes")


def test_a_graph_inductor_captures_is_recorded_as_captured_and_why_not_otherwise():
    from torch._inductor.utils import BoxedBool

    from dispatch.inductor_baseline import _with_capture
    from dispatch.region import Region

    region = Region(
        0,
        "inductor_cuda0_0",
        "inductor",
        ("aten.mm.default",),
        frozenset({"cuda"}),
        1,
        rejected={"cudagraphs": "x"},
    )

    class Compiled:
        disabled_cudagraphs_reason = None

    captured = _with_capture(region, BoxedBool(True), Compiled(), wanted=True)
    assert (captured.route, captured.inner_route) == ("cudagraphs", "inductor")
    assert "cudagraphs" not in captured.rejected
    refused = Compiled()
    refused.disabled_cudagraphs_reason = "mutated inputs (1 instances)"
    skipped = _with_capture(region, BoxedBool(False), refused, wanted=True)
    assert skipped.route == "inductor"
    assert skipped.rejected["cudagraphs"] == "inductor: mutated inputs (1 instances)"
    assert _with_capture(region, BoxedBool(True), Compiled(), wanted=False) is region


def test_outputs_of_a_captured_graph_are_copied_out_and_inputs_handed_back():
    from dispatch.inductor_baseline import _outputs_survive
    from dispatch.routes.cudagraphs import PoolOutputs

    pool = torch.zeros(3)  # stands for the graph's memory pool, overwritten by the next replay

    def replay(args):
        (x,) = args
        args.clear()  # inductor's boxed convention
        pool.copy_(x * 2)
        return [pool, x]

    run = _outputs_survive(replay, PoolOutputs(torch.fx.symbolic_trace(lambda x: (x * 2, x))))
    x = torch.ones(3)
    out, same = run([x])
    assert out.data_ptr() != pool.data_ptr()  # a copy: the next replay cannot change it
    assert same is x  # an output that is an input is not the pool's
    run([torch.full((3,), 5.0)])
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def _region(x, w):
    return torch.relu(x @ w) + 1


@pytest.mark.parametrize("tracing_mode", ["real", "symbolic"])
def test_an_inductor_region_is_served_from_inductors_cache_the_second_time(tracing_mode):
    """A region compiled on the inductor route is found in inductor's FX graph
    cache by the next process (here: the next compile of the same region), and a
    static region stays specialised to its sizes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(5, 4), torch.randn(4, 4)
    for _ in range(2):
        counters.clear()
        compiled = InductorRoute().compile(make_fx(_region, tracing_mode=tracing_mode)(x, w), [x, w])
        torch.testing.assert_close(compiled(x, w), _region(x, w))
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    assert counters["inductor"]["fxgraph_cache_hit"] == 1
    other = torch.randn(7, 4)
    if tracing_mode == "symbolic":
        torch.testing.assert_close(compiled(other, w), _region(other, w))
    else:
        with pytest.raises(AssertionError, match="expected size 7==5"):
            compiled(other, w)
