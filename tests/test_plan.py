"""Routing decisions through dispatch.plan, on real and fake (cuda, mps) inputs."""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dispatch
from dispatch.region import GraphPlan
from dispatch.stitch import FallbackWarning
from tests.conftest import fake_inputs, on_fake_device
from tests.models import MLP, CustomOpMLP, SpectralFilter, matmul_outside_onnx, scaled_tanh


def fake_plan(model, device, *shapes, dtype=torch.float32, **options):
    mode = FakeTensorMode()
    model = on_fake_device(model, device, mode)
    inputs = fake_inputs(mode, device, *shapes, dtype=dtype)
    return dispatch.plan(torch.fx.symbolic_trace(model), inputs, **options)


def test_cpu_inference_goes_to_onnxrt():
    plan = fake_plan(MLP(), "cpu", (4, 16))
    assert [r.route for r in plan.regions] == ["onnxrt"]
    region = plan.regions[0]
    assert region.devices == {"cpu"}
    assert "aten.addmm.default" in region.ops
    assert region.kind == "inference"
    assert "not chosen by rule" in region.rejected["inductor"]


def test_a_route_that_cannot_run_the_device_is_left_out_for_that_reason_not_the_rules():
    # The CPU rule's reason explains why inductor is not in the order; cudagraphs
    # runs no CPU graph at all, and explain said the rule's reason for it too.
    from dispatch.region import region_table

    plan = fake_plan(MLP(), "cpu", (4, 16))
    rejected = plan.regions[0].rejected
    assert (
        rejected["cudagraphs"]
        == "not chosen by rule: device cpu is not served by cudagraphs (it serves cuda)"
    )
    assert rejected["inductor"].startswith("not chosen by rule: CPU inference: ONNX Runtime runs what it can")
    lines = region_table(plan.regions).splitlines()
    assert "  cudagraphs: device cpu is not served by cudagraphs (it serves cuda)" in lines
    assert any(line.startswith("  inductor") and "CPU inference" in line for line in lines)
    assert not any(line.startswith("  cudagraphs") and "CPU inference" in line for line in lines)


def test_cpu_inference_in_bfloat16_goes_to_inductor():
    # ONNX Runtime runs no bfloat16 on CPU: under the fp32 rule every op fell to eager,
    # 1.2-1.9x slower than inductor on the zoo's models (benchmarks/README.md).
    plan = fake_plan(MLP().to(torch.bfloat16), "cpu", (4, 16), dtype=torch.bfloat16)
    assert [r.route for r in plan.regions] == ["inductor"]
    assert "CPU inference in bfloat16" in plan.regions[0].rejected["onnxrt"]
    assert plan.graphs[0].route_order["cpu"] == ("inductor", "eager")


def test_cpu_inference_in_float16_stays_on_onnxrt():
    plan = fake_plan(MLP().to(torch.float16), "cpu", (4, 16), dtype=torch.float16)
    assert [r.route for r in plan.regions] == ["onnxrt"]


def test_mps_goes_to_eager_never_inductor():
    plan = fake_plan(MLP(), "mps", (4, 16))
    assert {r.route for r in plan.regions} == {"eager"}
    assert all(r.devices == {"mps"} for r in plan.regions)
    assert "inductor" in plan.regions[0].rejected


def test_forcing_inductor_on_mps_strict_raises_unsupported_device():
    with pytest.raises(dispatch.UnsupportedDeviceError) as info:
        fake_plan(MLP(), "mps", (4, 16), routes=["inductor"], strict=True)
    message = str(info.value)
    assert "mps" in message and "inductor" in message and "eager" in message
    assert isinstance(info.value, RuntimeError)


def test_forcing_inductor_on_mps_by_environment(monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "inductor")
    monkeypatch.setenv("DISPATCH_STRICT", "1")
    with pytest.raises(dispatch.UnsupportedDeviceError, match="mps"):
        fake_plan(MLP(), "mps", (4, 16))


