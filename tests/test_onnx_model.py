"""An exported region keeps its large initializers beside the graph, and its cache
payload gives back the same graph and the same arrays."""

import logging
import warnings

import numpy as np
import pytest
import torch

import dispatch
from benchmarks.zoo.patterns import FlexSelfAttention
from dispatch.routes.onnx_model import EXTERNAL_MIN_BYTES, OnnxModel
from dispatch.stitch import FallbackWarning

pytest.importorskip("onnxruntime")


def test_payload_round_trip_keeps_every_array_and_its_layout():
    weights = np.arange(40 * 30, dtype=np.float32).reshape(40, 30).T  # not contiguous
    model = OnnxModel(
        b"graph-bytes", {"w": weights, "ids": np.arange(7, dtype=np.int64), "b": np.ones(3, np.float16)}
    )
    payload = b"".join(bytes(part) for part in model.parts())
    back = OnnxModel.from_payload(payload)
    assert back.graph == b"graph-bytes"
    assert list(back.initializers) == ["w", "ids", "b"]
    for name, array in model.initializers.items():
        assert back.initializers[name].dtype == array.dtype
        np.testing.assert_array_equal(back.initializers[name], array)


def test_an_exported_region_has_no_weights_in_its_graph():
    from dispatch.routes.onnx_export import export_region

    linear = torch.nn.Linear(64, 64).eval()
    gm = torch.fx.symbolic_trace(lambda x, w, b: torch.nn.functional.linear(x, w, b))
    x = torch.randn(2, 64)
    model = export_region(gm, [x, linear.weight.detach(), linear.bias.detach()], frozen=frozenset({1, 2}))
    assert len(model.graph) < EXTERNAL_MIN_BYTES  # the 16 KB weight is not in it
    (weight,) = [a for a in model.initializers.values() if a.size == 64 * 64]
    assert weight.flags["C_CONTIGUOUS"]  # ORT refuses strided arrays


def test_exporting_a_region_that_returns_a_folded_weight_logs_nothing(caplog):
    """The ONNX optimizer notes at WARNING that an initializer which is also an
    output is not deduplicated; that is no business of the user's."""
    from dispatch.routes.onnx_export import export_region

    gm = torch.fx.symbolic_trace(lambda x, w: (torch.relu(x @ w), w * 2))
    with caplog.at_level(logging.DEBUG):
        export_region(gm, [torch.randn(2, 8), torch.randn(8, 8)], frozen=frozenset({1}))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_gelu_exports_as_one_onnx_gelu_not_an_erf_chain():
    """At torchlib's floor opset (18) gelu became Div, Erf, Add, Mul, Mul, which ONNX
    Runtime does not fuse back (ConvNeXt's session ran 1.27x longer); at the
    exporter's default opset it is ONNX's own Gelu."""
    import onnx

    from dispatch.routes.onnx_export import export_region

    gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.gelu(x) * 2)
    model = export_region(gm, [torch.randn(4, 8)])
    ops = [n.op_type for n in onnx.load_from_string(model.graph).graph.node]
    assert "Gelu" in ops and "Erf" not in ops, ops


def test_region_inputs_are_named_apart_from_every_name_the_export_gives_its_nodes():
    """A region's placeholders carried the names of the parent graph's nodes
    (``convert_element_type_default_1``, a symbolic float made a tensor). Under
    ``dynamic=True`` the export named one of its own casts the same, and the ONNX
    graph had a value that was both an input and a node's output: Mistral's and
    Llama's (with an attention mask) ORT regions fell back to eager."""
    import onnx

    from dispatch.routes.onnx_export import export_region

    gm = torch.fx.symbolic_trace(lambda x, scale: (x.mean(-1, keepdim=True) + scale).rsqrt() * x)
    for placeholder, name in zip(
        gm.graph.find_nodes(op="placeholder"), ["mean", "convert_element_type_default"]
    ):
        placeholder.target = name
        placeholder._rename(name)
    gm.recompile()
    model = export_region(gm, [torch.randn(2, 8), torch.tensor(1e-6)])
    graph = onnx.load_from_string(model.graph).graph
    assert [i.name for i in graph.input] == ["region_input_0", "region_input_1"]
    produced = {o for n in graph.node for o in n.output}
    assert not produced & {i.name for i in graph.input}


