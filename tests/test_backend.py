"""End to end through torch.compile(backend="auto") on CPU."""

import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import dispatch
from tests.models import MLP, CustomOpMLP, GroupedQueryAttention, SpectralFilter, scaled_tanh


def test_backend_is_registered_and_listed():
    from torch._dynamo.backends.registry import lookup_backend

    assert "auto" in torch._dynamo.list_backends()
    assert lookup_backend("auto") is dispatch.auto


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "auto"]
    assert ep.value == "dispatch:auto"


def test_compile_by_name_without_importing_dispatch():
    code = (
        "import sys, torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    torch.testing.assert_close(torch.compile(m, backend='auto')(x), m(x))\n"
        "print('dispatch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True")  # loaded through the entry point


@torch.no_grad()
def test_inference_mlp_runs_on_onnxrt_and_matches_eager():
    model = MLP().eval()
    x = torch.randn(8, 16)
    explanation = dispatch.explain(model, x)
    assert [r.route for r in explanation.regions] == ["onnxrt"]
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(x * 2), model(x * 2), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_custom_op_runs_eager_between_onnxrt_regions():
    model = CustomOpMLP().eval()
    x = torch.randn(8, 16)
    explanation = dispatch.explain(model, x)
    # planned: timed whole, the graph may run on other routes (tests/test_cut_graphs.py)
    routes = [r.planned_route or r.route for r in explanation.regions]
    assert sorted(routes) == ["eager", "onnxrt", "onnxrt"]
    (eager,) = [r for r in explanation.regions if r.planned_route is None and r.route == "eager"]
    assert eager.ops == ("dispatch_tests.scaled_tanh.default",)
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_bool_outputs_of_onnxrt_regions_stay_bool():
    # ORT hands bool tensors over DLPack as uint8; a uint8 mask would break the
    # eager region's where() and reach the caller with the wrong dtype.
    def masked(x):
        mask = x > 0
        return mask, torch.where(mask, torch.ops.dispatch_tests.scaled_tanh(x, 0.5), x * 2)

    x = torch.randn(8, 16)
    options = {"routes": ["onnxrt", "eager"]}  # no inductor timed against the cut graph
    assert "onnxrt" in [r.route for r in dispatch.explain(masked, x, options=options).regions]
    mask, out = torch.compile(masked, backend="auto", options=options)(x)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, x > 0)
    torch.testing.assert_close(out, masked(x)[1])


def test_graph_breaks_match_dynamo_explain():
    def fn(x):
        y = torch.relu(x) * 2
        print("graph break")
        return torch.sigmoid(y) + 1

    x = torch.randn(4, 4)
    with torch.no_grad():
        ours = dispatch.explain(fn, x)
        theirs = torch._dynamo.explain(fn)(x)
    assert ours.graph_count == theirs.graph_count == 2
    assert ours.graph_break_count == theirs.graph_break_count == 1
    assert ours.op_count == theirs.op_count
    assert {r.graph for r in ours.regions} == {0, 1}
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="auto")(x), fn(x))


def test_explain_says_why_no_graph_reached_auto():
    """Dynamo runs a frame that holds an ``nn.LSTM`` eagerly (``allow_rnn`` is off by
    default) and hands ``auto`` no graph; explain says so, with Dynamo's own reason
    and hint, instead of an empty table."""

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    with torch.no_grad():
        explanation = dispatch.explain(Tagger().eval(), torch.randn(2, 5, 8))
    assert explanation.graph_count == 0 and explanation.graph_break_count == 0
    (reason,) = explanation.frames_run_eagerly
    assert "LSTM" in reason and "allow_rnn" in reason
    text = str(explanation)
    assert "No graph reached auto" in text and "allow_rnn" in text
    assert explanation.to_dict()["frames_run_eagerly"] == [reason]


def test_explain_lists_no_eager_frames_for_a_graph_break():
    def fn(x):
        y = x.relu()
        print("", end="")
        return y.sigmoid()

    with torch.no_grad():
        explanation = dispatch.explain(fn, torch.randn(4))
    assert explanation.graph_count == 2 and explanation.frames_run_eagerly == []
    assert "No graph reached auto" not in str(explanation)


def test_explain_with_backend_auto_works():
    from torch._dynamo.backends.debugging import ExplainWithBackend

    explainer = ExplainWithBackend("auto")
    model = MLP().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = torch.compile(model, backend=explainer)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert explainer.output().graph_count == 1


