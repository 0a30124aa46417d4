"""NaN and infinity through ONNX Runtime come back as torch computes them.

ORT's MaxPool, ReduceMax/ReduceMin and ArgMax/ArgMin pass over a NaN that
shares a window or row with a number, its Sign(NaN) is NaN and a one-sided Clip
clips infinity to the largest float: a NaN input came back finite. The first
call here holds no NaN, as a first call rarely does, so the first-call check
cannot catch it; the second does."""

import warnings

import pytest
import torch

import dispatch
from dispatch.stitch import FallbackWarning

pytest.importorskip("onnxruntime")

F = torch.nn.functional
NAN, INF = float("nan"), float("inf")

PATTERNS = {
    "max_pool2d": (lambda x: F.max_pool2d(x, 2) + 1, (2, 3, 4, 4)),
    # Not doubled: -3.4e38 doubled is -inf, which hid a wrong -3.4e38 (below).
    "max_pool2d_padded": (lambda x: F.max_pool2d(x, 3, 2, 1) + 1, (2, 3, 6, 6)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 1) + 1, (2, 3, 4, 4)),
    "amax": (lambda x: x.amax(-1) + 1, (3, 5)),
    "amin_keepdim": (lambda x: x.amin(0, keepdim=True) + 1, (3, 5)),
    "amax_every_dim": (lambda x: x.amax() + 1, (3, 5)),
    "max": (lambda x: x.max() + 1, (3, 5)),
    "max_dim": (lambda x: torch.stack([x.max(-1).values, x.max(-1).indices.float()]) + 1, (3, 5)),
    "min_dim": (lambda x: torch.stack([x.min(1).values, x.min(1).indices.float()]) + 1, (3, 5)),
    "argmax": (lambda x: (x + 1).argmax(-1), (3, 5)),
    "argmin_keepdim": (lambda x: (x + 1).argmin(0, keepdim=True), (3, 5)),
    "argmax_every_dim": (lambda x: (x + 1).argmax(), (3, 5)),
    "sign": (lambda x: torch.sign(x) * 2, (3, 5)),
    # Halved: the largest float that ORT's one-sided Clip made of infinity, doubled, is infinity again.
    "clamp_min": (lambda x: x.clamp_min(0.1) * 0.5, (3, 5)),
    "clamp_max": (lambda x: torch.clamp(x, max=0.1) * 0.5, (3, 5)),
    "clamp_min_tensor": (lambda x: torch.clamp_min(x, torch.tensor(0.1)) * 0.5, (3, 5)),
    "clamp_max_tensor": (lambda x: torch.clamp_max(x, torch.full((), 0.1)) * 0.5, (3, 5)),
}


def _with(shape, position, value, dtype=torch.float32):
    x = torch.randn(shape).to(dtype)
    x.view(-1)[position] = value
    return x