@pytest.mark.parametrize(("default", "expected"), [(18, 20), (20, 20), (21, 21)])
def test_the_export_opset_follows_torch_onnx_but_never_drops_below_gelu(monkeypatch, default, expected):
    from torch.onnx import _constants

    from dispatch.routes.onnx_registry import export_opset

    monkeypatch.setattr(_constants, "ONNX_DEFAULT_OPSET", default)
    assert export_opset() == expected


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_linear_layer_exports_its_weight_itself_not_a_transposed_copy(with_bias):
    from torch.fx.experimental.proxy_tensor import make_fx

    from dispatch.routes.onnx_export import export_region

    aten = torch.ops.aten

    def lowered_linear(x, w, b):  # how AOTAutograd lowers nn.Linear
        if with_bias:
            return aten.addmm.default(b, x, aten.t.default(w))
        return aten.mm.default(x, aten.t.default(w))

    x, w, b = torch.randn(2, 64), torch.randn(32, 64), torch.randn(32)
    gm = make_fx(lowered_linear)(x, w, b)
    model = export_region(gm, [x, w, b], frozen=frozenset({1, 2}))
    (weight,) = [a for a in model.initializers.values() if a.shape == (32, 64)]
    assert np.shares_memory(weight, w.numpy())  # no second copy, transposed or not


def test_initializers_numpy_cannot_name_stay_in_the_graph():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import onnx_ir as ir

    big = np.ones(EXTERNAL_MIN_BYTES, dtype=np.float32)
    odd = np.ones(EXTERNAL_MIN_BYTES, dtype=ml_dtypes.bfloat16)
    values = [ir.Value(name=n, const_value=ir.tensor(a, name=n)) for n, a in (("big", big), ("odd", odd))]
    graph = ir.Graph(inputs=[], outputs=values, nodes=[], initializers=values, opset_imports={"": 21})
    model = OnnxModel.from_ir(ir.Model(graph, ir_version=10))
    assert list(model.initializers) == ["big"]  # bfloat16's numpy dtype would not survive the cache
    assert len(model.graph) > odd.nbytes


@torch.no_grad()
def test_a_channels_last_feature_map_comes_back_channels_last():
    """ORT returns every output contiguous; eager and inductor return the traced
    strides, and code after the model relies on them: this view raised on auto's
    contiguous output."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    model = model.eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    out, expected = torch.compile(model, backend="auto")(x), model(x)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out.permute(0, 2, 3, 1).view(2, -1), expected.permute(0, 2, 3, 1).view(2, -1))


def test_only_dense_traced_strides_are_restored():
    from dispatch.routes.onnx_ops import fills_storage

    assert fills_storage((2, 8, 4, 4), (128, 1, 32, 8))  # channels_last
    assert fills_storage((3, 5), (1, 3))  # transposed
    assert fills_storage((2, 1, 3), (3, 99, 1))  # a size-1 dim's stride is free
    assert not fills_storage((3, 5), (0, 1))  # expanded: overlapping
    assert not fills_storage((3, 5), (10, 1))  # a row slice of a wider tensor: gaps


@torch.no_grad()
def test_a_view_with_gaps_leaves_onnx_runtime_in_its_traced_order():
    """``q`` of a split ``qkv`` feeds ``flex_attention`` in an eager region, which lays
    its output out as ``q``: ``q`` left ORT contiguous, and the ``view`` after
    flex_attention raised on auto's first call."""
    torch.manual_seed(0)
    model, x = FlexSelfAttention().eval(), torch.randn(2, 32, 64)
    explained = dispatch.explain(model, x)
    assert [r.route for r in explained.regions] == ["onnxrt", "eager", "onnxrt"]
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


def _qkv_split(qkv):
    q = qkv.view(qkv.shape[0], qkv.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)[0]
    return q, qkv[:, 0], qkv.expand(2, *qkv.shape)


