"""A trial's calls timed on the user's program: by block, from one block's start to the next's."""

import threading

import pytest

from dispatch.call_periods import BLOCK_CALLS, PERIOD_SPAN, CallPeriods, in_timing_loop, timing_loop


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _call(periods: CallPeriods, clock: _Clock, cost: dict[str, float], after: float = 0.0) -> str:
    """One timed call: ``cost[side]`` inside it, ``after`` in the code that follows."""
    start = periods.start()
    side = periods.side
    clock.now += cost[side]
    periods.end(start)
    clock.now += after
    return side


def test_each_side_runs_a_block_of_calls_and_is_timed_per_call_over_its_period():
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock)
    sides = [_call(periods, clock, {"a": 1.0, "b": 2.0}, after=0.5) for _ in range(4 * BLOCK_CALLS)]
    periods.start()  # ends the last block's period
    blocks = [sides[k : k + BLOCK_CALLS] for k in range(0, len(sides), BLOCK_CALLS)]
    assert all(len(set(block)) == 1 for block in blocks)
    assert sorted(block[0] for block in blocks) == ["a", "a", "b", "b"]
    assert periods.counted() == 2
    assert periods.seconds() == ({"a": 1.5, "b": 2.5}, "period")


def test_an_untimed_call_or_a_call_from_another_thread_drops_the_block_it_breaks():
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock)
    for _ in range(BLOCK_CALLS - 1):
        _call(periods, clock, {"a": 1.0, "b": 1.0})
    periods.interrupt()
    for _ in range(BLOCK_CALLS - 1):
        _call(periods, clock, {"a": 1.0, "b": 1.0})
    worker = threading.Thread(target=_call, args=(periods, clock, {"a": 1.0, "b": 1.0}))
    worker.start()
    worker.join()
    periods.start()
    assert periods.periods == {"a": [], "b": []}


def test_calls_far_apart_are_judged_by_their_own_time():
    """A server idle between requests: the period is the idle time, whose spread
    would decide; the calls themselves are compared."""
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock)
    idle = (PERIOD_SPAN + 1) * 2.0
    for _ in range(2 * BLOCK_CALLS):
        _call(periods, clock, {"a": 1.0, "b": 2.0}, after=idle)
    periods.start()
    assert periods.seconds() == ({"a": 1.0, "b": 2.0}, "call")


def test_a_timing_loop_is_marked_on_its_own_thread_only():
    seen = []
    with timing_loop():
        worker = threading.Thread(target=lambda: seen.append(in_timing_loop()))
        worker.start()
        worker.join()
        with timing_loop():
            assert in_timing_loop()
        assert in_timing_loop()
    assert not in_timing_loop() and seen == [False]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_round_of_blocks_runs_each_side_once(seed):
    clock = _Clock()
    periods = CallPeriods(["a", "b", "c"], clock, seed=seed)
    sides = [_call(periods, clock, {"a": 1.0, "b": 1.0, "c": 1.0}) for _ in range(6 * BLOCK_CALLS)]
    rounds = [set(sides[k : k + 3 * BLOCK_CALLS]) for k in range(0, len(sides), 3 * BLOCK_CALLS)]
    assert rounds == [{"a", "b", "c"}] * 2


def test_trials_on_the_same_calls_take_their_sides_in_different_orders():
    """Two regions of one model try their thread counts on the same calls: in one
    shared order, each would measure both regions' pools at once, not its own."""
    orders = []
    for _ in range(2):
        clock = _Clock()
        periods = CallPeriods(["pool", "one"], clock)
        sides = [_call(periods, clock, {"pool": 1.0, "one": 1.0}) for _ in range(32 * BLOCK_CALLS)]
        orders.append(sides[::BLOCK_CALLS])
    assert orders[0] != orders[1]
    assert sorted(orders[0]) == sorted(orders[1])  # each side as often
