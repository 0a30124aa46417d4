"""Measured routing: candidates are compiled, checked against eager and timed on
real inputs; the fastest correct one wins, the decision is cached."""

import pytest
import torch

import dispatch
import dispatch.autotune as autotune
from tests.models import MLP
from tests.test_fallback import INPUTS, pointwise

TUNED = {"routes": ["demo", "eager"], "autotune": True}


def _check(compiled):
    with torch.no_grad():
        for g, e in zip(compiled(*INPUTS), pointwise(*INPUTS)):
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("demo", ["slow"], indirect=True)
def test_the_faster_route_wins_and_the_slower_says_by_how_much(demo):
    with torch.no_grad():
        explanation = dispatch.explain(pointwise, *INPUTS, options=TUNED)
    (region,) = explanation.regions
    assert region.route == "eager"
    assert set(region.measured) == {"demo", "eager"}
    assert region.rejected["demo"].startswith("slower by measurement:")
    assert "Measured:" in str(explanation)
    _check(torch.compile(pointwise, backend="auto", options=TUNED))


@pytest.mark.parametrize(
    ("demo", "why"),
    [("wrong", "differs from eager"), ("compile-error", "demo compiler exploded")],
    indirect=["demo"],
)
def test_a_wrong_or_failing_candidate_is_never_chosen_and_says_why(demo, why):
    with torch.no_grad():
        explanation = dispatch.explain(pointwise, *INPUTS, options=TUNED)
    (region,) = explanation.regions
    assert region.route == "eager"
    assert why in region.measured["demo"]
    _check(torch.compile(pointwise, backend="auto", options=TUNED))


def test_the_budget_bounds_the_measuring(demo, monkeypatch):
    monkeypatch.setattr(autotune, "BUDGET_S", 0.0)
    with torch.no_grad():
        explanation = dispatch.explain(pointwise, *INPUTS, options=TUNED)
    (region,) = explanation.regions
    assert all("budget" in line for line in region.measured.values()), region.measured
    assert region.route == "demo"  # nothing measured: the planned chain runs
    _check(torch.compile(pointwise, backend="auto", options=TUNED))


@pytest.mark.parametrize("demo", ["slow"], indirect=True)
def test_a_second_compile_reads_the_decision_and_measures_nothing(demo):
    with torch.no_grad():
        dispatch.explain(pointwise, *INPUTS, options=TUNED)
        compiles = demo.compiles
        explanation = dispatch.explain(pointwise, *INPUTS, options=TUNED)
    (region,) = explanation.regions
    assert region.route == "eager"
    assert demo.compiles == compiles  # the loser is not even compiled again
    assert all(line.endswith("(cached)") for line in region.measured.values())


def test_measuring_refuses_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(2)
    with pytest.raises(RuntimeError, match="real inputs only"):
        autotune.measure(["eager"], lambda route: None, lambda: None, [fake])


@torch.no_grad()
def test_cpu_inference_candidates_include_inductor():
    model = MLP(width=32, depth=3).eval()
    x = torch.randn(16, 32)
    explanation = dispatch.explain(model, x, options={"autotune": True})
    (region,) = explanation.regions
    assert set(region.measured) == {"onnxrt", "inductor", "eager"}
    assert region.route == min(
        (r for r in region.measured if "µs" in region.measured[r] or "ms" in region.measured[r]),
        key=lambda r: _seconds(region.measured[r]),
    )
    torch.testing.assert_close(
        torch.compile(model, backend="auto", options={"autotune": True})(x), model(x), rtol=1e-4, atol=1e-4
    )


def _seconds(line: str) -> float:
    value, unit = line.split()[:2]
    return float(value) * (1e-6 if unit == "µs" else 1e-3)


def split_by_tanh(x, y):
    """Two demo regions with an op between them that only eager runs."""
    return torch.relu(torch.tanh(torch.relu(x) + y)) * 2


class _FakeClock:
    """A clock for ``median_call_s``: sleeping idles the machine, and a candidate's
    first call after that pays for waking its threads."""

    def __init__(self) -> None:
        self.now = 0.0
        self.idle = True

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.idle = True

    def candidate(self, steady_s: float, wake_s: float):
        def call(*args):
            self.now += steady_s + (wake_s if self.idle else 0.0)
            self.idle = False

        return call


def test_measuring_times_back_to_back_calls_not_the_wake_up_after_a_pause(monkeypatch):
    # Measured here: straight after the pause between batches, the 1024-wide MLP's
    # eager took 3x its back-to-back time, and onnxrt lost to eager by chance.
    clock = _FakeClock()
    monkeypatch.setattr(autotune, "time", clock)
    fast_but_slow_to_wake = clock.candidate(steady_s=1e-3, wake_s=20e-3)
    slower_always = clock.candidate(steady_s=2e-3, wake_s=0.0)
    seconds = autotune.median_call_s({"a": fast_but_slow_to_wake, "b": slower_always}, [])
    assert seconds["a"] == pytest.approx(1e-3)
    assert seconds["b"] == pytest.approx(2e-3)