def test_explanation_table_and_dict():
    import json

    with torch.no_grad():
        explanation = dispatch.explain(CustomOpMLP().eval(), torch.randn(4, 16))
    text = str(explanation)
    assert "Graph Count: 1" in text and "onnxrt" in text and "scaled_tanh" in text
    assert "cannot translate" in text
    data = json.loads(explanation.to_json())
    assert data["graph_count"] == 1 and len(data["regions"]) == 3


def test_mixed_dtypes_with_inplace_ops():
    def fn(a, b):
        c = a.clone()
        c.mul_(2).add_(1)
        d = b.double() * 3
        d.sub_(a.double())
        b.add_(1)  # mutates an input
        return c, d, c.to(torch.float64) + d

    a = torch.randn(4, 4)
    b = torch.randn(4, 4, dtype=torch.float64)
    a_ref, b_ref = a.clone(), b.clone()
    with torch.no_grad():
        expected = fn(a_ref, b_ref)
        got = torch.compile(fn, backend="auto")(a, b)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(b, b_ref)  # the input mutation happened, once


def test_training_gradients_equal_eager():
    torch.manual_seed(0)
    model = MLP(width=8, depth=2)
    reference = MLP(width=8, depth=2)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="auto")
    compiled(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_training_with_custom_op_runs_backward_through_it():
    torch.manual_seed(0)
    model = CustomOpMLP(width=8)
    reference = CustomOpMLP(width=8)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="auto", options={"routes": ["eager"]})
    compiled(x).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_unexpected_backend_kwargs_raise_config_error():
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="auto", mode="max-autotune")
    with pytest.raises(dispatch.ConfigError, match="mode"):
        compiled(torch.randn(1, 2))


def test_available_routes_and_doctor():
    routes = dispatch.available_routes()
    assert routes["eager"]["available"] is True
    assert set(routes) >= {"eager", "inductor", "onnxrt"}
    out = subprocess.run([sys.executable, "-m", "dispatch"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "onnxrt" in out.stdout and "eager" in out.stdout


def test_doctor_json_uses_null_for_missing_values():
    import json

    out = subprocess.run(
        [sys.executable, "-m", "dispatch", "--json"], capture_output=True, text=True, timeout=120
    )
    report = json.loads(out.stdout)
    values = [v for info in report["routes"].values() for v in info.values()] + list(
        report["machine"].values()
    )
    assert "-" not in values and "" not in values


def test_doctor_help_has_no_markup(capsys):
    from dispatch.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def test_no_warning_on_the_happy_path():
    model = MLP().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.stitch.FallbackWarning)
        with torch.no_grad():
            torch.compile(model, backend="auto")(torch.randn(2, 16))


@torch.no_grad()
def test_weights_changed_in_place_are_picked_up():
    # onnxrt bakes parameters into the ONNX model; changing one in place must
    # re-export the region rather than run stale weights.
    model = MLP().eval()
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    model.net[0].weight.mul_(2)
    model.net[2].bias.add_(1)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    model.load_state_dict(MLP().state_dict())
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_conv_batchnorm_eval_matches_eager():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    ).eval()
    model[1].running_mean.uniform_(-1, 1)
    model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 16, 16)
    explanation = dispatch.explain(model, x)
    assert [r.route for r in explanation.regions] == ["onnxrt"]
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x), rtol=1e-4, atol=1e-4)


def test_dispatch_log_info_reports_each_graph(monkeypatch, caplog):
    monkeypatch.setenv("DISPATCH_LOG", "info")
    with caplog.at_level("INFO", logger="dispatch"), torch.no_grad():
        torch.compile(lambda x: x.relu() * 2, backend="auto")(torch.randn(3))
    # Outside explain, graphs are numbered across the process.
    assert any(
        re.search(r"graph \d+ \(inference\): onnxrt_cpu_0 -> onnxrt", r.getMessage()) for r in caplog.records
    )