@pytest.mark.parametrize("tracing_mode", ["real", "symbolic"])
def test_onnx_runtimes_contiguous_outputs_take_the_traced_order_of_views_with_gaps(tracing_mode):
    """``q`` of a split ``qkv`` (gaps between its rows) comes back dense in its traced
    order, of static or symbolic size; a row slice, in contiguous order already, and
    an expanded view (overlapping) come back as ORT returned them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dispatch.routes.onnx_outputs import traced_form

    gm = make_fx(_qkv_split, tracing_mode=tracing_mode)(torch.randn(2, 8, 192))
    form = traced_form(gm)
    qkv = torch.randn(3, 5, 192)  # another size: the symbolic graph serves it too
    expected = _qkv_split(qkv)
    returned = tuple(e.contiguous() for e in expected)  # as ORT returns them
    q, row, expanded = form(returned)
    assert q.is_contiguous() is False and q.transpose(1, 2).is_contiguous()
    q.transpose(1, 2).view(3, 5, 64)  # raises on a contiguous q
    torch.testing.assert_close(q, expected[0], rtol=0, atol=0)
    assert row is returned[1] and expanded is returned[2]  # not copied


@torch.no_grad()
def test_dropout_in_train_mode_under_no_grad_still_drops():
    """A model left in train mode, run under no_grad (MC dropout): ORT's optimizer
    removed the exported Dropout, and auto returned eval-mode outputs. Random ops
    stay on torch, so the same seed gives eager's numbers."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Dropout(0.5), *layers[:2]).train()
    x = torch.randn(32, 128)
    compiled = torch.compile(model, backend="auto")
    torch.manual_seed(1)
    out = compiled(x)
    torch.manual_seed(1)
    torch.testing.assert_close(out, model(x))
    assert not torch.equal(compiled(x), out)  # a new mask every call


