"""How many threads an ORT region runs on: by its work, or measured in place on its first calls."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dispatch.call_periods import BLOCK_LENGTH, timing_loop
from dispatch.routes.onnx_threads import (
    ONE,
    POOL,
    POOL_TRIAL,
    TRIAL,
    TRIAL_BLOCKS,
    ThreadCountTrial,
    thread_plan,
)

#: calls until the trial has settled: the last timed call's period ends as the next call starts
TRIAL_LENGTH = 2 * BLOCK_LENGTH * TRIAL_BLOCKS + 1


@pytest.mark.parametrize(
    "rows, plan",
    [(8, ONE), (64, TRIAL), (2048, POOL_TRIAL)],  # 1, 8.4 and 268 MFLOP
)
def test_the_plan_follows_the_regions_work(rows, plan):
    w = torch.randn(256, 256)
    gm = make_fx(lambda x: torch.relu(x @ w))(torch.randn(rows, 256))
    assert thread_plan(gm, [torch.randn(rows, 256)]) == plan


def test_a_symbolic_size_is_judged_by_the_largest_input():
    gm = make_fx(lambda x, w: x @ w, tracing_mode="symbolic")(torch.randn(8, 16), torch.randn(16, 16))
    assert thread_plan(gm, [torch.randn(8, 16), torch.randn(16, 16)]) == ONE
    assert thread_plan(gm, [torch.randn(512, 64), torch.randn(64, 64)]) == TRIAL


class _Sessions:
    """Fake sessions on a fake clock: each run costs its side's seconds, and
    ``after`` its side's seconds in the code that runs after it."""

    def __init__(self, pool_s: float, one_s: float, after: tuple[float, float] = (0.0, 0.0)) -> None:
        self.now, self.cost = 0.0, {False: pool_s, True: one_s}
        self.after = {False: after[0], True: after[1]}
        self.built: list[bool] = []
        self.ran: list[str] = []

    def build(self, one: bool):
        self.built.append(one)

        def run(x):
            self.now += self.cost[one]
            self.ran.append("one" if one else "pool")
            return x + 1

        return run

    def code_after(self) -> None:
        """What the caller runs next, slowed by the last session's threads."""
        self.now += self.after[self.ran[-1] == "one"]


