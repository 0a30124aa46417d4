"""Dynamic shapes: few recompiles, one ONNX export with dynamic axes, reported dims."""

import pytest
import torch
from torch._dynamo.utils import counters

import dispatch

BATCHES = (1, 2, 3, 5, 8, 13, 64)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)
    ).eval()


@pytest.fixture
def exports(onnx_exports):
    """Counts ONNX exports, with Dynamo's caches and counters fresh."""
    torch._dynamo.reset()
    counters.clear()
    return onnx_exports


@torch.no_grad()
def test_batch_sizes_recompile_at_most_twice(exports):
    m = model()
    compiled = torch.compile(m, backend="auto")
    for batch in BATCHES:
        x = torch.randn(batch, 7, 16)
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs <= 3, f"{graphs} graphs: more than two recompiles"
    # One export for the batch-1 graph, one with a dynamic batch axis for all others.
    assert exports[0] == graphs


@torch.no_grad()
def test_mark_dynamic_compiles_and_exports_once(exports):
    m = model()
    compiled = torch.compile(m, backend="auto")
    for batch in BATCHES[1:]:
        x = torch.randn(batch, 7, 16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert exports[0] == 1


@torch.no_grad()
def test_sizes_passed_as_integers_reach_onnx_as_tensor_dims(exports):
    """Dynamo passes a dynamic size as a separate SymInt input (here for the reshape);
    the ONNX model reads it from the tensor instead."""

    def fn(x, w):
        return (x @ w).relu().reshape(x.shape[0], -1).sin()

    w = torch.randn(16, 4)
    compiled = torch.compile(fn, backend="auto")
    for batch in (3, 5, 9):
        x = torch.randn(batch, 7, 16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=1e-5, atol=1e-5)
    assert exports[0] == 1


@torch.no_grad()
def test_explain_shows_dynamic_dims():
    x = torch.randn(4, 7, 16)
    torch._dynamo.mark_dynamic(x, 0)
    explanation = dispatch.explain(model(), x)
    (graph,) = explanation.plans
    assert graph.dynamic
    assert len(graph.dynamic_dims) == 1 and graph.dynamic_dims[0].startswith("args[0] dim 0 = s")
    assert "Dynamic dims:" in str(explanation)
    assert "aten.addmm.default" in next(r for r in explanation.regions if r.route == "onnxrt").ops
    assert explanation.to_dict()["graphs"][0]["dynamic_dims"] == list(graph.dynamic_dims)


@torch.no_grad()
def test_data_dependent_shape_is_a_reason_not_an_error():
    def fn(x):
        return torch.nonzero(x > 0).float().sum(0) * 2

    x = torch.randn(6, 3)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        explanation = dispatch.explain(fn, x)
        got = torch.compile(fn, backend="auto")(x)
    torch.testing.assert_close(got, fn(x))
    reasons = [r.rejected.get("onnxrt", "") for r in explanation.regions if r.route == "eager"]
    assert any("data-dependent shape" in reason for reason in reasons), explanation


@torch.no_grad()
def test_an_onnx_export_does_not_reset_other_compiled_functions(exports):
    """The exporter's strict (Dynamo) path resets Dynamo; ours must not use it."""
    first = torch.compile(lambda x: torch.tanh(x) * 2 + 1, backend="auto")
    x = torch.randn(8, 8)
    first(x)
    graphs = counters["stats"]["unique_graphs"]
    second = torch.compile(lambda x: torch.sigmoid(x) * 3 - 1, backend="auto")
    second(x)
    first(x)
    assert counters["stats"]["unique_graphs"] == graphs + 1


@torch.no_grad()
def test_outputs_of_one_call_survive_the_next():
    m = model()
    compiled = torch.compile(m, backend="auto")
    a, b = torch.randn(4, 7, 16), torch.randn(4, 7, 16)
    out_a = compiled(a)
    kept = out_a.clone()
    compiled(b)
    assert torch.equal(out_a, kept)


class _StoresItsWindow(torch.nn.Module):
    """Stores a size on itself, as Swin's ``set_shift_and_window_size`` does, and
    returns one: Dynamo makes both outputs of the graph (``SymInt``s)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.window = 4

    def forward(self, x):
        self.window = min(x.shape[0], x.shape[1])
        return self.proj(x).relu(), x.shape[0] * 2


@torch.no_grad()
@pytest.mark.parametrize("route", ["onnxrt", None])
def test_sizes_a_graph_returns_stay_python_ints(monkeypatch, route):
    """ORT returned them as 0-dim tensors: Swin's window size became a tensor
    attribute, and every later graph that read it failed to compile."""
    if route:
        monkeypatch.setenv("DISPATCH_ROUTE", route)
    torch._dynamo.reset()
    m = _StoresItsWindow()
    compiled = torch.compile(m, backend="auto", dynamic=True)
    for rows in (5, 7, 20):
        x = torch.randn(rows, 16)
        out, doubled = compiled(x)
        assert type(doubled) is int and doubled == 2 * rows
        assert type(m.window) is int and m.window == min(rows, 16)
        torch.testing.assert_close(out, m.proj(x).relu())


def _aten_graph(fn, *args):
    """The aten inference graph AOTAutograd makes of ``fn`` compiled with ``dynamic=True``."""
    from torch._functorch.aot_autograd import aot_module_simplified

    captured = []

    def capture(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: captured.append(g) or g)

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, dynamic=True)(*args)
    (graph,) = captured
    return graph


def _offset_positions(x, n):
    return (torch.arange(x.shape[0]) + n) * x


@torch.no_grad()
def test_an_inductor_region_compiled_for_an_integer_of_zero_holds_for_other_values():
    """A region compiles on its first call's inputs. An integer input (a cache's
    position) was made a size symbol, which a first value of 0 or 1 specialises:
    compiled at 0, the region ran every later position as 0."""
    from dispatch.routes import registry

    graph = _aten_graph(_offset_positions, torch.randn(5), 0)
    assert [type(p.meta["val"]) for p in graph.graph.find_nodes(op="placeholder")][-1] is torch.SymInt
    region = registry.get("inductor").compile(graph, [5, torch.randn(5), 0])
    x = torch.randn(7)
    for n in (3, -2, 1):
        (out,) = region(7, x, n)
        torch.testing.assert_close(out, _offset_positions(x, n))


def _slices_at(x, n):
    return x[n:] * 2, x[: x.shape[0] - n].sum()


@torch.no_grad()
def test_an_inductor_region_checks_what_its_compile_assumed_of_the_sizes():
    """Inductor compiles a region in a shape environment of its own, whose guards
    (here ``0 <= n <= len(x)``) Dynamo never sees. A call past them, which the
    compiled code cannot run, gets a region compiled for its own sizes."""
    from dispatch.routes import registry

    graph = _aten_graph(_slices_at, torch.randn(8, 4), 2)
    region = registry.get("inductor").compile(graph, [8, 4, torch.randn(8, 4), 2])
    x = torch.randn(8, 4)
    for n in (5, 9, 12):
        for out, expected in zip(region(8, 4, x, n), _slices_at(x, n)):
            torch.testing.assert_close(out, expected)


def test_an_inductor_region_checks_a_symbolic_size_its_compile_took_for_a_number():
    """Torch leaves out of its guards a tensor size that reads as a number, since
    Dynamo checks the sizes that were static when it traced. A size symbolic in the
    region's own shape environment that inductor took for the first call's value
    is checked by nobody else: the region must check it."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from dispatch.routes.inductor import size_guards
    from dispatch.routes.onnx_guards import shape_check

    shape_env = ShapeEnv()
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fake = FakeTensorMode(shape_env=shape_env).from_tensor(
        torch.randn(2, 5), source=ConstantSource("x"), symbolic_context=context
    )
    assert bool(fake.shape[0] == 2)  # what a compile that branches on the size records
    holds = shape_check(size_guards(shape_env, [fake]))
    assert holds([torch.randn(2, 5)])
    assert not holds([torch.randn(3, 5)])


def test_an_integer_input_that_is_a_tensors_size_is_faked_as_that_size():
    """Dynamo passes a batch size beside the tensor that has it, both one symbol. Faked
    as two, inductor could only reconcile them by taking both for the first call's
    value (a ``torch.cond`` graph: a program for that batch alone)."""
    from dispatch.routes.inductor import fake_inputs

    graph = _aten_graph(_offset_positions, torch.randn(5), 3)
    placeholders = graph.graph.find_nodes(op="placeholder")
    assert [isinstance(p.meta["val"], torch.SymInt) for p in placeholders] == [True, False, True]
    fakes, _ = fake_inputs(placeholders, [5, torch.randn(5), 3])
    size, x, position = fakes
    assert size.node.expr == x.shape[0].node.expr  # one symbol, as in Dynamo's graph
    assert position.node.expr != size.node.expr  # an integer of its own keeps its own