@torch.no_grad()
def test_batchnorm_in_train_mode_under_no_grad_uses_batch_statistics():
    """What torch.optim.swa_utils.update_bn does: train mode, no_grad. ORT normalised
    by the running statistics (max error 0.74) and updated them wrongly."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3),
    ).train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="auto")
    for _ in range(3):
        x = torch.randn(4, 3, 16, 16)
        torch.testing.assert_close(compiled(x), reference(x))
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == 3


def test_seeded_ops_leave_onnx_runtime_only_where_they_draw_random_numbers():
    from dispatch.routes.onnx_ops import not_as_in_torch

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    aten = torch.ops.aten

    def node(target, *args, **kwargs):
        return graph.call_function(target, args, kwargs)

    assert not_as_in_torch(node(aten.native_dropout.default, x, 0.5, True))
    assert not_as_in_torch(node(aten.native_dropout.default, x, 0.5, False)) is None
    assert not_as_in_torch(node(aten.bernoulli.p, x, 0.5))
    # Every inference attention: the op is tagged seeded for its dropout_p.
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert not_as_in_torch(node(sdpa, x, x, x)) is None
    assert not_as_in_torch(node(sdpa, x, x, x, 0.1))
    assert (
        not_as_in_torch(node(aten._native_batch_norm_legit_no_training.default, x, x, x, x, x, 0.1, 1e-5))
        is None
    )
    assert not_as_in_torch(
        node(aten._native_batch_norm_legit_functional.default, x, x, x, x, x, True, 0.1, 1e-5)
    )


@torch.no_grad()
def test_avg_pool_with_a_divisor_override_is_computed_as_torch_does():
    # torchlib drops divisor_override: the pooled values came back 0.46 off.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.AvgPool2d(2, divisor_override=3)).eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))


@torch.no_grad()
def test_a_translation_that_computes_something_else_falls_back_on_its_first_call(monkeypatch):
    """Any exporter or ORT bug of the kinds above: the region's first call is also run
    by torch, and a region whose outputs differ falls back with the reason."""
    import dispatch.routes.onnxrt as onnxrt_route

    real = onnxrt_route._session_runner

    def off_by_a_half(*how):
        run = real(*how)
        return lambda *a: tuple(t + 0.5 for t in run(*a))

    monkeypatch.setattr(onnxrt_route, "_session_runner", off_by_a_half)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).eval(), torch.randn(8, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))
    (warning,) = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert "differs from torch's on its first call" in str(warning.message)


@torch.no_grad()
def test_a_translation_that_returns_another_dtype_falls_back_on_its_first_call(monkeypatch):
    import dispatch.routes.onnxrt as onnxrt_route

    real = onnxrt_route._session_runner

    def in_double(*how):
        run = real(*how)
        return lambda *a: tuple(t.double() for t in run(*a))

    monkeypatch.setattr(onnxrt_route, "_session_runner", in_double)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).eval(), torch.randn(8, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend="auto")(x)
    assert out.dtype == torch.float32
    (warning,) = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert "torch.float64 of shape (8, 64)" in str(warning.message)


class _SumOfLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.a(x).sum(0), x.sum(-1)


@torch.no_grad()
def test_a_float16_sum_comes_back_float16_from_onnx_runtime():
    """torchlib sums float16 in float32 and returned the float32 sum: the zoo's
    data-dependent model in float16 returned float32 where eager returns float16."""
    model, x = _SumOfLinear().half().eval(), torch.randn(5, 16).half()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # ORT must run it, not eager
        got = torch.compile(model, backend="auto")(x)
    for g, e in zip(got, model(x)):
        assert g.dtype == torch.float16
        torch.testing.assert_close(g, e, rtol=1e-2, atol=1e-2)  # ORT's float16 Gemm rounds otherwise


class _IndexedByInt32(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)

    def forward(self, x, idx):
        h = self.a(x).relu()
        picked = h[idx] * 2
        updated = h.clone()
        updated[idx] = picked + 1
        return picked, updated


@torch.no_grad()
def test_int32_indices_index_on_onnx_runtime():
    """torchlib exports ``x[i]`` as GatherND, which ONNX Runtime rejects for int32
    indices: the whole region around the index fell back to eager, with a warning."""
    model, x, idx = _IndexedByInt32().eval(), torch.randn(4, 6), torch.tensor([3, 0, 2], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(model, backend="auto")(x, idx)
    for g, e in zip(got, model(x, idx)):
        torch.testing.assert_close(g, e)


class _HalvedPositions(torch.nn.Module):
    def forward(self, positions, x):
        return (positions // 2.0) * x + 1


@torch.no_grad()
def test_an_integer_floor_divided_by_a_float_runs_on_onnx_runtime():
    # torchlib could not convert floor_divide of an int tensor by a float: the
    # region around it fell back to eager, with a warning.
    model, positions, x = _HalvedPositions(), torch.tensor([3, -7, 2, 9], dtype=torch.int32), torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(model, backend="auto")(positions, x)
    expected = model(positions, x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


class _MaskedAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(16, 16)

    def forward(self, x, mask):
        q = self.q(x).view(2, 8, 2, 8).transpose(1, 2)
        k = v = x.view(2, 8, 2, 8).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
@torch.no_grad()
def test_a_query_whose_keys_are_all_masked_gets_zeros_as_in_torch(dtype):
    """A left-padded batch: causal, and the padding queries see no key. torch's
    kernel returns zeros there, ORT's translation NaN; the first call had no
    padding, so the check against torch could not see it (LLaMA came back NaN)."""
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    padded = causal.clone().expand(2, 1, 8, 8).clone()
    padded[1, :, :, :3] = False  # batch row 1: three padding positions on the left

    def as_mask(allowed):
        if dtype == torch.bool:
            return allowed
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

    model, x = _MaskedAttention().eval(), torch.randn(2, 8, 16)
    compiled = torch.compile(model, backend="auto", options={"strict": True})
    full = causal.expand(2, 1, 8, 8).clone()
    torch.testing.assert_close(compiled(x, as_mask(full)), model(x, as_mask(full)))
    out, expected = compiled(x, as_mask(padded)), model(x, as_mask(padded))
    assert not expected.isnan().any()
    torch.testing.assert_close(out, expected)


@torch.no_grad()
def test_a_region_of_weights_only_runs_on_ort():
    """A graph that reads only buffers (the graph break leaves ``x`` to the next
    one) bakes every input in: the ONNX model takes none. The export raised
    IndexError on the empty input list and the region fell back to eager."""

    class ScaleFromBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor([0.5, 1.5]))

        def forward(self, x):
            s = (self.scale * 2).exp() - 1
            print("", end="")
            return x * s.sum()

    torch._dynamo.reset()
    m = ScaleFromBuffer()
    compiled = torch.compile(m, backend="auto")
    x = torch.randn(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        torch.testing.assert_close(compiled(x), m(x))
        m.scale.mul_(2)  # baked, and seen to change
        torch.testing.assert_close(compiled(x), m(x))


class _StandardisedConv(torch.nn.Conv2d):
    """timm's ``ScaledStdConv2d``: the weight normalised by its own statistics on
    every call, written as batch norm with no running statistics."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(cin, cout, 3, padding=1)
        self.gain = torch.nn.Parameter(torch.full((cout, 1, 1, 1), 1.5))

    def forward(self, x):
        weight = torch.nn.functional.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            weight=(self.gain * 0.5).view(-1),
            training=True,
            momentum=0.0,
            eps=1e-6,
        ).reshape_as(self.weight)
        return torch.nn.functional.conv2d(x, weight, self.bias, padding=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@torch.no_grad()
def test_standardised_weights_run_with_their_convolutions_on_onnx_runtime(dtype):
    """The standardisation was kept off ORT (its BatchNormalization runs inference
    only), so an eager region recomputed the weights on every call and the
    convolutions read them as inputs: nfnet_l0 ran slower than eager."""
    import copy

    import dispatch

    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(_StandardisedConv(3, 8), torch.nn.SiLU(), _StandardisedConv(8, 8))
        .eval()
        .to(dtype)
    )
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    routes = [r.route for r in dispatch.explain(model, x).regions]
    assert routes == ["onnxrt"], routes
    compiled = torch.compile(model, backend="auto")

    def assert_as_close_as_eager(got):
        # Against float64, as the zoo judges half precision: as close as eager is.
        truth = copy.deepcopy(model).double()(x.double())
        eager_error = (model(x).double() - truth).abs().max()
        assert (got.double() - truth).abs().max() <= 1.5 * eager_error + 1e-4

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        assert_as_close_as_eager(compiled(x))
    model[0].gain.mul_(2)  # baked in, and seen to change
    assert_as_close_as_eager(compiled(x))


