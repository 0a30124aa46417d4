"""A trial's calls timed on the user's program: by block, from one block's start to the next's."""

import statistics
import threading

import pytest

from dispatch.call_periods import (
    BLOCK_LENGTH,
    PERIOD_SPAN,
    UNCLASSED_BLOCKS,
    CallPeriods,
    in_timing_loop,
    timing_loop,
)

#: the calls a program ran slowly after another's (timm_vit_tiny on ORT: 3, then
#: within 10% of its time alone)
SLOW_FIRST_CALLS = 3


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
    sides = [_call(periods, clock, {"a": 1.0, "b": 2.0}, after=0.5) for _ in range(4 * BLOCK_LENGTH)]
    periods.start()  # ends the last block's period
    blocks = [sides[k : k + BLOCK_LENGTH] for k in range(0, len(sides), BLOCK_LENGTH)]
    assert all(len(set(block)) == 1 for block in blocks)
    assert sorted(block[0] for block in blocks) == ["a", "a", "b", "b"]
    assert periods.counted() == 2
    assert periods.seconds() == ({"a": 1.5, "b": 2.5}, "period")


def test_a_sides_first_calls_after_the_other_sides_block_are_not_timed():
    """After the other side's block a program runs slowly for a few calls
    (timm_vit_tiny on ORT: 3.74, 3.55, 3.38, 3.09 ms, then 2.8 against 2.63
    alone), which no loop of that program alone pays. Side a is the faster
    settled, and the slower for its first calls after b ran."""
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock, seed=0)
    streak = 0  # side a's calls in a row
    for _ in range(8 * BLOCK_LENGTH):
        start = periods.start()
        side = periods.side
        streak = streak + 1 if side == "a" else 0
        clock.now += (3.0 if streak <= SLOW_FIRST_CALLS else 1.0) if side == "a" else 1.5
        periods.end(start)
    periods.start()
    seconds, measure = periods.seconds()
    assert measure == "period"
    assert seconds == {"a": 1.0, "b": 1.5}


def test_an_untimed_call_or_a_call_from_another_thread_drops_the_block_it_breaks():
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock)
    for _ in range(BLOCK_LENGTH - 1):
        _call(periods, clock, {"a": 1.0, "b": 1.0})
    periods.interrupt()
    for _ in range(BLOCK_LENGTH - 1):
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
    for _ in range(2 * BLOCK_LENGTH):
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
    sides = [_call(periods, clock, {"a": 1.0, "b": 1.0, "c": 1.0}) for _ in range(6 * BLOCK_LENGTH)]
    rounds = [set(sides[k : k + 3 * BLOCK_LENGTH]) for k in range(0, len(sides), 3 * BLOCK_LENGTH)]
    assert rounds == [{"a", "b", "c"}] * 2


def test_trials_on_the_same_calls_take_their_sides_in_different_orders():
    """Two regions of one model try their thread counts on the same calls: in one
    shared order, each would measure both regions' pools at once, not its own."""
    orders = []
    for _ in range(2):
        clock = _Clock()
        periods = CallPeriods(["pool", "one"], clock)
        sides = [_call(periods, clock, {"pool": 1.0, "one": 1.0}) for _ in range(32 * BLOCK_LENGTH)]
        orders.append(sides[::BLOCK_LENGTH])
    assert orders[0] != orders[1]
    assert sorted(orders[0]) == sorted(orders[1])  # each side as often


# A seed whose shuffled order gives side b the short blocks: unclassed, b, 1.1x
# slower, looks 30x faster.
SEED = 0


def _sized_blocks(
    periods: CallPeriods, clock: _Clock, sizes: list[float], slower: float, classed: bool = True
) -> list[str]:
    """A block of calls at each of ``sizes``, each call costing 2**size, on side b
    ``slower`` times that; the sides' order is the trial's own. ``classed``: the
    calls come with their sizes."""
    sides = []
    for size in sizes:
        for _ in range(BLOCK_LENGTH):
            start = periods.start(size if classed else None)
            side = periods.side
            clock.now += 2.0**size * (slower if side == "b" else 1.0)
            periods.end(start)
        sides.append(side)
    periods.start()
    return sides


def test_calls_that_differ_in_size_are_compared_within_a_size_class():
    """A graph of symbolic sizes (a sequence length per request): whichever side
    ran the long sequences lost for them. Within classes side b is 1.1x side a,
    whatever sizes each drew."""
    sizes = [1.0, 6.0] * 8
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock, seed=SEED)
    sides = _sized_blocks(periods, clock, sizes, slower=1.1)
    drew = {side: sorted(size for size, s in zip(sizes, sides) if s == side) for side in "ab"}
    assert drew["a"] != drew["b"]  # the shuffled order gave them different mixes
    assert periods.counted() >= 2
    seconds, measure = periods.seconds()
    assert measure == "period"
    assert seconds["b"] / seconds["a"] == pytest.approx(1.1)
    calls = periods.calls()
    assert calls["b"] / calls["a"] == pytest.approx(1.1)
    # Unclassed, the same calls judge by which side drew the long ones.
    clock = _Clock()
    plain = CallPeriods(["a", "b"], clock, seed=SEED)
    _sized_blocks(plain, clock, sizes, slower=1.1, classed=False)
    seconds, _ = plain.seconds()
    assert seconds["b"] / seconds["a"] != pytest.approx(1.1, rel=0.5)


def test_sizes_that_never_repeat_are_compared_all_together_once_there_are_enough_blocks():
    """Random lengths: no two blocks share a class, so the blocks of all sizes
    count, UNCLASSED_BLOCKS of them for one compared within a class."""
    clock = _Clock()
    periods = CallPeriods(["a", "b"], clock, seed=0)
    blocks = 2 * UNCLASSED_BLOCKS  # each side's
    _sized_blocks(periods, clock, [float(k) for k in range(2 * blocks)], slower=1.0)
    assert all(len(set(periods.classes[s])) == blocks for s in "ab")  # no class shared
    assert periods.counted() == blocks // UNCLASSED_BLOCKS == 2
    seconds, _ = periods.seconds()
    assert seconds == {s: statistics.median_high(periods.periods[s]) for s in "ab"}
