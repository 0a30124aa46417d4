"""A region exported once for every shape computes torch's result at every shape.

The first-call check runs at one shape. An op whose ONNX translation depends on
the size (a decomposition that branches on ``H % 3``, an antialiased Resize)
came back wrong at other sizes with nothing to see it."""

import warnings

import pytest
import torch

import dispatch
from dispatch.errors import InputSpecError
from dispatch.graph_tuning import WHOLE_GRAPH
from dispatch.stitch import FallbackWarning

pytest.importorskip("onnxruntime")

F = torch.nn.functional
# Batch 1 and 2 compile separately (Dynamo specialises a size of 1); each
# graph then meets heights and widths that fall in other classes modulo 3.
SHAPES = [(1, 3, 7, 9), (2, 3, 10, 6), (1, 3, 13, 17), (1, 3, 5, 5), (2, 3, 11, 8), (1, 3, 9, 9)]


def _matches_eager_without_fallback(fn, shapes, dynamic=True):
    """``fn`` compiled by auto gives eager's result at each of ``shapes``, and no
    route falls back on the way (a ``FallbackWarning`` is an error)."""
    compiled = torch.compile(fn, backend="auto", dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        for shape in shapes:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), fn(x))


def _adaptive_avg(x):
    return F.adaptive_avg_pool2d(x, 3) + 1


def _adaptive_avg_2x4(x):
    return F.adaptive_avg_pool2d(x, (2, 4)) * 2


def _strided_max_pool(x):  # its guards call max(): a check too strict sent it to eager
    return F.max_pool2d(x, 2, 3) + 1


@pytest.mark.parametrize("fn", [_adaptive_avg, _adaptive_avg_2x4, _strided_max_pool])
@torch.no_grad()
def test_a_size_dependent_export_is_right_at_every_size(fn):
    """Exported at 7x9, adaptive 3x3 pooling was 1.3 off at 5x5: the decomposition
    picked its windows for 7 % 3 == 1, and ONNX Runtime checks no guard."""
    assert {r.route for r in dispatch.explain(fn, torch.randn(SHAPES[0])).regions} == {"onnxrt"}
    torch._dynamo.reset()
    _matches_eager_without_fallback(fn, SHAPES)


@torch.no_grad()
def test_each_class_of_shapes_is_exported_once(onnx_exports):
    torch._dynamo.reset()
    compiled = torch.compile(_adaptive_avg, backend="auto", dynamic=True)
    for _ in range(2):
        for shape in [(2, 3, 7, 9), (2, 3, 8, 9), (2, 3, 13, 9)]:  # 7 and 13 are both 1 modulo 3
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), _adaptive_avg(x))
    assert onnx_exports[0] == 2


@torch.no_grad()
def test_a_class_compiled_again_is_logged_by_its_shape_not_its_guards(monkeypatch, caplog):
    # hf_resnet's guards ran to 912 characters of sympy on one info line.
    monkeypatch.setenv("DISPATCH_LOG", "debug")
    torch._dynamo.reset()
    compiled = torch.compile(_adaptive_avg, backend="auto", dynamic=True)
    with caplog.at_level("DEBUG", logger="dispatch"):
        for shape in [(2, 3, 7, 9), (2, 3, 8, 9)]:
            compiled(torch.randn(shape))
    again = [r for r in caplog.records if "compiled again" in r.getMessage()]
    assert len(again) == 1 and again[0].levelname == "INFO"
    assert "of shape 2x3x8x9," in again[0].getMessage() and "args[" not in again[0].getMessage()
    guards = [r for r in caplog.records if r.levelname == "DEBUG" and "holds where" in r.getMessage()]
    assert len(guards) == 1 and "args[" in guards[0].getMessage()


@torch.no_grad()
def test_antialiased_resize_of_a_dynamic_size_stays_off_onnx_runtime():
    """ORT's antialiased Resize differs from torch's where the scale is inexact
    (0.5 off from 11x8 down to 5x4); static, the first-call check catches it."""

    def down(x):
        return F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True) + 1

    torch._dynamo.reset()
    compiled = torch.compile(down, backend="auto", dynamic=True)
    for shape in [(2, 3, 10, 6), (2, 3, 11, 8)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), down(x))


