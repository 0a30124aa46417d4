"""A CPU training graph, which leads with inductor, is timed on its first call as
a training step (forward and backward) against the graph as Dynamo traced it
(``dispatch/capture_check.py``), and runs as traced unless inductor's step is
``TRAINING_MARGIN`` faster. A fake clock decides; what the check must never do
is leave a trace: buffers updated once, ``.grad`` untouched, inputs as eager
leaves them."""

from __future__ import annotations

import copy

import pytest
import torch

import dispatch.capture_check as capture_check
from dispatch.capture_check import AS_TRACED, INDUCTOR
from dispatch.cpu_contention import NOT_CACHED
from dispatch.record import recorder

STEP = "training step (forward and backward)"
REAL_BAR = capture_check.TRAINING_TIMED_BELOW_S  # read before ``every_step_is_short`` patches it


@pytest.fixture(autouse=True)
def every_step_is_short(monkeypatch):
    """Every step counts as short enough to time, whatever this busy machine's clock says."""
    monkeypatch.setattr(capture_check, "TRAINING_TIMED_BELOW_S", float("inf"))


def with_batch_norm() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU()).train()


def one_step(model: torch.nn.Module, x: torch.Tensor, backend: str | None) -> tuple[torch.Tensor, list]:
    """One forward and backward of ``model`` (compiled by ``backend``, or eager), and
    the plans of the graphs it compiled."""
    fn = model if backend is None else torch.compile(model, backend=backend)
    with recorder.recording() as plans:
        out = fn(x)
        out.sum().backward()
    return out, list(plans)


def stepped_as_eager(model: torch.nn.Module, reference: torch.nn.Module, x: torch.Tensor) -> list:
    """One step of ``model`` under auto and of ``reference`` eagerly, asserted alike
    (outputs, state, gradients); the plans of the graphs auto compiled."""
    out, plans = one_step(model, x, "auto")
    expected, _ = one_step(reference, x, None)
    torch.testing.assert_close(out, expected)
    assert_same_state(model, reference)
    return plans