def test_dispatch_log_prints_without_logging_configured():
    code = (
        "import torch, dispatch\n"
        "with torch.no_grad():\n"
        "    torch.compile(lambda x: x.relu() * 2, backend='auto')(torch.randn(3))\n"
    )
    env = {**os.environ, "DISPATCH_LOG": "info"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dispatch: graph 0 (inference)" in out.stderr


class GraphBreak(torch.nn.Module):
    """Two Dynamo graphs, a Python branch on ``.item()`` between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)

    def forward(self, x):
        h = self.a(x).relu()
        if h.mean().item() > 0:
            h = h * 2
        return self.b(h)


@pytest.mark.parametrize("rows, one_thread", [(64, True), (512, False)])
def test_ort_workers_stop_spinning_when_a_run_returns(monkeypatch, torch_threads, rows, one_thread):
    """Spinning ORT workers took the cores from the Python between Dynamo graphs
    (a model with graph breaks ran 20x slower than eager); every session, a lone
    region's too, stops its workers spinning as its run returns. A region with
    too little work for a thread pool (2 MFLOP at 64 rows) runs on one thread;
    17 MFLOP at 512 rows is tried on one thread and on the pool (``onnx_threads.py``)."""
    import onnxruntime

    from dispatch.call_periods import BLOCK_LENGTH

    opened = []
    real = onnxruntime.InferenceSession

    def recording(model, options=None, **kwargs):
        opened.append(options)
        return real(model, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    torch_threads(2)  # at one, no pool is tried
    model, x = GraphBreak().eval(), torch.randn(rows, 128)
    compiled = torch.compile(model, backend="auto")
    with torch.no_grad():
        for _ in range(2 * BLOCK_LENGTH + 1):  # a block of calls on each side of a trial
            torch.testing.assert_close(compiled(x), model(x))
    for options in opened:
        assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    # One lone region in each Dynamo graph, on one thread from its first call;
    # the trial's pool opens at its first block of calls.
    sides = [options.intra_op_num_threads == 1 for options in opened]
    if one_thread:
        assert sides == [True, True]
    else:
        assert sides[0] and sorted(sides) == [False, False, True, True]


def test_a_mid_sized_region_keeps_the_thread_count_measured_in_place(
    monkeypatch, caplog, routed_throughout, torch_threads
):
    """17 MFLOP between torch ops: the first calls run on one thread and on ORT's
    pool (torch's two threads) in turn, every output right, and each region then
    keeps one of them."""
    import onnxruntime

    from dispatch.call_periods import BLOCK_LENGTH
    from dispatch.routes.onnx_threads import TRIAL_BLOCKS

    threads = []
    real = onnxruntime.InferenceSession

    def recording(model, options=None, **kwargs):
        threads.append(options.intra_op_num_threads)
        return real(model, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    monkeypatch.setenv("DISPATCH_LOG", "info")
    torch_threads(2)
    model, x = GraphBreak().eval(), torch.randn(512, 128)
    compiled = torch.compile(model, backend="auto")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="dispatch"):
        for _ in range(2 * BLOCK_LENGTH * TRIAL_BLOCKS + 2):
            torch.testing.assert_close(compiled(x), model(x))
    assert sorted(threads) == [1, 1, 2, 2]  # per Dynamo graph: one thread, then the pool
    kept = [r.getMessage() for r in caplog.records if "measured in place" in r.getMessage()]
    assert len(kept) == 2, kept


def test_a_buffer_the_model_updates_is_not_baked_into_the_onnx_region(onnx_exports):
    """A baked weight that changes re-exports its region; a buffer the model
    itself updates on every call (a counter, running statistics) changed on
    every call, so every call exported again (250 ms against eager's 40 µs)."""

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return torch.relu(self.linear(x)) * self.calls

    model, reference = Counting().eval(), Counting().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="auto")
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(x), reference(x))
    assert float(model.calls) == float(reference.calls) == 4.0
    assert onnx_exports[0] == 1


def test_explain_leaves_other_compiled_functions_alone():
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    earlier = torch.compile(lambda x: x.sin() + 1, backend=counting)
    x = torch.randn(4)
    earlier(x)
    with torch.no_grad():
        explanation = dispatch.explain(lambda t: (t * 2).cos(), x)
        again = dispatch.explain(lambda t: (t * 2).cos(), x)
    earlier(x)
    assert len(compiles) == 1  # not recompiled: its cache survived explain
    assert explanation.graph_count == again.graph_count == 1 and explanation.regions

    def fn(t):
        return t.sigmoid() * 3

    with torch.no_grad():
        torch.compile(fn, backend="auto")(x)  # the user's own compile of the same function
        assert [r.route for r in dispatch.explain(fn, x).regions] == ["onnxrt"]


def test_explain_text_says_which_graph_each_note_is_about():
    def fn(x):
        y = scaled_tanh(torch.relu(x) + 1, 0.5)
        print("", end="")  # a graph break: two graphs whose regions share names
        return scaled_tanh(y.sigmoid() * 2, 0.5)

    with torch.no_grad():
        text = str(dispatch.explain(fn, torch.randn(4, 4)))
    assert "graph 0 eager_cpu_0 [inference]: onnxrt not chosen: the ONNX exporter cannot translate" in text
    assert "graph 1 eager_cpu_0 [inference]: onnxrt not chosen: the ONNX exporter cannot translate" in text
    assert "Dynamo Op Count" in text


def test_explain_text_gives_each_fallback_in_its_row_and_each_rule_once(monkeypatch):
    """A route the rule leaves out is said once, not once per region; a fallback is a
    column, not a note per region."""
    monkeypatch.delenv("DISPATCH_ROUTE", raising=False)

    def fn(x):
        y = torch.relu(x) + 1
        print("", end="")
        return y.sigmoid() * 2

    with torch.no_grad():
        text = str(dispatch.explain(fn, torch.randn(4, 4)))
    rows = [line.split() for line in text.splitlines() if line.startswith(("0 ", "1 "))]
    assert [(row[2], row[3], row[4]) for row in rows] == [("onnxrt_cpu_0", "onnxrt", "eager")] * 2
    assert "lower priority" not in text
    (left_out,) = [line for line in text.splitlines() if "it beat inductor there by measurement" in line]
    # triton runs CPU tensors here under TRITON_INTERPRET=1 (conftest); cudagraphs runs none.
    assert left_out.strip().startswith("inductor, triton: CPU inference:")
    (device,) = [line for line in text.splitlines() if line.strip().startswith("cudagraphs")]
    assert device.strip() == "cudagraphs: device cpu is not served by cudagraphs (it serves cuda)"


def _dynamo_graph(fn, x):
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=capture)(x)
    return captured[-1]