def test_a_lowered_region_refuses_shapes_its_model_does_not_hold_for():
    """A lowered program has no torch beside its regions to run them."""

    class Pool(torch.nn.Module):
        def forward(self, x):
            return _adaptive_avg(x)

    h, w = torch.export.Dim("h", min=4, max=64), torch.export.Dim("w", min=4, max=64)
    program = dispatch.lower(Pool(), (torch.randn(2, 3, 7, 9),), dynamic_shapes=({2: h, 3: w},))
    assert [r.route for r in program.regions] == ["onnxrt"]
    x = torch.randn(2, 3, 13, 18)  # 13 % 3 == 1 and 18 % 3 == 0, as 7 and 9
    torch.testing.assert_close(program(x), _adaptive_avg(x))
    with pytest.raises(InputSpecError, match="lower the model with example inputs of these shapes"):
        program(torch.randn(2, 3, 5, 9))


def test_a_guard_that_is_not_shape_arithmetic_is_refused():
    """Guards come back from the cache and from saved programs, where nothing may run code."""
    from dispatch.routes.onnx_guards import shape_check

    holds = shape_check(["(args[0].size()[2] % 3) != 0", "2 <= args[0].size()[3]"])
    assert holds([torch.zeros(1, 1, 7, 9)]) and not holds([torch.zeros(1, 1, 9, 9)])
    # As torch writes them for a nearest resize by 0.7.
    scaled = shape_check(["max(1, math.trunc(0.7*torch.sym_float(args[0].size()[2]))) != 1"])
    assert scaled([torch.zeros(1, 1, 7, 9)]) and not scaled([torch.zeros(1, 1, 2, 9)])
    planted_code = (
        "__import__('os').system('true')",
        "args[0].numpy()",
        "(lambda: 1)()",
        "'a' < 'b'",
        "torch.load('x')",
    )
    for planted in planted_code:
        with pytest.raises(ValueError, match="a shape guard"):
            shape_check([planted])


def _chunks(x):
    return torch.cat([p.sin() * (k + 1) for k, p in enumerate(x.chunk(3, dim=-1))], dim=-1).tanh()


def _nearest_by_half_again(x):
    return F.interpolate(x, scale_factor=1.5, mode="nearest").relu() * 2


@torch.no_grad()
def test_chunk_of_a_symbolic_size_runs_on_onnxrt():
    """Split into pieces of a symbolic size, the exporter's SplitToSequence failed
    in onnxscript's constant folding, and the whole region fell back to eager."""
    # Pieces of 8, 9, 9, 2 (two pieces), 11.
    _matches_eager_without_fallback(_chunks, [(2, 3, width) for width in (24, 25, 26, 4, 31)])
    explained = dispatch.explain(_chunks, torch.randn(2, 5, 25), dynamic=True)
    assert [r.route for r in explained.regions] == ["onnxrt"]


@torch.no_grad()
def test_a_region_whose_size_no_tensor_carries_is_planned_off_onnxrt():
    """A size that reaches a region only as an integer cannot reach ONNX Runtime:
    the plan keeps that region off onnxrt instead of failing it at compile."""
    _matches_eager_without_fallback(_nearest_by_half_again, [(2, 3, 8, 8), (2, 3, 11, 7), (1, 2, 5, 9)])
    # onnxrt and eager only: inductor would be timed against the cut graph
    options = {"routes": ["onnxrt", "eager"]}
    regions = dispatch.explain(
        _nearest_by_half_again, torch.randn(2, 3, 9, 9), dynamic=True, options=options
    ).regions
    assert all(r.planned_route is None for r in regions)  # no route failed
    assert any("is no dimension of a tensor input" in r.rejected.get("onnxrt", "") for r in regions)
    assert "onnxrt" in {r.route for r in regions}


