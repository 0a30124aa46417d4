"""kernels/ inside inductor's whole graph, kept only where the whole graph measured faster.

On CPU the kernels run in the Triton interpreter, so inductor's CPU compile of
the graph with the kernels' ops stands in for CUDA's; the timing is replaced,
since interpreted kernels are always slower."""

import pytest
import torch

import dispatch.autotune as autotune
from dispatch.cpu_contention import NOT_CACHED
from dispatch.record import recorder
from tests.conftest import needs_triton

pytestmark = needs_triton

TRIED = {"routes": ["inductor", "triton"], "autotune": True}


class SoftmaxNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.softmax(self.linear(x), -1) * 3) + 1


@pytest.fixture
def kernel_calls(monkeypatch):
    """How often each kernel ran, and a timing that says ``faster`` for the side given."""
    import dispatch.kernels.layer_norm as layer_norm
    import dispatch.kernels.softmax as softmax

    calls = {"softmax": 0, "layer_norm": 0, "timed": 0, "faster": "softmax, layer_norm"}
    for module, name in ((softmax, "softmax"), (layer_norm, "layer_norm")):
        kernel = getattr(module, name)

        def counted(*args, _kernel=kernel, _name=name, **kwargs):
            calls[_name] += 1
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    def timed(candidates, args, batch_s=None, batches=None):
        calls["timed"] += 1
        calls["candidates"] = sorted(candidates)
        return {name: 1e-3 if name == calls["faster"] else 2e-3 for name in candidates}

    monkeypatch.setattr(autotune, "median_call_s", timed)
    return calls


def _run(options, x):
    model = SoftmaxNorm().eval()
    with torch.no_grad(), recorder.recording() as records:
        compiled = torch.compile(model, backend="auto", options=options)
        out = compiled(x)
        again = compiled(x + 1)
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(again, model(x + 1))
    (record,) = records
    (region,) = record.regions
    return region


def test_kernels_measured_faster_run_inside_inductors_graph(kernel_calls):
    region = _run(TRIED, torch.randn(4, 16))
    assert region.route == "inductor"
    assert region.ops[:2] == ("triton:softmax", "triton:layer_norm")
    assert "triton" not in region.rejected
    assert region.measured == {
        "inductor": "2.00 ms",
        "triton (softmax, layer_norm inlined)": "1.00 ms",
        "triton (softmax inlined)": "2.00 ms",
        "triton (layer_norm inlined)": "2.00 ms",
    }
    # each family together and alone, timed in one trial
    assert kernel_calls["timed"] == 1
    assert kernel_calls["candidates"] == ["layer_norm", "plain", "softmax", "softmax, layer_norm"]
    # the check of each candidate against the plain graph (together, then alone),
    # then the first call and the second: the trial's timed calls are replaced
    assert kernel_calls["softmax"] == kernel_calls["layer_norm"] == 4


def test_a_family_that_wins_alone_is_inlined_alone(kernel_calls):
    kernel_calls["faster"] = "softmax"
    region = _run(TRIED, torch.randn(4, 16))
    assert region.ops[0] == "triton:softmax"
    assert "triton:layer_norm" not in region.ops
    assert "triton" not in region.rejected
    assert region.measured["triton (softmax inlined)"] == "1.00 ms"
    assert region.measured["triton (softmax, layer_norm inlined)"] == "2.00 ms"
    # layer norm ran in the checks only (together, alone), never in the calls served after
    assert kernel_calls["layer_norm"] == 2
    assert kernel_calls["softmax"] == 4


def test_a_family_with_wrong_numbers_loses_and_the_other_is_still_tried(kernel_calls, monkeypatch):
    import dispatch.kernels.softmax as softmax

    monkeypatch.setattr(softmax, "softmax", lambda x, *args, **kwargs: torch.zeros_like(x))
    kernel_calls["faster"] = "layer_norm"
    region = _run(TRIED, torch.randn(4, 16))  # outputs checked against eager there
    assert region.ops[0] == "triton:layer_norm"
    assert "triton:softmax" not in region.ops
    assert "softmax inlined in inductor's graph failed" in region.rejected["triton"]
    # the candidates holding the broken kernel were never timed
    assert kernel_calls["candidates"] == ["layer_norm", "plain"]


def test_kernels_measured_slower_leave_inductors_graph_as_it_is(kernel_calls):
    kernel_calls["faster"] = "plain"
    region = _run(TRIED, torch.randn(4, 16))
    assert not any(op.startswith("triton:") for op in region.ops)
    assert "measured slower as a whole graph" in region.rejected["triton"]
    assert region.measured["triton (softmax, layer_norm inlined)"] == "2.00 ms"
    assert kernel_calls["softmax"] == 2  # the checks against the plain graph, then never again


def test_a_warm_start_takes_the_stored_decision(kernel_calls):
    x = torch.randn(4, 16)
    first = _run(TRIED, x)
    torch._dynamo.reset()
    second = _run(TRIED, x)
    assert kernel_calls["timed"] == 1  # measured once, in the first compile
    assert second.measured == first.measured
    assert second.ops == first.ops


def test_a_trial_timed_on_busy_cpus_is_timed_again(kernel_calls, busy_cpus):
    x = torch.randn(4, 16)
    first = _run(TRIED, x)
    assert any(op.startswith("triton:") for op in first.ops), "the decision was not applied in its process"
    assert first.measured[NOT_CACHED].startswith("(timed while other work held the CPUs")
    torch._dynamo.reset()
    _run(TRIED, x)
    assert kernel_calls["timed"] == 2, "a trial timed on busy CPUs was read from the cache"


def test_kernels_the_decomposition_cannot_take_are_left_to_inductor(kernel_calls):
    def strided(x):
        return torch.softmax(x.t(), -1)  # a transposed input: not rows the kernel reads

    x = torch.randn(8, 4)
    with torch.no_grad(), recorder.recording() as records:
        out = torch.compile(strided, backend="auto", options=TRIED)(x)
    torch.testing.assert_close(out, strided(x))
    assert kernel_calls["timed"] == 0 and kernel_calls["softmax"] == 0
    assert not records[0].regions[0].measured


def test_without_autotune_no_kernel_is_tried(kernel_calls):
    region = _run({"routes": ["inductor", "triton"]}, torch.randn(4, 16))
    assert kernel_calls["timed"] == 0 and kernel_calls["softmax"] == 0
    assert not region.measured and "triton" not in region.measured


@pytest.mark.parametrize("faster", ["plain", "layer_norm"])
def test_a_warm_start_compiles_only_the_families_that_won(kernel_calls, monkeypatch, faster):
    import dispatch.inductor_baseline as inductor_baseline

    kernel_calls["faster"] = faster
    built = []
    tables = inductor_baseline.kernel_decompositions

    def counted(used, families):
        built.append(tuple(families))
        return tables(used, families)

    monkeypatch.setattr(inductor_baseline, "kernel_decompositions", counted)
    x = torch.randn(4, 16)
    first = _run(TRIED, x)
    assert built == [("softmax", "layer_norm"), ("softmax",), ("layer_norm",)]
    built.clear()
    torch._dynamo.reset()
    second = _run(TRIED, x)
    # the second compile read the decision: inductor's graph, and the winner's only
    assert built == ([] if faster == "plain" else [("layer_norm",)])
    assert second.rejected.get("triton") == first.rejected.get("triton")
    assert second.measured == first.measured
    assert second.ops == first.ops
