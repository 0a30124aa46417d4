"""CUDA routing, proven on fake CUDA tensors through dispatch.plan."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import dispatch
from dispatch.routes import registry
from tests.conftest import fake_inputs, needs_triton, on_fake_device
from tests.models import MLP


class Launchy(torch.nn.Module):
    """Small and launch-bound: pointwise ops around a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return (self.linear(x.sin() * 2) + 1).cos()


def cuda_plan(model, *shapes, mode=None, **options):
    mode = mode or FakeTensorMode()
    model = on_fake_device(model, "cuda", mode)
    return dispatch.plan(torch.fx.symbolic_trace(model), fake_inputs(mode, "cuda", *shapes), **options)


def test_static_graph_is_captured_around_inductor():
    plan = cuda_plan(Launchy(), (8, 16))
    assert [r.route for r in plan.regions] == ["cudagraphs"]
    (region,) = plan.regions
    assert region.inner_route == "inductor"
    assert region.devices == {"cuda"}
    assert "cudagraphs" not in region.rejected
    assert region.rejected["onnxrt"].startswith("not chosen by rule: CUDA inference starts from torch's best")


class Norms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.up(self.norm(x))).sin().cos()


def test_kernel_patterns_stay_in_inductor_by_default():
    plan = cuda_plan(Norms(), (4, 16))
    assert [(r.route, r.inner_route) for r in plan.regions] == [("cudagraphs", "inductor")]
    assert "not chosen by rule" in plan.regions[0].rejected["triton"]


@needs_triton
def test_kernel_patterns_go_to_triton_inside_the_capture_when_allowed_first():
    plan = cuda_plan(Norms(), (4, 16), routes=["triton", "inductor", "eager", "cudagraphs"])
    inner = {r.inner_route: r for r in plan.regions}
    assert set(inner) == {"triton", "inductor"}
    assert all(r.route == "cudagraphs" for r in plan.regions)
    assert {"aten.native_layer_norm.default", "aten.addmm.default", "aten.gelu.default"} <= set(
        inner["triton"].ops
    )
    assert "aten.sin.default" in inner["inductor"].ops
    assert "no kernels/ pattern covers aten.sin.default" in inner["inductor"].rejected["triton"]