def _window_step(x, w, seen):
    """One decoding step of a sliding-window cache: ``seen``, a Python int the cache
    keeps (transformers' ``cumulative_length``), offsets the mask's positions."""
    positions = torch.arange(x.shape[0]) + seen
    visible = positions[:, None] >= torch.arange(x.shape[0])[None, :] + 2
    scores = (x @ w) @ x.T
    return torch.softmax(scores.masked_fill(~visible, -1e4), -1) @ x, seen + 1


@torch.no_grad()
def test_only_the_ops_that_read_a_size_no_tensor_carries_stay_off_onnxrt():
    """Mistral's and Gemma 2's decoding steps ran all eager: their cache's position,
    a size input no tensor carries, refused the whole region ORT was offered. Only
    the ops that read it need torch; the matmuls and the softmax stay on ORT."""
    w = torch.randn(16, 16)
    compiled = torch.compile(_window_step, backend="auto", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        for rows, seen in [(6, 0), (9, 3), (5, 11)]:
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x, w, seen), _window_step(x, w, seen))
    # onnxrt and eager only: inductor may win the graph whole by measurement
    options = {"routes": ["onnxrt", "eager"]}
    regions = dispatch.explain(_window_step, torch.randn(7, 16), w, 4, dynamic=True, options=options).regions
    on_onnxrt = [op for r in regions if r.route == "onnxrt" for op in r.ops]
    assert "aten.mm.default" in on_onnxrt and "aten._softmax.default" in on_onnxrt, regions
    readers = [r for r in regions if "is no dimension of a tensor input" in r.rejected.get("onnxrt", "")]
    assert readers and all(r.route == "eager" and "aten.mm.default" not in r.ops for r in readers), regions


def _causal_attention(x):
    return F.scaled_dot_product_attention(x, x, x, is_causal=True) + 1


@torch.no_grad()
def test_attention_scaled_by_a_symbolic_size_runs_on_onnxrt():
    """With every size dynamic, attention's scale ``1 / sqrt(E)`` is a symbolic float,
    which torchlib's ``mul.Scalar`` refused: the region fell back to eager."""
    _matches_eager_without_fallback(_causal_attention, [(2, 7, 16), (1, 13, 16), (3, 5, 8), (2, 22, 32)])
    regions = dispatch.explain(_causal_attention, torch.randn(2, 7, 16), dynamic=True).regions
    assert [r.route for r in regions] == ["onnxrt"]


def _adaptive_max(x):
    return F.adaptive_max_pool2d(x, 3) + 1


@pytest.mark.parametrize("dynamic", [False, True])
@torch.no_grad()
def test_adaptive_max_pooling_of_uneven_windows_is_planned_off_onnxrt(dynamic):
    """The exporter writes adaptive max pooling as one MaxPool window size; at 10x10
    to 3x3 the export failed and the region fell back to eager with a warning."""
    _matches_eager_without_fallback(_adaptive_max, [(2, 3, 10, 10), (2, 3, 9, 9), (2, 3, 11, 7)], dynamic)
    # Static sizes from here (a size Dynamo saw change is symbolic, never known to divide).
    torch._dynamo.reset()
    uneven = dispatch.explain(_adaptive_max, torch.randn(2, 3, 10, 10)).regions
    assert any("does not divide its input size" in r.rejected.get("onnxrt", "") for r in uneven)
    assert all(r.planned_route is None for r in uneven)
    torch._dynamo.reset()
    even = dispatch.explain(_adaptive_max, torch.randn(2, 3, 9, 9)).regions
    assert [r.route for r in even] == ["onnxrt"]


def _step_and_next_position(x, w, seen):
    return torch.softmax(x @ w, -1) @ x.T, seen + 1


@torch.no_grad()
def test_a_graph_left_eager_only_in_size_arithmetic_is_not_timed_as_cut():
    """Mistral's decoding step leaves its cache's next length (``seen + 1``) to
    torch. Counted as eager work that cuts the graph, it made every cold start
    compile the step whole by inductor to time it against ORT."""
    w = torch.randn(16, 16)
    regions = dispatch.explain(_step_and_next_position, torch.randn(7, 16), w, 4, dynamic=True).regions
    assert {r.route for r in regions} == {"onnxrt", "eager"}, regions
    assert all(WHOLE_GRAPH not in r.measured for r in regions), regions
