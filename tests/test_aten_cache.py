"""The stored aten graph: a second compile of the same graph skips AOTAutograd and
plans the very graph the first one traced; graphs whose trace the key cannot
pin down are never stored."""

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import dispatch.aten_cache as aten_cache
import dispatch.backend as backend
import dispatch.cache as cache_module
import dispatch.graph_data as graph_data
from dispatch.cache import ArtifactCache, CacheWarning

EAGER = {"routes": ["eager"], "min_region_size": 1}  # cheap to plan and run; the graphs are what is checked


@pytest.fixture
def planned(monkeypatch):
    """Every inference graph auto planned, as (code, node values), and how many AOTAutograd traces ran."""
    seen = {"graphs": [], "traces": 0, "stitched": []}
    compile_graph, trace, stitch = backend._GraphCompiler.compile, backend.aot_compile, backend.stitch

    def recording(self, gm, example_inputs, kind, **kwargs):
        values = [_metadata(n.meta.get("val")) for n in gm.graph.nodes]
        seen["graphs"].append((gm.code, values))
        return compile_graph(self, gm, example_inputs, kind, **kwargs)

    def counting(*args, **kwargs):
        seen["traces"] += 1
        return trace(*args, **kwargs)

    def stitching(split, plan, config, whole=None):
        stitched = stitch(split, plan, config, whole)
        seen["stitched"].append((stitched.gm.code, [r.gm.code for r in stitched.runners]))
        return stitched

    monkeypatch.setattr(backend._GraphCompiler, "compile", recording)
    monkeypatch.setattr(backend, "stitch", stitching)
    monkeypatch.setattr(backend, "aot_compile", counting)
    return seen


def _metadata(value):
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return type(value)(_metadata(v) for v in value)
    return value


def _layer_norm_mlp(x):
    return torch.nn.functional.layer_norm(torch.relu(x @ x.T), (x.shape[0],)) * 2


def _offset_view(x):
    return (x[:, 1:] * 2).to(torch.float16)


def _constants(x):
    return torch.where(x > 0, x, torch.full_like(x, float("-inf")))


def _ramp(x):  # ops without tensor inputs, which plain FX tracing would fold to constants
    return x + torch.arange(x.shape[1], device=x.device, dtype=x.dtype) + torch.ones(x.shape[1])


def _literals(x):  # tensor literals: AOTAutograd holds them as constants of the graph (get_attr)
    scale, shift = torch.tensor(0.1), torch.tensor([1.5, -0.0, 3.0, 0.1, 7.0])
    rows = x[torch.tensor([0, 2])]
    return (rows * scale + shift).clamp(max=torch.tensor(float("inf"))), torch.tensor([]).numel()


def _several_outputs(x):
    top, index = x.max(dim=1)
    a, b = torch.split(x, [1, x.shape[1] - 1], dim=1)
    return top, index, a.sum() + b.mean()


@pytest.mark.parametrize(
    "fn", [_layer_norm_mlp, _offset_view, _constants, _ramp, _literals, _several_outputs]
)
def test_a_second_compile_plans_the_graph_the_first_traced(planned, fn):
    x = torch.randn(4, 5)
    with torch.no_grad():
        first = torch.compile(fn, backend="auto", options=EAGER)(x)
        torch._dynamo.reset()
        second = torch.compile(fn, backend="auto", options=EAGER)(x)
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(second, fn(x))
    assert planned["traces"] == 1  # the second compile read the stored graph
    (code, values), (code_again, values_again) = planned["graphs"]
    assert code_again == code
    assert values_again == values
    assert all(v is not None for v in values[:-1])  # every node but the output has a value
    # Graphs derived from it are named alike: their code keys the cache's other entries.
    first_stitched, second_stitched = planned["stitched"]
    assert second_stitched == first_stitched


def test_a_graph_that_reads_back_otherwise_is_not_stored(planned, monkeypatch):
    record = graph_data.node_record

    def renaming(node, kinds=graph_data._NODE_KINDS):
        written = record(node, kinds)
        return {**written, "target": "renamed"} if node.op == "placeholder" else written

    monkeypatch.setattr(graph_data, "node_record", renaming)
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.compile(_ramp, backend="auto", options=EAGER)(x)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(_ramp, backend="auto", options=EAGER)(x + 1), _ramp(x + 1))
    assert planned["traces"] == 2
    assert not (Path(os.environ["DISPATCH_CACHE_DIR"]) / aten_cache.KIND).exists()


def _table(x):  # a literal past graph_data.CONSTANT_LIMIT: a weight in all but name, not stored
    return x + torch.tensor([float(i) for i in range(100)])[: x.shape[1]]