class _TokensByExpert(torch.nn.Module):
    """Groups tokens by the expert each is routed to, as sort-based
    mixture-of-experts layers do: many tokens share an expert id."""

    def __init__(self, stable: bool) -> None:
        super().__init__()
        self.router = torch.nn.Linear(16, 4)
        self.stable = stable

    def forward(self, x):
        experts = self.router(x).argmax(-1)
        order = torch.sort(experts, stable=self.stable).indices
        return x[order] * 2 + 1, order


@pytest.mark.parametrize("stable", [False, True])
@torch.no_grad()
def test_a_sort_with_ties_runs_on_onnx_runtime_in_its_stable_order(stable):
    """ONNX Runtime orders equal values by index (a stable sort). torch's unstable
    sort ordered them otherwise: the first-call check refused the region, and a
    mixture-of-experts model ran its layers eagerly. The stable overload had no
    ONNX translation at all."""
    model, x = _TokensByExpert(stable).eval(), torch.randn(64, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        rows, order = torch.compile(model, backend="auto")(x)
    assert {r.route for r in dispatch.explain(model, x).regions} == {"onnxrt"}
    expected = torch.sort(model.router(x).argmax(-1), stable=True).indices
    assert torch.equal(order, expected)
    torch.testing.assert_close(rows, x[expected] * 2 + 1)


class _SortedMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = torch.nn.Linear(8, 8)

    def forward(self, x):
        order = torch.sort(self.score(x) > 0, dim=0, descending=True).indices
        return x[order[:, 0]] * 2 + 1


@torch.no_grad()
def test_a_sort_of_a_bool_tensor_is_left_to_torch_at_plan_time():
    """ONNX Runtime's TopK takes no bool tensor: the session failed to load and
    the whole region around the sort fell back to eager, with a warning."""
    model, x = _SortedMask().eval(), torch.randn(32, 8)
    options = {"routes": ["onnxrt", "eager"]}  # no inductor timed against the cut graph
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(model, backend="auto", options=options)(x)
    torch.testing.assert_close(got, model(x))
    regions = dispatch.explain(model, x, options=options).regions
    (sort,) = [r for r in regions if "aten.sort.default" in r.ops]
    assert sort.route == "eager"
    assert "takes no bool input" in sort.rejected["onnxrt"]
    assert any(r.route == "onnxrt" and "aten.addmm.default" in r.ops for r in regions)