@pytest.mark.parametrize("strict", ["0", "1"])
def test_forcing_a_route_onto_a_device_it_cannot_serve_raises_strict_or_not(monkeypatch, strict):
    monkeypatch.setenv("DISPATCH_ROUTE", "inductor")
    monkeypatch.setenv("DISPATCH_STRICT", strict)
    with pytest.raises(dispatch.UnsupportedDeviceError, match="forced by DISPATCH_ROUTE=inductor") as error:
        fake_plan(MLP(), "mps", (4, 16))
    assert "inductor does not run on mps" in str(error.value) and "unset DISPATCH_ROUTE" in str(error.value)


def test_forcing_a_route_that_is_not_installed_names_the_install_command(monkeypatch):
    import dispatch.planner as planner
    from dispatch.routes import Availability

    monkeypatch.setattr(
        planner,
        "availability",
        lambda route: Availability(
            route.name != "onnxrt",
            None,
            "not installed: onnxruntime; pip install 'torch-auto-dispatch[onnx]'",
        ),
    )
    with pytest.raises(dispatch.RouteUnavailableError, match=r"torch-auto-dispatch\[onnx\]") as error:
        fake_plan(MLP(), "cpu", (4, 16), routes=["onnxrt"])
    assert "options['routes']" in str(error.value)


def test_cuda_plans_without_a_gpu():
    plan = fake_plan(MLP(), "cuda", (4, 16))
    assert plan.regions and all(r.devices == {"cuda"} for r in plan.regions)
    assert plan.regions[0].rejected["onnxrt"].startswith("not chosen by rule: CUDA inference")
    assert [(r.route, r.inner_route) for r in plan.regions] == [("cudagraphs", "inductor")]


def test_onnxrt_on_cuda_needs_onnxruntime_gpu():
    with pytest.raises(dispatch.UnsupportedDeviceError, match="onnxruntime-gpu"):
        fake_plan(MLP(), "cuda", (4, 16), routes=["onnxrt", "eager"])


def test_custom_op_splits_regions():
    plan = fake_plan(CustomOpMLP(), "cpu", (4, 16))
    routes = [r.route for r in plan.regions]
    assert routes.count("onnxrt") == 2 and routes.count("eager") == 1
    (eager,) = [r for r in plan.regions if r.route == "eager"]
    assert eager.ops == ("dispatch_tests.scaled_tanh.default",)
    assert "cannot translate" in eager.rejected["onnxrt"]
    assert "dispatch_tests.scaled_tanh" in eager.rejected["onnxrt"]


class _NormAfterCustomOp(torch.nn.Module):
    """Linear -> custom op -> LayerNorm -> Linear: two onnxrt regions around an eager one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(scaled_tanh(self.a(x).relu(), 0.5))


def test_regions_are_listed_and_numbered_in_the_order_a_call_runs_them():
    plan = fake_plan(_NormAfterCustomOp(), "cpu", (4, 16))
    assert [(r.name, r.ops[-1]) for r in plan.regions] == [
        ("onnxrt_cpu_0", "aten.relu.default"),
        ("eager_cpu_0", "dispatch_tests.scaled_tanh.default"),
        ("onnxrt_cpu_1", "aten.addmm.default"),
    ]
    assert "aten.native_layer_norm.default" in plan.regions[2].ops


class _HypotBetweenLayers(torch.nn.Module):
    """Two Linear-ReLU layers around ``hypot`` and a ``var_mean``: torch's tables
    decompose both, hypot into ``prims.hypot`` (no torchlib function), var_mean
    into prims that torchlib has."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu()
        return self.b(torch.hypot(h, x).relu() + torch.var_mean(h, 1, keepdim=True)[0]).relu()


