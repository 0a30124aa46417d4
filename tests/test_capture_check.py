"""A small captured CUDA inference graph, and a bfloat16 CPU graph on inductor,
is timed on its first call against the graph as Dynamo traced it
(``dispatch/capture_check.py``). Without a GPU, the capture is stood in for:
CPU graphs take the CUDA lead path (one inductor compile, its region recorded
as captured) and a fake clock decides."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import dispatch
import dispatch.capture_check as capture_check
from dispatch.capture_check import AS_TRACED, CAPTURED, INDUCTOR, can_time
from dispatch.inductor_lead import InductorLead

# CPU inference leads with onnxrt; the route order CUDA inference has.
OPTIONS = {"routes": ["inductor", "cudagraphs", "eager"]}


def small():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()


@pytest.fixture
def captured_lead(monkeypatch):
    """CPU inference graphs compile as CUDA inference does: inductor whole, captured;
    every graph counts as small, whatever this busy machine's clock says."""
    import dispatch.backend as backend
    import dispatch.inductor_baseline as baseline

    monkeypatch.setattr(capture_check, "TIMED_BELOW_S", float("inf"))

    monkeypatch.setattr(backend, "inductor_lead", lambda config, gm, inputs: InductorLead(capture=True))
    monkeypatch.setattr(
        baseline,
        "_with_capture",
        lambda region, cudagraphs, compiled, wanted: (
            replace(region, route="cudagraphs", inner_route="inductor") if wanted else region
        ),
    )


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, CAPTURED: 2.0}], indirect=True)
@torch.no_grad()
def test_a_small_graph_runs_as_traced_where_that_beat_its_capture(captured_lead, timed, compiles):
    model, x = small(), torch.randn(8, 16)
    explanation = dispatch.explain(model, x, options=OPTIONS)
    assert timed == [{CAPTURED, AS_TRACED}]
    (region,) = explanation.regions
    assert (region.route, region.planned_route) == ("eager", "cudagraphs")
    assert region.rejected["cudagraphs"].startswith(
        "slower as a whole graph by measurement: captured 2.00 ms"
    )
    assert region.measured["whole graph"] == "captured 2.00 ms, as traced (eager) 1.00 ms"
    torch._dynamo.reset()
    compiles[0] = 0
    compiled = torch.compile(model, backend="auto", options=OPTIONS)
    torch.testing.assert_close(compiled(x), model(x))
    assert compiles[0] == 0  # the stored decision: nothing compiles, nothing is timed again
    assert timed == [{CAPTURED, AS_TRACED}]
    assert [r.route for r in dispatch.explain(model, x, options=OPTIONS).regions] == ["eager"]


@pytest.mark.parametrize("timed", [{CAPTURED: 1.0, AS_TRACED: 2.0}], indirect=True)
@torch.no_grad()
def test_a_small_graph_stays_captured_where_the_capture_won(captured_lead, timed):
    model, x = small(), torch.randn(8, 16)
    explanation = dispatch.explain(model, x, options=OPTIONS)
    (region,) = explanation.regions
    assert (region.route, region.inner_route) == ("cudagraphs", "inductor")
    assert region.measured["whole graph"] == "captured 1.00 ms, as traced (eager) 2.00 ms"
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="auto", options=OPTIONS)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(timed) == 1  # stored: a second compile times nothing
    assert dispatch.explain(model, x, options=OPTIONS).regions[0].route == "cudagraphs"


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0}], indirect=True)
@torch.no_grad()
def test_a_graph_that_runs_long_eagerly_stays_captured_untimed(captured_lead, timed, monkeypatch):
    monkeypatch.setattr(capture_check, "TIMED_BELOW_S", 0.0)
    model, x = small(), torch.randn(8, 16)
    (region,) = dispatch.explain(model, x, options=OPTIONS).regions
    assert timed == []
    assert region.route == "cudagraphs" and "whole graph" not in region.measured


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0}], indirect=True)
@torch.no_grad()
def test_a_forced_route_is_not_timed(captured_lead, timed, monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "inductor")
    dispatch.explain(small(), torch.randn(8, 16), options=OPTIONS)
    assert timed == []