def _assert_as_eager(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("name", sorted(PATTERNS))
@torch.no_grad()
def test_a_nan_or_an_infinity_comes_back_as_torch_gives_it(name):
    fn, shape = PATTERNS[name]
    assert {r.route for r in dispatch.explain(fn, torch.randn(shape)).regions} == {"onnxrt"}
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="auto", dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled(torch.randn(shape))
        for value in (NAN, INF, -INF):
            for position in (1, 7):  # first and later rows and windows
                x = _with(shape, position, value)
                _assert_as_eager(compiled(x.clone()), fn(x.clone()))
        # All -inf: ORT pads a max pooling with the lowest finite float, so a
        # window at the border came out as -3.4e38 where torch's is -inf.
        for value in (NAN, -INF):
            everywhere = torch.full(shape, value)
            _assert_as_eager(compiled(everywhere.clone()), fn(everywhere.clone()))


class _SmallCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        features = F.max_pool2d(torch.relu(self.conv(x)), 3, 2, 1)
        return features, self.head(features.flatten(1)).softmax(-1)


@pytest.mark.parametrize("dynamic", [False, True])
@torch.no_grad()
def test_a_nan_pixel_reaches_its_own_image_outputs_only_as_in_eager(dynamic):
    """One NaN pixel in image 1 of 3: eager's pooled features are NaN in every window
    the convolution spread it to, and its class scores are NaN, for that image only."""
    model = _SmallCnn().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="auto", dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled(torch.randn(2, 3, 8, 8))
        x = torch.randn(3, 3, 8, 8)
        x[1, 0, 5, 2] = NAN
        got, expected = compiled(x), model(x)
    assert expected[1][1].isnan().all() and not expected[1][[0, 2]].isnan().any()
    for g, e in zip(got, expected):
        _assert_as_eager(g, e)


def _float16_as_eager(fn, shape, calls):
    """``fn`` compiled, its first call of ordinary float16 numbers, then each of ``calls``."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled(torch.randn(shape, dtype=torch.float16))
        for x in calls:
            _assert_as_eager(compiled(x.clone()), fn(x.clone()))


@torch.no_grad()
def test_float16_max_pooling_keeps_a_nan():
    shape = (2, 3, 4, 4)
    nans = [_with(shape, position, NAN, torch.float16) for position in range(16)]
    _float16_as_eager(PATTERNS["max_pool2d"][0], shape, nans)
    lowest = torch.full((2, 3, 6, 6), -INF, dtype=torch.float16)
    _float16_as_eager(PATTERNS["max_pool2d_padded"][0], lowest.shape, [lowest])


@torch.no_grad()
def test_max_pooling_whose_indices_are_read_stays_off_onnx_runtime():
    """ORT's indices skip a NaN and no ONNX op can correct them: the pool runs elsewhere."""

    def unpooled(x):
        values, indices = F.max_pool2d(x * 2, 2, return_indices=True)
        return F.max_unpool2d(values + 1, indices, 2)

    explanation = dispatch.explain(unpooled, torch.randn(1, 2, 4, 4))
    pooling = [r for r in explanation.regions if "aten.max_pool2d_with_indices.default" in r.ops]
    assert pooling and all(r.route != "onnxrt" for r in pooling)
    x = _with((1, 2, 4, 4), 5, NAN)
    _assert_as_eager(torch.compile(unpooled, backend="auto")(x.clone()), unpooled(x.clone()))


def _region(fn, shape):
    """``fn`` as an aten graph, the form a region reaches the route in."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(torch.randn(shape))


# The clamps are rewritten on the aten graph, the same way on both paths.
@pytest.mark.parametrize("name", sorted(n for n in PATTERNS if not n.startswith("clamp")))
@torch.no_grad()
def test_a_model_that_computes_torch_s_result_itself_gives_it(name):
    """A lowered program has no torch beside its regions to run a NaN call again: its
    model computes torch's result inside (an ``If`` on whether a NaN is there)."""
    import onnxruntime as ort

    from dispatch.routes.onnx_export import export_region

    fn, shape = PATTERNS[name]
    model = export_region(_region(fn, shape), [torch.randn(shape)])
    assert not model.flags_nan
    session = ort.InferenceSession(
        model.graph, model.session_options(ort.SessionOptions()), providers=["CPUExecutionProvider"]
    )
    (feed,) = [i.name for i in session.get_inputs()]
    cases = [_with(shape, p, v) for v in (NAN, INF, -INF) for p in (1, 7)]
    for x in [*cases, torch.full(shape, NAN), torch.full(shape, -INF), torch.randn(shape)]:
        (got,) = session.run(None, {feed: x.numpy()})
        _assert_as_eager(torch.from_numpy(got), fn(x))


@torch.no_grad()
def test_under_torch_compile_the_pooling_runs_as_exported_and_is_flagged():
    """An ``If`` around the pooling took it out of ORT's blocked layout, and the
    convolution after it lost its fused residual add: hf_resnet's ORT run took
    138 µs against 108. Under torch.compile the model only flags a NaN."""
    onnx = pytest.importorskip("onnx")
    from dispatch.routes.onnx_export import export_region
    from dispatch.routes.onnx_nan import NAN_SEEN

    def pooled(x):
        return F.max_pool2d(torch.relu(x), 3, 2, 1) + 1

    x = torch.randn(2, 3, 8, 8)
    flagged = export_region(_region(pooled, x.shape), [x], flag_nan=True)
    graph = onnx.load_from_string(flagged.graph).graph
    ops = [n.op_type for n in graph.node]
    assert "If" not in ops and "MaxPool" in ops and "GlobalAveragePool" in ops
    assert flagged.flags_nan and [o.name for o in graph.output][-1] == NAN_SEEN and len(graph.output) == 2
    in_model = export_region(_region(pooled, x.shape), [x])
    assert "If" in [n.op_type for n in onnx.load_from_string(in_model.graph).graph.node]

    plain = export_region(_region(torch.relu, x.shape), [x], flag_nan=True)
    assert not plain.flags_nan and len(onnx.load_from_string(plain.graph).graph.output) == 1


@torch.no_grad()
def test_a_nan_call_is_run_by_torch_and_the_next_one_by_onnx_runtime(monkeypatch):
    """The flag sends one call to torch; the region stays on its route."""
    from dispatch.routes import onnx_on_torch

    fn, shape = PATTERNS["max_pool2d_padded"]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="auto", dynamic=False)
    compiled(torch.randn(shape))
    runners = []
    real = onnx_on_torch.TorchWhereNaN.__call__

    def spying(self, *args):
        runners.append(self)
        return real(self, *args)

    monkeypatch.setattr(onnx_on_torch.TorchWhereNaN, "__call__", spying)
    calls = []
    x = _with(shape, 7, NAN)
    compiled(x.clone())
    (runner,) = set(runners)
    gm = runner.gm
    runner.gm = lambda *args: calls.append(args) or gm(*args)
    _assert_as_eager(compiled(x.clone()), fn(x.clone()))
    assert len(calls) == 1
    compiled(torch.randn(shape))
    assert len(calls) == 1