def _counted(clock: _FakeClock, steady_s: float, counts: dict[str, int], name: str):
    call = clock.candidate(steady_s=steady_s, wake_s=0.0)

    def counted(*args):
        counts[name] = counts.get(name, 0) + 1
        call(*args)

    return counted


def test_calls_of_20_ms_or_more_are_timed_over_three_batches(monkeypatch):
    # A 12-layer BERT (2x128, 140-170 ms a call) spent 11 s of its 37 s first call
    # in the whole-graph check's seven batches of three calls per candidate.
    clock = _FakeClock()
    monkeypatch.setattr(autotune, "time", clock)
    counts: dict[str, int] = {}
    long = {"a": _counted(clock, 30e-3, counts, "a"), "b": _counted(clock, 21e-3, counts, "b")}
    seconds = autotune.median_call_s(long, [])
    woken_batches = autotune.LONG_CALL_BATCHES * (1 + 1)
    assert counts == {
        "a": autotune.WARMUP_CALLS + 1 + woken_batches,
        "b": autotune.WARMUP_CALLS + 1 + woken_batches,
    }
    assert seconds == {"a": pytest.approx(30e-3), "b": pytest.approx(21e-3)}


def test_one_short_candidate_keeps_every_batch(monkeypatch):
    # Batches are taken in turn: a 1 ms candidate needs all seven, and the long one
    # beside it runs them too.
    clock = _FakeClock()
    monkeypatch.setattr(autotune, "time", clock)
    counts: dict[str, int] = {}
    autotune.median_call_s(
        {"long": _counted(clock, 30e-3, counts, "long"), "short": _counted(clock, 1e-3, counts, "short")}, []
    )
    per_batch = autotune.REWARM_CALLS + 1  # the long one: one call fills a 30 ms batch
    assert counts["long"] == autotune.WARMUP_CALLS + 1 + autotune.BATCHES * per_batch


def _fake_timing(monkeypatch, fast: set[str]) -> list[set[str]]:
    """Time every candidate named in ``fast`` at 1 ms and the others at 2 ms;
    returns the candidate sets that were timed."""
    timed: list[set[str]] = []

    def median_call_s(candidates, args, batch_s=None, batches=None):
        timed.append(set(candidates))
        for fn in candidates.values():
            fn(*args)
        return {name: 1e-3 if name in fast else 2e-3 for name in candidates}

    monkeypatch.setattr(autotune, "median_call_s", median_call_s)
    return timed


def _whole_graph_timings(timed: list[set[str]]) -> int:
    return sum(1 for names in timed if "all eager" in names)


SPLIT_OPTIONS = {**TUNED, "min_region_size": 1}


def _explain_split(monkeypatch, fast: set[str]):
    """``split_by_tanh`` explained under a fake timer; asserts one whole-graph timing."""
    timed = _fake_timing(monkeypatch, fast)
    explanation = dispatch.explain(split_by_tanh, *INPUTS, options=SPLIT_OPTIONS)
    assert _whole_graph_timings(timed) == 1
    return timed, explanation


@torch.no_grad()
def test_regions_faster_alone_but_slower_together_move_to_eager(demo, monkeypatch):
    timed, explanation = _explain_split(monkeypatch, fast={"demo", "all eager"})
    assert [r.route for r in explanation.regions] == ["eager"] * 3
    moved = [r for r in explanation.regions if r.rejected["demo"].startswith("slower as a whole graph")]
    assert len(moved) == 2
    for region in explanation.regions:
        assert region.measured["whole graph"] == "as routed 2.00 ms, all eager 1.00 ms"

    compiled = torch.compile(split_by_tanh, backend="auto", options=SPLIT_OPTIONS)
    # a new compile: it reads the cached decision
    compiles = demo.compiles
    torch.testing.assert_close(compiled(*INPUTS), split_by_tanh(*INPUTS))
    assert demo.compiles == compiles, "a warm start compiled a route the cached decision moved to eager"
    calls = demo.calls
    torch.testing.assert_close(compiled(*INPUTS), split_by_tanh(*INPUTS))
    assert demo.calls == calls, "a region moved to eager still ran on demo"
    assert _whole_graph_timings(timed) == 1, "the cached whole-graph decision was measured again"


@torch.no_grad()
def test_regions_faster_together_keep_their_routes(demo, monkeypatch):
    _, explanation = _explain_split(monkeypatch, fast={"demo", "as routed"})
    assert sorted(r.route for r in explanation.regions) == ["demo", "demo", "eager"]
    assert all(
        r.measured["whole graph"] == "as routed 1.00 ms, all eager 2.00 ms" for r in explanation.regions
    )
    assert "whole graph as routed 1.00 ms" in str(explanation)