def test_graphs_that_mutate_or_draw_random_numbers_are_not_timed():
    from torch.fx.experimental.proxy_tensor import make_fx

    def pure(x):
        return x.sin() + 1

    def mutating(x, buffer):
        buffer.add_(1)
        return x + buffer

    def drawing(x):
        return x + torch.rand_like(x)

    x = torch.randn(4)
    assert can_time(make_fx(pure)(x))
    assert not can_time(make_fx(mutating)(x, torch.zeros(4)))
    assert not can_time(make_fx(drawing)(x))


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_attention_is_timed_only_where_it_draws_no_dropout(dropout):
    """Attention kernels are tagged as drawing random numbers for their dropout:
    at 0, in inference, they draw none, and a transformer's graph can be timed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout)

    q = torch.randn(1, 2, 8, 16)
    aten = make_fx(attention, pre_dispatch=False)(q, q, q)
    seeded = [
        n
        for n in aten.graph.nodes
        if isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
    ]
    assert seeded  # the attention kernel itself carries the tag
    assert can_time(aten) == (dropout == 0.0)


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, CAPTURED: 2.0}], indirect=True)
@torch.no_grad()
def test_a_captured_program_that_differs_from_eager_keeps_serving_untimed(captured_lead, timed, monkeypatch):
    """The check never swaps a program on a failed comparison: without it the user
    would have run the captured program, and still does."""
    import dispatch.autotune as autotune

    def differs(expected, got):
        raise AssertionError("output 0 differs from eager")

    monkeypatch.setattr(autotune, "check_close", differs)
    (region,) = dispatch.explain(small(), torch.randn(8, 16), options=OPTIONS).regions
    assert region.route == "cudagraphs"
    assert timed == [set()]  # neither candidate passed the comparison: nothing timed


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0}], indirect=True)
@torch.no_grad()
def test_a_graph_with_a_symbolic_size_is_not_timed(captured_lead, timed):
    """One shape's timing need not hold for the others."""
    (region,) = dispatch.explain(small(), torch.randn(8, 16), options=OPTIONS, dynamic=True).regions
    assert timed == []
    assert region.route == "cudagraphs"


@pytest.fixture
def aotautograd_cache_on():
    """On, as torch leaves it (the suite turns it off, tests/conftest.py)."""
    with torch._functorch.config.patch(enable_autograd_cache=True):
        yield


def small_bfloat16():
    return small().to(torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
@torch.no_grad()
def test_a_bfloat16_cpu_graph_runs_as_traced_where_that_beat_inductor(timed, compiles):
    """CPU inference in bfloat16 leads with inductor; a graph that inductor runs
    slower than eager (timm's ResNet-18: 5.45 against 4.09 ms) runs as traced."""
    model, x = small_bfloat16()
    explanation = dispatch.explain(model, x)
    assert timed == [{INDUCTOR, AS_TRACED}]
    (region,) = explanation.regions
    assert (region.route, region.planned_route) == ("eager", "inductor")
    assert region.rejected["inductor"] == (
        "slower as a whole graph by measurement: inductor 2.00 ms, as traced (eager) 1.00 ms"
    )
    torch._dynamo.reset()
    compiles[0] = 0
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x))
    assert compiles[0] == 0  # the stored decision: nothing compiles, nothing is timed again
    assert len(timed) == 1


@pytest.mark.parametrize("timed", [{INDUCTOR: 1.0, AS_TRACED: 2.0}], indirect=True)
@torch.no_grad()
def test_a_bfloat16_cpu_graph_stays_on_inductor_where_it_won(
    timed, compiles, aotautograd_cache_on, monkeypatch, tmp_path
):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # no other test's entries
    model, x = small_bfloat16()
    (region,) = dispatch.explain(model, x).regions
    assert timed == [{INDUCTOR, AS_TRACED}]
    assert region.route == "inductor"
    assert region.measured["whole graph"] == "inductor 1.00 ms, as traced (eager) 2.00 ms"
    torch._dynamo.reset()
    compiles[0] = 0
    # A warm start: AOTAutograd's cache serves the graph, the stored decision its times.
    (warm,) = dispatch.explain(model, x).regions
    assert compiles[0] == 0 and len(timed) == 1
    assert warm.route == "inductor"
    assert warm.measured["whole graph"] == "inductor 1.00 ms, as traced (eager) 2.00 ms"


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0}], indirect=True)
@torch.no_grad()
def test_a_bfloat16_cpu_graph_that_runs_long_eagerly_stays_on_inductor_untimed(timed, monkeypatch):
    monkeypatch.setattr(capture_check, "CPU_TIMED_BELOW_S", 0.0)
    model, x = small_bfloat16()
    (region,) = dispatch.explain(model, x).regions
    assert timed == []
    assert region.route == "inductor" and "whole graph" not in region.measured


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0}], indirect=True)
@torch.no_grad()
def test_a_cpu_graph_whose_first_eager_run_is_long_runs_eagerly_once(timed, monkeypatch):
    """A bfloat16 ResNet-18 (8 images of 224²) took 9.4 s a run eagerly on an AVX2
    machine: the check ran it twice to learn that it was too long to time."""
    monkeypatch.setattr(capture_check, "CPU_TIMED_BELOW_S", 1e-9)
    eager_runs = []  # the check synchronises after each of its eager runs
    monkeypatch.setattr(capture_check.autotune, "synchronizer", lambda args: lambda: eager_runs.append(1))
    model, x = small_bfloat16()
    (region,) = dispatch.explain(model, x).regions
    assert timed == []
    assert len(eager_runs) == 1
    assert region.route == "inductor" and "whole graph" not in region.measured