def test_a_graph_holding_a_large_constant_is_traced_each_time(planned):
    x = torch.randn(4, 5)
    with torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(_table, backend="auto", options=EAGER)(x), _table(x))
    assert planned["traces"] == 2
    assert not (Path(os.environ["DISPATCH_CACHE_DIR"]) / aten_cache.KIND).exists()


def test_the_onnxrt_decompositions_are_part_of_the_key(planned):
    layer = torch.nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True).eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        expected = layer(x)
        for options in (EAGER, {"routes": ["onnxrt", "eager"]}, {"routes": ["onnxrt", "eager"]}):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(layer, backend="auto", options=options)(x), expected)
    assert planned["traces"] == 2  # eager-only and onnxrt graphs differ; the third read the second's
    fused, decomposed, read_back = (code for code, _ in planned["graphs"])
    assert "_transformer_encoder_layer_fwd" in fused
    assert "_transformer_encoder_layer_fwd" not in decomposed
    assert read_back == decomposed


def _dynamo_graph(fn, *inputs, **compile_kwargs):
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=capture, **compile_kwargs)(*inputs)
    return captured[-1]


def _key(gm, inputs, decompose=False):
    return aten_cache.aten_graph_key(gm, inputs, frozenset(), decompose)


def test_the_key_is_stable_and_covers_what_shapes_the_trace(monkeypatch):
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    with torch.no_grad():
        gm, inputs = _dynamo_graph(torch.add, x, y)
        key = _key(gm, inputs)
        assert key is not None and _key(gm, inputs) == key
        assert _key(gm, [x, y.T]) != key  # strides
        assert _key(gm, [x, x]) != key  # two inputs, one storage
        assert _key(gm, [x.double(), y.double()]) != key
        assert _key(gm, inputs, decompose=True) != key
        assert aten_cache.aten_graph_key(gm, inputs, frozenset({0}), False) != key
    assert _key(gm, inputs) != key  # grad mode
    with torch.no_grad():
        monkeypatch.setattr(aten_cache, "versions", lambda: (("torch", "0.0"),))
        assert _key(gm, inputs) != key


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return x * self.scale