class TransformerBlock(torch.nn.Module):
    """Pre-norm attention and MLP, written out as real models write it."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.d = heads, d
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.size(0), x.size(1), self.d
        qkv = self.qkv(self.norm1(x))
        q, k, v = [
            qkv.narrow(-1, i * d, d).reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
            for i in range(3)
        ]
        attn = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class ResNetBlock(torch.nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


@pytest.mark.parametrize(
    "model, shape",
    [(TransformerBlock(), (2, 8, 32)), (ResNetBlock().eval(), (2, 8, 16, 16))],
    ids=["transformer", "resnet"],
)
def test_real_blocks_are_one_captured_inductor_region(model, shape):
    plan = cuda_plan(model, shape)
    assert [(r.route, r.inner_route) for r in plan.regions] == [("cudagraphs", "inductor")]
    assert plan.regions[0].node_count > 5


def test_graph_break_pieces_are_each_one_captured_region():
    """Dynamo cuts ``h = a(x); if h.mean().item() > 0: h = h * 2; return b(h)``
    into the pieces below; each is captured whole (the trees join them)."""
    a = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))

    class Before(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = a

        def forward(self, x):
            h = self.a(x)
            return h, h.mean()

    class After(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b = torch.nn.Linear(16, 16)

        def forward(self, h):
            return self.b(h * 2)

    for piece in (Before(), After()):
        plan = cuda_plan(piece, (4, 16))
        assert [(r.route, r.inner_route) for r in plan.regions] == [("cudagraphs", "inductor")]


def test_data_dependent_op_splits_the_capture_only_there():
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.l(x).sin()
            return h, torch.masked_select(h, h > 0)  # nonzero has no fake cuda kernel in a CPU build

    plan = cuda_plan(Masked(), (4, 16), mode=FakeTensorMode(shape_env=ShapeEnv()))
    captured = [r for r in plan.regions if r.route == "cudagraphs"]
    assert captured and all(r.inner_route == "inductor" for r in captured)
    (masked,) = [r for r in plan.regions if "aten.masked_select.default" in r.ops]
    assert masked.route == "eager" and "dynamic shape" in masked.rejected["cudagraphs"]


def test_dynamic_shape_graph_is_not_captured():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    model = on_fake_device(Launchy(), "cuda", mode)
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    symbolic = mode.from_tensor(torch.empty(8, 16), source=ConstantSource("x"), symbolic_context=context)
    with mode:
        x = torch.empty_strided(symbolic.shape, symbolic.stride(), device="cuda")
    plan = dispatch.plan(torch.fx.symbolic_trace(model), [x])
    assert plan.graphs[0].dynamic
    assert all(r.route == "inductor" for r in plan.regions)
    assert all("dynamic shape" in r.rejected["cudagraphs"] for r in plan.regions)


def test_graph_with_a_cpu_tensor_is_not_captured_there():
    class WithCpu(torch.nn.Module):
        def forward(self, x, scale):
            return (x.sin() * scale).cos() + 1

    mode = FakeTensorMode()
    with mode:
        x = torch.randn(4, 4, device="cuda")
        scale = torch.tensor(2.0)  # 0-dim CPU tensor, legal in a CUDA op
    plan = dispatch.plan(torch.fx.symbolic_trace(WithCpu()), [x, scale])
    (mixed,) = [r for r in plan.regions if "aten.mul.Tensor" in r.ops]
    assert mixed.route == "eager" and mixed.devices == {"cuda"}
    assert "moves data between devices" in mixed.rejected["inductor"]
    assert "non-CUDA tensor" in mixed.rejected["cudagraphs"]
    others = [r for r in plan.regions if r is not mixed]
    assert others and all(r.route == "cudagraphs" for r in others)


def test_graph_that_mutates_an_input_keeps_the_mutation_outside_the_capture():
    class Mutates(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x.sin() * 2

    mode = FakeTensorMode()
    (x,) = fake_inputs(mode, "cuda", (4, 4))
    plan = dispatch.plan(torch.fx.symbolic_trace(Mutates()), [x])
    # AOTAutograd functionalizes the graph: the write-back to x happens in its
    # wrapper, after the region, so the region itself is safe to capture.
    assert [r.route for r in plan.regions] == ["cudagraphs"]
    assert "aten.add.Tensor" in plan.regions[0].ops
    assert not any(op.endswith("add_.Tensor") for op in plan.regions[0].ops)


def test_capture_check_rejects_a_region_that_mutates_its_input():
    mode = FakeTensorMode()
    with mode:
        x = torch.randn(4, device="cuda")
    graph = torch.fx.Graph()
    ph = graph.placeholder("x")
    ph.meta["val"] = x
    mutated = graph.call_function(torch.ops.aten.add_.Tensor, (ph, 1.0))
    with mode:
        mutated.meta["val"] = torch.empty(4, device="cuda")
    graph.output((mutated,))
    reason = registry.get("cudagraphs").capture_reason(
        torch.fx.GraphModule(torch.nn.Module(), graph), registry.get("eager")
    )
    assert reason is not None and "mutated" in reason


def test_two_cuda_devices_never_share_a_region():
    class TwoGpus(torch.nn.Module):
        def forward(self, a, b):
            return a.sin() * 2 + 1, b.cos() * 3 - 1

    mode = FakeTensorMode()
    with mode:
        a = torch.randn(4, 4, device="cuda:0")
        b = torch.randn(4, 4, device="cuda:1")
    plan = dispatch.plan(torch.fx.symbolic_trace(TwoGpus()), [a, b])
    assert len(plan.regions) == 2
    assert {r.name for r in plan.regions} == {"inductor_cuda0_0", "inductor_cuda1_0"}
    assert all(r.route == "cudagraphs" and r.inner_route == "inductor" for r in plan.regions)


def test_capture_check_rejects_a_region_spanning_two_devices():
    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    nodes = []
    for i in (0, 1):
        ph = graph.placeholder(f"x{i}")
        with mode:
            ph.meta["val"] = torch.randn(4, device=f"cuda:{i}")
        nodes.append(ph)
    graph.output(tuple(nodes))
    reason = registry.get("cudagraphs").capture_reason(
        torch.fx.GraphModule(torch.nn.Module(), graph), registry.get("eager")
    )
    assert "several CUDA devices" in reason


def test_training_on_cuda_goes_to_inductor_uncaptured():
    # Training plans need autograd on the fake tensors, which a CPU-only build of
    # torch cannot do for cuda; the rule is checked on the planner directly.
    from dispatch.config import Config
    from dispatch.planner import route_order

    order, left_out = route_order("cuda", "forward", Config())
    assert order[0] == "inductor" and "onnxrt" not in order and "cudagraphs" not in order
    assert "CUDA training" in left_out["onnxrt"]


def test_onnxrt_cuda_provider_only_with_onnxruntime_gpu():
    with pytest.raises(dispatch.UnsupportedDeviceError, match="needs onnxruntime-gpu"):
        cuda_plan(MLP(), (4, 16), routes=["onnxrt", "eager"])


def test_disable_cudagraphs_by_environment(monkeypatch):
    monkeypatch.setenv("DISPATCH_DISABLE", "cudagraphs")
    plan = cuda_plan(Launchy(), (8, 16))
    assert [r.route for r in plan.regions] == ["inductor"]
    assert plan.regions[0].rejected["cudagraphs"] == "disabled by DISPATCH_DISABLE=cudagraphs"


def test_gpu_routes_listed_by_doctor():
    import importlib.util

    routes = dispatch.available_routes()
    assert routes["cudagraphs"]["available"] is torch.cuda.is_available()
    has_triton = importlib.util.find_spec("triton") is not None
    assert routes["triton"]["available"] is has_triton
    if not has_triton:
        assert "pip install 'torch-auto-dispatch[triton]'" in routes["triton"]["reason"]