@pytest.mark.parametrize(
    "pool_first, pool_s, one_s, kept",
    [
        (False, 50e-6, 100e-6, "pool"),
        (False, 100e-6, 90e-6, "one"),
        (False, 95e-6, 100e-6, "one"),  # a near tie: the side it started on
        (True, 100e-6, 95e-6, "pool"),
        (True, 100e-6, 85e-6, "one"),
    ],
)
def test_the_trial_keeps_the_session_whose_runs_were_faster(pool_first, pool_s, one_s, kept):
    sessions = _Sessions(pool_s, one_s)
    trial = ThreadCountTrial(sessions.build, clock=lambda: sessions.now, pool_first=pool_first)
    for k in range(TRIAL_LENGTH + 5):
        assert trial(torch.tensor(k)) == k + 1
    # in blocks while measuring, each side once in every pair of blocks, then only the one kept
    blocks = [set(sessions.ran[k : k + BLOCK_LENGTH]) for k in range(0, TRIAL_LENGTH - 1, BLOCK_LENGTH)]
    assert all(len(block) == 1 for block in blocks)
    pairs = [blocks[k] | blocks[k + 1] for k in range(0, len(blocks), 2)]
    assert pairs == [{"one", "pool"}] * (len(blocks) // 2)
    assert sessions.ran[TRIAL_LENGTH - 1 :] == [kept] * 6
    first = not pool_first
    assert sessions.built == [first, not first]  # each built once, the other side on first use
    assert trial.sessions == {}  # the other session is dropped


@pytest.mark.parametrize(
    "after, kept",
    [
        # the pool's run is the faster, but it slows the code after it more than it saves
        ((150e-6, 0.0), "one"),
        # calls far apart (a server between requests): the period is other work, the call decides
        ((5e-3, 5e-3), "pool"),
    ],
)
def test_a_session_is_judged_by_its_period_to_the_next_call(after, kept):
    """graph_break on a 2-core Xeon: the pool ran each region faster, and the model
    951-1062 µs a call on it against 652-842 µs on one thread."""
    sessions = _Sessions(50e-6, 100e-6, after)
    trial = ThreadCountTrial(sessions.build, clock=lambda: sessions.now, pool_first=True)
    for k in range(TRIAL_LENGTH + 1):
        trial(torch.tensor(k))
        sessions.code_after()
    assert sessions.ran[-1] == kept


@pytest.mark.parametrize(
    "one_s, kept",
    [
        (100e-6, "pool"),  # equal sessions: the pool it started on stays
        (50e-6, "one"),  # one thread faster: its periods show it, the rest of the step on both sides
    ],
)
def test_a_region_run_twice_a_step_is_judged_alike_on_both_sides(one_s, kept):
    """A loop body behind a graph break runs twice a step, the rest of the step
    after its second run: strictly alternated, one side would have every long
    period."""
    sessions = _Sessions(100e-6, one_s)
    trial = ThreadCountTrial(sessions.build, clock=lambda: sessions.now, pool_first=True)
    for k in range(TRIAL_LENGTH):
        trial(torch.tensor(k))
        if k % 2:
            sessions.now += 5e-4  # the rest of the step
    assert sessions.ran[-1] == kept
    assert trial.sessions == {}  # settled: the other session is dropped


def test_the_calls_of_autotunes_timing_loop_are_not_counted():
    """``autotune.median_call_s`` (the whole-graph check's timing) calls the graph
    back to back, alone: the trial runs its first side there and settles nothing."""
    from dispatch import autotune

    sessions = _Sessions(100e-6, 50e-6)
    trial = ThreadCountTrial(sessions.build, clock=lambda: sessions.now, pool_first=True)
    autotune.median_call_s({"graph": trial}, [torch.tensor(0)], batch_s=1e-3, batches=3)
    assert len(sessions.ran) > TRIAL_LENGTH and set(sessions.ran) == {"pool"}
    assert trial.chosen is None and trial.periods.counted() == 0


def test_calls_inside_a_timing_loop_run_the_first_side_untimed():
    """The whole-graph check calls the graph back to back: not the user's program."""
    sessions = _Sessions(100e-6, 50e-6)
    trial = ThreadCountTrial(sessions.build, clock=lambda: sessions.now, pool_first=True)
    with timing_loop():
        for k in range(3 * TRIAL_LENGTH):
            trial(torch.tensor(k))
    assert set(sessions.ran) == {"pool"} and trial.chosen is None
    for k in range(TRIAL_LENGTH):
        trial(torch.tensor(k))
    assert sessions.ran[-1] == "one"


def test_the_first_runs_of_each_block_are_not_counted():
    """A session's first runs pay for its allocations, and each block's first runs
    for the other side's that ran before: the pool, slow for those, must not lose."""
    sessions = _Sessions(50e-6, 100e-6)
    cost = sessions.cost
    real = sessions.build

    def build(one):
        run = real(one)
        if one:
            return run

        def slow_start(x):
            last_one = max((k for k, s in enumerate(sessions.ran) if s == "one"), default=-1)
            in_a_row = len(sessions.ran) - last_one  # this run's place among the pool's runs in a row
            cost[False] = 1.0 if in_a_row <= 3 else 50e-6
            return run(x)

        return slow_start

    trial = ThreadCountTrial(build, clock=lambda: sessions.now)
    for k in range(TRIAL_LENGTH):
        trial(torch.tensor(k))
    assert sessions.ran[-1] == "pool"


def _large_region_followed_by(after):
    """A 268 MFLOP matmul region, and ``after`` applied to its result."""
    from dispatch.config import Config
    from dispatch.planner import plan_graph

    w = torch.randn(256, 256)
    gm = make_fx(lambda x: after(torch.relu(x @ w)))(torch.randn(2048, 256))
    plan, gm = plan_graph(gm, "inference", Config.resolve({}, env={}), 0)
    (onnx,) = [r for r in plan.regions if r.route == "onnxrt"]
    return [r.route for r in plan.regions], getattr(gm, onnx.name)


@pytest.mark.parametrize(
    "after, routes, plan",
    [
        (lambda y: y * 2, ["onnxrt"], POOL_TRIAL),
        # A strided view returned to the caller is an eager region that runs no op.
        (lambda y: (y * 2).t(), ["onnxrt", "eager"], POOL_TRIAL),
        # ONNX Runtime does not run cummax: eager runs it beside the region.
        (lambda y: torch.cummax(y, 0).values, ["onnxrt", "eager"], TRIAL),
    ],
)
def test_a_large_region_beside_other_routes_is_tried_in_place(after, routes, plan):
    """Alone in its graph a large region starts on ORT's pool. Beside another route's
    ops, torch's spinning workers hold the cores: in a mixture-of-experts decoder
    the pool ran a region no faster than one thread (394 against 393 µs)."""
    planned, region = _large_region_followed_by(after)
    assert planned == routes
    assert thread_plan(region, [torch.randn(2048, 256)]) == plan


def _sessions_threads(plan: str) -> int | set[int]:
    """The intra-op thread count of the session(s) a region planned ``plan`` runs on."""
    from dispatch.routes.onnx_export import export_region
    from dispatch.routes.onnx_session import threaded_session

    x = torch.randn(64, 256)
    model = export_region(make_fx(lambda x: torch.relu(x @ x.T))(x), [x])
    runner = threaded_session(model, torch.device("cpu"), plan, [0], [], 1)
    if isinstance(runner, ThreadCountTrial):  # before a call: the session built first
        threads = {s.session.get_session_options().intra_op_num_threads for s in runner.sessions.values()}
    else:
        threads = runner.session.get_session_options().intra_op_num_threads
    torch.testing.assert_close(runner(x)[0], torch.relu(x @ x.T), rtol=1e-4, atol=1e-4)
    return threads


@pytest.mark.parametrize("threads", [2, 3])
def test_the_pool_has_as_many_threads_as_torch(torch_threads, threads):
    """Not ORT's default of one per physical core: a process told to use fewer
    (one of several serving processes) keeps to them."""
    torch_threads(threads)
    assert _sessions_threads(POOL) == threads
    assert _sessions_threads(ONE) == 1


def test_where_torch_runs_on_one_thread_every_session_does_and_nothing_is_tried(torch_threads):
    torch_threads(1)
    assert _sessions_threads(TRIAL) == 1  # one plain session, no trial
    assert _sessions_threads(POOL) == 1
    torch_threads(2)
    assert _sessions_threads(TRIAL) == {1}  # the side each trial starts on, built first
    assert _sessions_threads(POOL_TRIAL) == {2}