def _composite_op():
    lib = torch.library.Library("dispatch_test_composite", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CompositeImplicitAutograd")
    return lib, torch.ops.dispatch_test_composite.double.default


def test_graphs_the_key_cannot_pin_down_are_not_stored():
    x = torch.randn(3, 3, requires_grad=True)
    gm, inputs = _dynamo_graph(torch.sin, x)
    assert _key(gm, inputs) is None  # gradients: AOTAutograd's training path
    with torch.no_grad():
        key = _key(gm, inputs)
        assert isinstance(key, str) and len(key) == 64  # a SHA-256 hex digest: this graph is stored
        with torch.autocast("cpu"):
            assert _key(gm, inputs) is None
        dynamic = torch.randn(5, 3)
        torch._dynamo.mark_dynamic(dynamic, 0)
        assert _key(*_dynamo_graph(torch.sin, dynamic)) is None
        lib, op = _composite_op()  # decomposed by a Python body that may change
        assert _key(*_dynamo_graph(op, x.detach())) is None
        del lib
        module = torch.fx.symbolic_trace(_Scaled())  # holds its buffer: not an input
        assert _key(module, [x.detach()]) is None


def _retarget(record, replacement):
    nodes = [dict(n) for n in record["nodes"]]
    at = next(i for i, n in enumerate(nodes) if n["op"] == "call_function")
    nodes[at]["target"] = replacement
    return {**record, "nodes": nodes}


def _placeholder_named(record, name):
    nodes = [dict(n) for n in record["nodes"]]
    nodes[0]["target"] = name
    return {**record, "nodes": nodes}


def _argument(record, argument):
    nodes = [dict(n) for n in record["nodes"]]
    at = next(i for i, n in enumerate(nodes) if n["op"] == "call_function")
    nodes[at]["args"] = {"tuple": [argument]}
    return {**record, "nodes": nodes}


_SENTINEL = "__import__('builtins').setattr(__import__('builtins'), 'DISPATCH_PWNED', 1)"

TAMPERED = {
    "unknown op": lambda r: _retarget(r, "no_such_namespace::relu.default"),
    "python callable": lambda r: _retarget(r, "builtins.exec"),
    "code as a target": lambda r: _retarget(r, _SENTINEL),
    "code in a placeholder name": lambda r: _placeholder_named(r, f"x={_SENTINEL}"),
    "code as a node reference": lambda r: _argument(r, {"node": _SENTINEL}),
    "unknown argument kind": lambda r: _argument(r, {"pickle": "gASVAAAAAAAAAAAu"}),
    "old format (python source)": lambda r: {"imports": "import os", "code": "def forward(self): pass"},
}


@pytest.mark.parametrize("tamper", TAMPERED.values(), ids=TAMPERED.keys())
def test_an_entry_that_no_longer_loads_is_reported_once_and_rewritten(planned, monkeypatch, tamper):
    """An entry is data: an altered one (its digest recomputed, as anyone who can
    write the directory could) is a miss, and nothing in it runs."""
    import builtins

    monkeypatch.setattr(cache_module, "_WARNED", set())
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.compile(_layer_norm_mlp, backend="auto", options=EAGER)(x)
        root = Path(os.environ["DISPATCH_CACHE_DIR"])
        (entry,) = [p for p in (root / aten_cache.KIND).rglob("*") if p.is_file()]
        assert b"def forward" not in entry.read_bytes()  # no code is stored
        cache = ArtifactCache(root)
        record = cache.get_json(aten_cache.KIND, entry.name)
        cache.put_json(aten_cache.KIND, entry.name, tamper(record))
        torch._dynamo.reset()
        with pytest.warns(CacheWarning, match="does not load"):
            got = torch.compile(_layer_norm_mlp, backend="auto", options=EAGER)(x)
        torch.testing.assert_close(got, _layer_norm_mlp(x))
        assert not hasattr(builtins, "DISPATCH_PWNED")
        assert planned["traces"] == 2  # traced again
        assert json.loads(bytes(cache.get(aten_cache.KIND, entry.name))) == record  # and rewritten
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            torch.compile(_layer_norm_mlp, backend="auto", options=EAGER)(x)
    assert planned["traces"] == 2


def _with_constant(record, name, constant):
    nodes = [dict(n) for n in record["nodes"]]
    at = next(i for i, n in enumerate(nodes) if n["op"] == "call_function")
    nodes.insert(
        at, {"name": "c", "op": "get_attr", "target": name, "args": {"tuple": []}, "kwargs": {"dict": []}}
    )
    return {**record, "nodes": nodes, "values": [None, *record["values"]], "constants": {name: constant}}


_SCALAR = {"dtype": "float32", "shape": [], "device": "cpu", "data": [(0.5).hex()]}
BAD_CONSTANTS = {
    "code as a constant's name": (_SENTINEL, _SCALAR),
    "code as a constant's value": ("c0", {**_SCALAR, "data": [_SENTINEL]}),
    "code as a constant's dtype": ("c0", {**_SCALAR, "dtype": _SENTINEL}),
    "a constant past the limit": ("c0", {**_SCALAR, "shape": [65], "data": [1] * 65}),
    "no such constant": ("c0", None),
}


@pytest.mark.parametrize("name, constant", BAD_CONSTANTS.values(), ids=BAD_CONSTANTS.keys())
def test_a_malformed_constant_does_not_load(name, constant):
    import builtins

    graph = torch.fx.Graph()
    graph.output(graph.call_function(torch.ops.aten.relu.default, (graph.placeholder("x"),)))
    record = graph_data.graph_source(torch.fx.GraphModule({}, graph), all_values=False)._asdict()
    tampered = _with_constant(record, name, constant)
    if constant is None:
        tampered["constants"] = {}
    with pytest.raises((ValueError, KeyError, AttributeError)):
        graph_data.read_graph(graph_data.GraphSource(**tampered))
    assert not hasattr(builtins, "DISPATCH_PWNED")
    sound = graph_data.read_graph(graph_data.GraphSource(**_with_constant(record, "c0", _SCALAR)))
    assert sound.c0.item() == 0.5 and sound.c0.dtype == torch.float32


def test_values_are_restored_outside_the_callers_fake_mode():
    """The backend reads a graph back inside Dynamo's fake mode; each value made
    through that mode's dispatch cost 2-3 ms (timm's MobileNetV3: about 1 s a read)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        return torch.relu(x @ w).t()[1:], x.sum()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 3), torch.randn(3, 5))
    source = graph_data.graph_source(gm)
    expected = [graph_data.describe(n.meta["val"]) if "val" in n.meta else None for n in gm.graph.nodes]

    class CountingFakeMode(FakeTensorMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountingFakeMode.calls += 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    with CountingFakeMode():
        back = graph_data.read_graph(source)
    assert CountingFakeMode.calls == 0
    values = [n.meta.get("val") for n in back.graph.nodes]
    assert [graph_data.describe(v) if v is not None else None for v in values] == expected
    sliced = next(v for v in values if isinstance(v, torch.Tensor) and v.shape == (4, 4))
    assert isinstance(sliced, FakeTensor)
    assert (sliced.stride(), sliced.storage_offset()) == ((1, 5), 1)