def assert_same_state(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, got), expected in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got, expected, msg=f"{name} differs from eager's")
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad differs from eager's")


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_a_training_step_runs_as_traced_where_that_beat_inductor(timed, compiles):
    """timm's ResNet-18 trained at 63.8 ms a step under inductor against 24.8 eagerly.
    The check's steps update batch norm's statistics each time: they are put back."""
    model, x = with_batch_norm(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    plans = stepped_as_eager(model, reference, x)
    assert timed == [{INDUCTOR, AS_TRACED}]
    assert int(model[1].num_batches_tracked) == 1
    regions = [r for p in plans for r in p.regions]
    assert [(p.kind, r.route, r.planned_route) for p in plans for r in p.regions] == [
        ("forward", "eager", "inductor"),
        ("backward", "eager", "inductor"),
    ]
    for region in regions:
        assert region.rejected["inductor"] == (
            f"not 5% faster than as traced over a {STEP} by measurement: "
            "inductor 2.00 ms, as traced (eager) 1.00 ms"
        )
    # A warm start: the stored decision, nothing compiled, nothing timed, the same step.
    torch._dynamo.reset()
    compiles[0] = 0
    warm = stepped_as_eager(model, reference, x)  # gradients of both steps, statistics updated twice
    assert compiles[0] == 0 and len(timed) == 1
    assert [r.route for p in warm for r in p.regions] == ["eager", "eager"]


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_a_step_timed_on_other_threads_is_timed_again(timed, torch_threads):
    model, x = with_batch_norm(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    torch_threads(2)
    stepped_as_eager(model, reference, x)
    for threads, timings in ((2, 1), (1, 2), (2, 2)):
        torch._dynamo.reset()
        torch_threads(threads)
        stepped_as_eager(model, reference, x)
        assert len(timed) == timings, f"on {threads} threads"


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_a_step_timed_on_busy_cpus_is_timed_again(timed, busy_cpus):
    model, x = with_batch_norm(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    plans = stepped_as_eager(model, reference, x)
    regions = [r for p in plans for r in p.regions]
    assert [r.route for r in regions] == ["eager", "eager"], "the decision was not applied in its process"
    assert all(f", {NOT_CACHED} (timed while" in " ".join(r.measured.values()) for r in regions)
    torch._dynamo.reset()
    stepped_as_eager(model, reference, x)
    assert len(timed) == 2, "a step timed on busy CPUs was read from the cache"


@pytest.mark.parametrize(
    "timed, route, inductor_ms",
    [
        ({INDUCTOR: 1.0, AS_TRACED: 2.0}, "inductor", "1.00 ms"),
        ({INDUCTOR: 1.96, AS_TRACED: 2.0}, "eager", "1.96 ms"),  # faster, but within the margin: a tie
    ],
    indirect=["timed"],
)
def test_a_training_step_stays_on_inductor_only_where_it_won_by_the_margin(timed, route, inductor_ms):
    model, x = with_batch_norm(), torch.randn(4, 8)
    plans = stepped_as_eager(model, copy.deepcopy(model), x)
    assert timed == [{INDUCTOR, AS_TRACED}]
    regions = [r for p in plans for r in p.regions]
    assert [r.route for r in regions] == [route, route]
    line = f"inductor {inductor_ms}, as traced (eager) 2.00 ms"
    assert [r.measured["whole graph"] for r in regions] == [line, line]


class SlowMachineClock:
    """``time`` for the check: each eager step it times takes 300 ms."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.15  # a step is the time between two readings
        return self.now


def test_a_slow_machine_s_long_step_is_timed(monkeypatch):
    """timm's ResNet-18 (2 images of 64²) took 90-120 ms a step eagerly on an AVX2
    machine, 21-37 on an AVX-512 one, and 180 under inductor on the first: a bar of
    100 ms kept inductor there untimed. A step that long is timed (in few batches:
    ``median_call_s`` takes three for calls of 20 ms or more, test_autotune.py)."""
    monkeypatch.setattr(capture_check, "TRAINING_TIMED_BELOW_S", REAL_BAR)
    monkeypatch.setattr(capture_check, "time", SlowMachineClock())
    timed = []

    def median_call_s(candidates, args, batch_s=None, batches=None):
        timed.append(set(candidates))
        for fn in candidates.values():
            fn(*args)
        return {INDUCTOR: 0.18, AS_TRACED: 0.1}

    monkeypatch.setattr(capture_check.autotune, "median_call_s", median_call_s)
    model, x = with_batch_norm(), torch.randn(4, 8)
    plans = stepped_as_eager(model, copy.deepcopy(model), x)
    assert timed == [{INDUCTOR, AS_TRACED}]
    assert [r.route for p in plans for r in p.regions] == ["eager", "eager"]


class MutatesItsInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.linear(x).relu()


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_a_training_graph_that_mutates_an_input_requiring_grad_is_not_timed(timed):
    """The check could not put such an input back: a timed step would double it again."""
    torch.manual_seed(0)
    model = MutatesItsInput()
    reference = copy.deepcopy(model)
    leaf = torch.randn(4, 8, requires_grad=True)
    x, y = leaf * 1, leaf.detach().clone().requires_grad_() * 1
    out = torch.compile(model, backend="auto")(x)
    out.sum().backward()
    expected = reference(y)
    expected.sum().backward()
    assert timed == []
    torch.testing.assert_close(x, y)  # doubled once
    torch.testing.assert_close(out, expected)
    assert_same_state(model, reference)


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_a_training_graph_with_dropout_draws_what_eager_draws(timed):
    """timm's classifiers train with dropout. The check's steps draw masks of their
    own; the caller's generator is put back, so that the first call, run as traced,
    draws eager's mask and the caller's next draw is eager's too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    reference, x = copy.deepcopy(model), torch.randn(4, 8)
    torch.manual_seed(1)
    out, plans = one_step(model, x, "auto")
    after = torch.rand(4)
    torch.manual_seed(1)
    expected, _ = one_step(reference, x, None)
    assert timed == [{INDUCTOR, AS_TRACED}]
    assert [r.route for p in plans for r in p.regions] == ["eager", "eager"]
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(after, torch.rand(4))
    assert_same_state(model, reference)


@pytest.mark.parametrize(
    "timed, route",
    [({INDUCTOR: 1.0, AS_TRACED: 2.0}, "inductor"), ({INDUCTOR: 2.0, AS_TRACED: 1.0}, "eager")],
    indirect=["timed"],
)
def test_optimizer_steps_track_eager_whichever_side_the_check_picks(timed, route):
    """Four Adam steps on either side of the check: the steps, the statistics and the
    gradients are eager's. The convolution has no bias: one before batch norm has a
    gradient of zero up to rounding, which Adam scales to a full step of either sign,
    so any two correct backends part there (CI, with the real clock picking inductor)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
    ).train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="auto")
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (model, reference)]
    data = torch.Generator().manual_seed(1)
    with recorder.recording() as plans:
        for _ in range(4):
            x = torch.randn(2, 3, 6, 6, generator=data)
            for fn, optimizer in zip((compiled, reference), optimizers):
                optimizer.zero_grad()
                fn(x).square().mean().backward()
            assert_same_state(model, reference)
            for optimizer in optimizers:
                optimizer.step()
    assert timed == [{INDUCTOR, AS_TRACED}]
    assert [r.route for p in plans for r in p.regions] == [route, route]
    assert int(model[1].num_batches_tracked) == 4


class BreaksItsGraph(torch.nn.Module):
    """Two Dynamo graphs: the second's input is the first's activation, which
    requires grad and is no leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x).tanh()
        torch._dynamo.graph_break()
        return self.second(h)


@pytest.mark.parametrize("timed", [{AS_TRACED: 1.0, INDUCTOR: 2.0}], indirect=True)
def test_the_check_of_a_later_graph_leaves_the_earlier_graphs_backward_to_the_caller(timed):
    """The second graph's timed steps run backward into its activation input and
    stop there: the first graph's saved tensors are still there for the caller's
    backward, and no ``.grad`` holds what the timed steps computed."""
    torch.manual_seed(0)
    model = BreaksItsGraph()
    plans = stepped_as_eager(model, copy.deepcopy(model), torch.randn(4, 8))
    assert timed == [{INDUCTOR, AS_TRACED}, {INDUCTOR, AS_TRACED}]
    assert [r.route for p in plans for r in p.regions] == ["eager"] * 4