def test_an_op_the_exporter_decomposes_into_untranslatable_ops_is_planned_off_onnxrt():
    # Planned on onnxrt by the decomposition table alone, the region's export
    # failed on its first call and the whole region fell back to eager.
    plan = fake_plan(_HypotBetweenLayers(), "cpu", (4, 16))
    (hypot,) = [r for r in plan.regions if "aten.hypot.default" in r.ops]
    assert hypot.route == "eager"
    assert hypot.ops == ("aten.hypot.default",)
    assert "decomposes aten.hypot.default into prims.hypot.default" in hypot.rejected["onnxrt"]
    (var_mean,) = [r for r in plan.regions if "aten.var_mean.correction" in r.ops]
    assert var_mean.route == "onnxrt"  # its decomposition is all torchlib's
    assert [r.route for r in plan.regions] == ["onnxrt", "eager", "onnxrt"]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_region_around_an_untranslatable_decomposition_runs_on_onnxrt_without_falling_back(dynamic):
    # Symbolic sizes too: the decomposition is traced at the sizes Dynamo saw.
    model = _HypotBetweenLayers().eval()
    options = {"routes": ["onnxrt", "eager"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        explanation = dispatch.explain(model, torch.randn(4, 16), dynamic=dynamic, options=options)
        compiled = torch.compile(model, backend="auto", dynamic=dynamic, options=options)
        for rows in (4, 7, 2):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert [r.route for r in explanation.regions] == ["onnxrt", "eager", "onnxrt"]


def test_custom_op_strict_onnxrt_raises_unsupported_op():
    with pytest.raises(dispatch.UnsupportedOpError, match="scaled_tanh"):
        fake_plan(CustomOpMLP(), "cpu", (4, 16), routes=["onnxrt"], strict=True)


def test_min_region_size_merges_tiny_regions_into_eager():
    class Tiny(torch.nn.Module):
        def forward(self, x):
            from tests.models import scaled_tanh

            return scaled_tanh(scaled_tanh(x, 1.0).relu(), 1.0).relu() + 1

    # relu alone between two custom ops is too small for onnxrt; the tail relu+add is not.
    plan = fake_plan(Tiny(), "cpu", (4, 16), min_region_size=2)
    (onnx,) = [r for r in plan.regions if r.route == "onnxrt"]
    assert onnx.ops == ("aten.relu.default", "aten.add.Tensor")
    eager = [r for r in plan.regions if r.route == "eager"]
    assert any("aten.relu.default" in r.ops for r in eager)
    assert any("below min_region_size=2" in r.rejected.get("onnxrt", "") for r in eager)
    # The lone relu merged with its custom-op neighbours instead of making a region of its own.
    assert len(eager) == 1 and eager[0].node_count == 3

    plan = fake_plan(Tiny(), "cpu", (4, 16), min_region_size=3)
    assert [r.route for r in plan.regions] == ["eager"]


def test_regions_never_mix_devices():
    class TwoDevices(torch.nn.Module):
        def forward(self, a, b, scale):
            # scale is a 0-dim CPU tensor, which torch lets a CUDA op read.
            return (a.relu() + 1) * 2, b.sigmoid() * scale

    mode = FakeTensorMode()
    with mode:
        a = torch.randn(4, 4)
        b = torch.randn(4, 4, device="cuda")
        scale = torch.tensor(3.0)
    plan = dispatch.plan(torch.fx.symbolic_trace(TwoDevices()), [a, b, scale])
    assert all(len(r.devices) == 1 for r in plan.regions)
    assert {d for r in plan.regions for d in r.devices} == {"cpu", "cuda"}
    (cpu,) = [r for r in plan.regions if r.devices == {"cpu"} and r.route == "onnxrt"]
    assert cpu.ops == ("aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor")
    (mixed,) = [r for r in plan.regions if "moves data between devices" in r.rejected.get("inductor", "")]
    assert mixed.route == "eager" and "aten.mul.Tensor" in mixed.ops


def test_training_graphs_are_not_sent_to_onnxrt():
    model = MLP()
    x = torch.randn(4, 16)
    plan = dispatch.plan(torch.fx.symbolic_trace(model), [x])
    assert plan.regions and all(r.kind in ("forward", "backward") for r in plan.regions)
    assert all(r.route != "onnxrt" for r in plan.regions)
    # The CPU training rule leaves ONNX Runtime out, and says that it runs inference only.
    assert all("ONNX Runtime runs inference only" in r.rejected["onnxrt"] for r in plan.regions)


def test_training_forced_onnxrt_reason_is_inference_only():
    plan = dispatch.plan(torch.fx.symbolic_trace(MLP()), [torch.randn(4, 16)], routes=["onnxrt", "eager"])
    assert {r.route for r in plan.regions} == {"eager"}
    assert "inference only" in plan.regions[0].rejected["onnxrt"]


def test_disable_by_environment(monkeypatch):
    monkeypatch.setenv("DISPATCH_DISABLE", "onnxrt")
    plan = fake_plan(MLP(), "cpu", (4, 16))
    assert {r.route for r in plan.regions} == {"eager"}
    assert plan.regions[0].rejected["onnxrt"] == "disabled by DISPATCH_DISABLE=onnxrt"


def test_dynamic_shapes_go_to_onnxrt_with_their_dims_reported():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    model = on_fake_device(MLP(), "cpu", mode)
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.randn(4, 16), source=ConstantSource("x"), symbolic_context=context)
    plan = dispatch.plan(torch.fx.symbolic_trace(model), [x])
    assert plan.graphs[0].dynamic
    (dim,) = plan.graphs[0].dynamic_dims
    assert dim.startswith("arg6_1 dim 0 = s")
    # onnxrt exports symbolic dims as dynamic axes: one region for the whole MLP.
    assert [r.route for r in plan.regions] == ["onnxrt"]


def test_plan_is_serialisable():
    import json

    plan = fake_plan(CustomOpMLP(), "cpu", (4, 16))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["graphs"][0]["regions"][0]["route"] in ("onnxrt", "eager")
    assert "onnxrt" in str(plan)
    # Read back (plans stored beside AOTAutograd's entries are), equal to what was made.
    assert [GraphPlan.from_dict(g) for g in data["graphs"]] == plan.graphs
    assert GraphPlan.from_dict(data["graphs"][0], graph=7).regions[0].graph == 7


def test_forcing_cudagraphs_on_cpu_is_a_device_error(monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "cudagraphs")
    monkeypatch.setenv("DISPATCH_STRICT", "1")
    with pytest.raises(dispatch.UnsupportedDeviceError, match="cpu") as error:
        fake_plan(MLP(), "cpu", (4, 16))
    assert "?" not in str(error.value) and "DISPATCH_ROUTE=cudagraphs" in str(error.value)


def test_disabling_eager_lets_another_route_run_what_onnxrt_cannot(monkeypatch):
    monkeypatch.setenv("DISPATCH_DISABLE", "eager")
    plan = fake_plan(CustomOpMLP(), "cpu", (4, 16))
    (custom,) = [r for r in plan.regions if "dispatch_tests.scaled_tanh.default" in r.ops]
    assert custom.route == "inductor"
    assert {r.route for r in plan.regions} == {"onnxrt", "inductor"}


def test_disabling_onnxrt_and_eager_leaves_inductor(monkeypatch):
    monkeypatch.setenv("DISPATCH_DISABLE", "onnxrt,eager")
    plan = fake_plan(CustomOpMLP(), "cpu", (4, 16))
    assert {r.route for r in plan.regions} == {"inductor"}


def test_disabling_every_route_of_a_device_is_a_config_error(monkeypatch):
    monkeypatch.setenv("DISPATCH_DISABLE", "onnxrt,eager,inductor,triton")
    with pytest.raises(
        dispatch.ConfigError, match="DISPATCH_DISABLE=onnxrt,eager,inductor,triton leaves no route"
    ):
        fake_plan(MLP(), "cpu", (4, 16))


def test_strict_advice_names_the_options_the_user_set():
    with pytest.raises(dispatch.UnsupportedOpError) as error:
        fake_plan(CustomOpMLP(), "cpu", (4, 16), routes=["onnxrt"], strict=True)
    message = str(error.value)
    assert "set options['strict'] to False" in message and "add 'eager' to options['routes']" in message
    assert "DISPATCH_" not in message


def test_strict_advice_names_the_variables_the_user_set(monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "onnxrt")
    monkeypatch.setenv("DISPATCH_STRICT", "1")
    with pytest.raises(dispatch.UnsupportedOpError) as error:
        fake_plan(CustomOpMLP(), "cpu", (4, 16))
    message = str(error.value)
    assert "unset DISPATCH_STRICT" in message and "unset DISPATCH_ROUTE" in message
    assert "options[" not in message


def test_plan_for_a_device_this_machine_lacks():
    model, x = MLP(), torch.randn(4, 16)
    before = [p.clone() for p in model.parameters()]
    plan = dispatch.plan(model, [x], device="mps")
    assert plan.regions and all(r.devices == {"mps"} and r.route == "eager" for r in plan.regions)
    assert (
        plan.regions[0]
        .rejected["inductor"]
        .endswith("device mps is not served by inductor (it serves cpu, cuda)")
    )
    # the user's model is untouched: real weights, on cpu, unchanged
    for p, q in zip(model.parameters(), before):
        assert p.device.type == "cpu" and not isinstance(p, torch._subclasses.FakeTensor)
        assert torch.equal(p, q)
    cuda = dispatch.plan(model, [x], device="cuda")
    assert [(r.route, r.inner_route) for r in cuda.regions] == [("cudagraphs", "inductor")]


class SizeBranch(torch.nn.Module):
    """Branches on its input's size and returns a dict, as transformers' models do:
    ``torch.fx.symbolic_trace`` cannot follow the branch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        if x.shape[0] > 1:
            x = x * 2
        return {"out": self.linear(x).relu()}


class ValueBranch(torch.nn.Module):
    def forward(self, x):
        return x.sin() if x.sum() > 0 else x.cos()


def test_plan_of_a_module_symbolic_trace_cannot_follow_exports_it():
    x = torch.randn(4, 16)
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(SizeBranch())
    with torch.no_grad():
        plan = dispatch.plan(SizeBranch(), [x])
        cuda = dispatch.plan(SizeBranch(), [x], device="cuda")
    assert [r.route for r in plan.regions] == ["onnxrt"]
    assert {"aten.mul.Tensor", "aten.relu.default"} <= set(plan.regions[0].ops)
    assert [(r.route, r.inner_route) for r in cuda.regions] == [("cudagraphs", "inductor")]


def test_plan_of_a_module_nothing_can_trace_says_what_to_run_instead():
    with pytest.raises(
        dispatch.DispatchError, match=r"symbolic_trace failed .* and so did torch.export"
    ) as error:
        dispatch.plan(ValueBranch(), [torch.randn(4)])
    assert "dispatch.explain(model, *inputs)" in str(error.value)
    assert "ValueBranch on cpu" in str(error.value)


def test_model_and_inputs_on_different_devices_say_what_to_move():
    mode = FakeTensorMode()
    (x,) = fake_inputs(mode, "mps", (4, 16))
    with pytest.raises(dispatch.DispatchError, match="weights are on cpu and its inputs on mps") as error:
        dispatch.plan(torch.fx.symbolic_trace(MLP()), [x])
    assert "device='mps'" in str(error.value)


def test_ops_that_read_complex_values_stay_off_onnxrt():
    # irfft takes a complex tensor and returns a real one: on onnxrt its region had a
    # complex64 input that ONNX Runtime cannot bind, and fell back with a warning.
    plan = fake_plan(SpectralFilter(), "cpu", (4, 32))
    (inverse,) = [r for r in plan.regions if "aten._fft_c2r.default" in r.ops]
    assert inverse.route != "onnxrt"
    assert "complex64" in inverse.rejected["onnxrt"]


def test_float64_stays_off_onnxrt():
    # ONNX Runtime's CPU provider has no float64 Conv or GELU: a float64 region
    # holding one failed to load and fell back whole; its float64 GEMM ran a SiLU
    # MLP 3.2x slower than eager.
    plan = fake_plan(MLP().double(), "cpu", (4, 16), dtype=torch.float64)
    assert all(r.route != "onnxrt" for r in plan.regions)
    assert all("float64" in r.rejected["onnxrt"] for r in plan.regions)
    mixed = fake_plan(MLP(), "cpu", (4, 16))  # float32 beside it: unchanged
    assert [r.route for r in mixed.regions] == ["onnxrt"]


class _ExpertMatmul(torch.nn.Module):
    """An ONNX Runtime region that hands a transposed weight to an op that only
    eager runs, as a mixture-of-experts layer hands its expert weights over."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Parameter(torch.randn(16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(x)) * 2
        return matmul_outside_onnx(h, self.down.t()) + 1


def test_a_view_of_a_weight_that_only_eager_reads_stays_with_torch():
    """ONNX Runtime took the transposed weight into its region: it computed the
    transpose and copied it back into torch's strides on every call (two copies of
    each expert weight per call in Mixtral, which ran slower than eager)."""
    plan = fake_plan(_ExpertMatmul(), "cpu", (4, 16))
    onnx, eager = plan.regions
    assert (onnx.route, eager.route) == ("onnxrt", "eager")
    assert "aten.silu.default" in onnx.ops
    assert eager.ops[:2] == ("aten.t.default", "dispatch_tests.matmul_outside_onnx.default")
    assert "a view of its region's inputs read only outside it" in eager.rejected["onnxrt"]
    model, x = _ExpertMatmul().eval(), torch.randn(4, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


class _PooledHead(torch.nn.Module):
    """A conv stem whose pooled features reach the caller through a view: of an
    intermediate (``flatten``, as MobileNetV2's pooler returns them), of the
    input, of a value another output shows, or strided (a transpose)."""

    def __init__(self, returns: str) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.returns = returns

    def forward(self, x: torch.Tensor):
        pooled = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1)
        if self.returns == "input":
            return pooled.flatten(1) + 1, x.flatten(1)
        if self.returns == "shared":
            return pooled, pooled.flatten(1)
        if self.returns == "strided":
            return pooled.flatten(1).t()
        return pooled.flatten(1)


@pytest.mark.parametrize(
    ("returns", "reason"),
    [
        ("intermediate", None),
        ("input", "returns to the caller a view of an input"),
        ("shared", "returns to the caller a view of a value another output shows"),
        ("strided", "returns to the caller a strided view"),
    ],
)
def test_a_view_returned_to_the_caller_leaves_onnx_runtime_only_where_a_copy_would_show(returns, reason):
    """Every view the graph returned ran in an eager region of its own after ORT's:
    27 µs a call after MobileNetV2's ORT region, for the ``flatten`` of its pooled
    features, whose base nothing else returns, so that a copy shows nothing."""
    plan = fake_plan(_PooledHead(returns), "cpu", (2, 3, 8, 8))
    routes = [r.route for r in plan.regions]
    if reason is None:
        assert routes == ["onnxrt"]
        assert "aten.view.default" in plan.regions[0].ops
    else:
        assert routes == ["onnxrt", "eager"]
        assert reason in plan.regions[1].rejected["onnxrt"]
    model, x = _PooledHead(returns).eval(), torch.randn(2, 3, 8, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled = torch.compile(model, backend="auto")
        torch.testing.assert_close(compiled(x), model(x))
        out = compiled(x)
    if returns == "input":
        out[1][0, 0] = 42.0  # the view of the input writes the input, as in eager
        assert x[0, 0, 0, 0] == 42.0
    if returns == "shared":
        out[1][0, 0] = 42.0  # and a view of another output writes that output
        assert out[0][0, 0, 0, 0] == 42.0


def test_a_route_left_out_by_rule_that_a_measurement_moved_a_region_to_is_not_listed_as_unused():
    from dispatch.region import BY_RULE, Region, region_table

    rule = f"{BY_RULE}: CPU inference: ONNX Runtime runs what it can"
    left_out = {"inductor": rule, "triton": rule}
    regions = [
        Region(
            0,
            "onnxrt_cpu_0",
            "inductor",
            ("aten.mm.default",),
            frozenset({"cpu"}),
            1,
            rejected=dict(left_out),
            planned_route="onnxrt",
        ),
        Region(
            0,
            "eager_cpu_0",
            "eager",
            ("aten.cumprod.default",),
            frozenset({"cpu"}),
            1,
            rejected=dict(left_out),
        ),
    ]
    lines = region_table(regions).splitlines()
    assert "  triton: CPU inference: ONNX Runtime runs what it can" in lines
    assert (
        "  inductor: CPU inference: ONNX Runtime runs what it can "
        "(the regions above on inductor were moved there by measurement)"
    ) in lines