def _subtract_then_gelu(x):
    x.sub_(1)
    return torch.nn.functional.gelu(x) * 2


@torch.no_grad()
def test_an_all_eager_inference_graph_runs_as_dynamo_traced_it():
    """Where every region is eager, the Dynamo graph itself runs: the cost of a
    backend that does nothing, not AOTAutograd's wrapper and decomposed aten ops."""
    from dispatch.backend import auto

    x = torch.randn(4, 8)
    gm, inputs = _dynamo_graph(_subtract_then_gelu, x.clone())
    eager_only = auto(gm, inputs, options={"routes": ["eager"]})
    assert getattr(eager_only, "__self__", None) is gm
    mutated = x.clone()
    torch.testing.assert_close(eager_only(mutated)[0], _subtract_then_gelu(x.clone()))
    torch.testing.assert_close(mutated, x - 1)
    pytest.importorskip("onnxruntime")
    with_onnx = auto(gm, inputs, options={"routes": ["onnxrt", "eager"]})
    assert getattr(with_onnx, "__self__", None) is not gm


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "float_mask"])
@torch.no_grad()
def test_grouped_query_attention_runs_on_onnxrt(masked):
    # torchlib translated the CPU attention kernel without repeating the key and
    # value heads: ORT refused the model and LLaMA ran on eager, 2x inductor's time.
    model = GroupedQueryAttention().eval()
    x = torch.randn(2, 8, 32)
    args = (x, torch.randn(1, 1, 8, 8)) if masked else (x,)
    explanation = dispatch.explain(model, *args)
    (region,) = [r for r in explanation.regions if r.node_count]  # the output view stays eager
    assert region.route == "onnxrt"
    assert any("scaled_dot_product" in op for op in region.ops)
    compiled = torch.compile(model, backend="auto", options={"strict": True})
    torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_model_with_complex_values_inside_runs_without_a_fallback():
    # irfft's region took a complex64 input that ONNX Runtime cannot bind: it
    # failed on the first call and fell back to eager with a FallbackWarning.
    model = SpectralFilter().eval()
    x = torch.randn(4, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.stitch.FallbackWarning)
        out = torch.compile(model, backend="auto")(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
