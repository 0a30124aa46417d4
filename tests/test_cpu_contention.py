"""A timing taken while other work held the CPUs is applied in its process and
not cached (``dispatch/cpu_contention.py``): the next process times it again."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import dispatch
import dispatch.cpu_contention as cpu_contention
from dispatch.cpu_contention import CONTENDED_SHARE, NOT_CACHED, ContentionMeter
from dispatch.cpu_contention import thread_wait as kernel_thread_wait  # before conftest's ``quiet_cpus``
from tests.test_autotune import INPUTS, TUNED, pointwise
from tests.test_timed_graphs import LARGE, ON_INDUCTOR


class Clock:
    """A wall clock and each thread's nanoseconds waited, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waited: dict[int, int] = {}

    def read(self, tid: int) -> int:
        return self.waited.get(tid, 0)

    def wait(self, seconds: float, tid: int | None = None) -> None:
        tid = threading.get_native_id() if tid is None else tid
        self.waited[tid] = self.waited.get(tid, 0) + int(seconds * 1e9)


def _meter(clock: Clock) -> ContentionMeter:
    return ContentionMeter(read=clock.read, clock=lambda: clock.now)


def test_waits_are_counted_only_inside_the_windows():
    clock = Clock()
    meter = _meter(clock)
    with meter.running():
        clock.now += 1.0
        clock.wait(0.05)
    clock.now += 10.0
    clock.wait(5.0)  # a compile between the windows: its workers took the cores
    with meter.running():
        clock.now += 1.0
    assert (meter.wall, meter.waited) == (2.0, 0.05)
    assert not meter.contended()


def test_a_window_is_judged_from_its_mark_and_a_discarded_one_no_longer_counts():
    clock = Clock()
    meter = _meter(clock)
    with meter.running():
        clock.now += 1.0  # a quiet round
    began = meter.mark()
    with meter.running():
        clock.now += 1.0
        clock.wait(0.5)  # a busy one
    assert meter.contended(since=began) and meter.contended()
    meter.discard(began)
    assert not meter.contended() and (meter.wall, meter.waited) == (1.0, 0.0)
    with meter.running():
        clock.now += 1.0
    assert not meter.contended(since=began)


def test_a_wait_of_the_contended_share_is_contended():
    clock = Clock()
    meter = _meter(clock)
    meter.resume()
    clock.now += 1.0
    clock.wait(CONTENDED_SHARE)
    assert meter.contended()  # it closes the open window
    assert "waited 10% of the time" in meter.note()


def test_only_the_timing_threads_wait_counts():
    """Worker threads wait for each other where the sides of a trial alternate
    (OpenMP's spinning against ORT's) on a quiet machine."""
    clock = Clock()
    meter = _meter(clock)
    with meter.running():
        clock.now += 1.0
        clock.wait(0.9, tid=threading.get_native_id() + 1)
    assert meter.waited == 0 and not meter.contended()


def test_a_window_closed_by_another_thread_reads_the_thread_that_opened_it():
    clock = Clock()
    meter = _meter(clock)
    meter.resume()
    clock.now += 1.0
    clock.wait(0.5)
    closer = threading.Thread(target=meter.pause)
    closer.start()
    closer.join()
    assert meter.waited == 0.5


def test_where_the_kernel_does_not_say_a_timing_counts_as_quiet():
    meter = ContentionMeter(read=lambda tid: None)
    with meter.running():
        time.sleep(0.01)
    assert meter.unknown and not meter.contended()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="the kernel keeps no schedstat here")
def test_the_kernel_counts_the_wait_beside_busy_processes(monkeypatch):
    """Twice as many busy processes as this process has CPUs: its spinning thread
    waits about half the time (the kernel's counts, in place of conftest's ``quiet_cpus``)."""
    monkeypatch.setattr(cpu_contention, "thread_wait", kernel_thread_wait)
    cpus = len(os.sched_getaffinity(0))
    if cpus > 8:
        pytest.skip("the test starts 2 busy processes a CPU; this machine has too many")
    spin = "import time\nend = time.time() + 20\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * cpus)]
    try:
        time.sleep(0.2)
        meter = ContentionMeter()
        with meter.running():
            end = time.perf_counter() + 0.5
            while time.perf_counter() < end:
                pass
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert not meter.unknown, "the kernel gave no count for this thread"
    assert meter.contended(), (meter.waited, meter.wall)


@pytest.mark.parametrize("timed", [{"all eager": 1.0, ON_INDUCTOR: 0.5}], indirect=True)
@torch.no_grad()
def test_a_whole_graph_timed_on_busy_cpus_is_timed_again_by_the_next_process(
    timed, route_compiles, busy_cpus
):
    model, args = LARGE
    [region] = dispatch.explain(model, *args).regions
    assert region.route == "inductor", "the decision was not applied in its own process"
    assert f", {NOT_CACHED} (timed while other work held the CPUs" in region.measured["whole graph"]
    timings = len(timed)

    torch._dynamo.reset()  # a warm start
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(*args), model(*args))
    assert len(timed) > timings, "a decision timed on busy CPUs was read from the cache"


@pytest.mark.parametrize("demo", ["slow"], indirect=True)
def test_an_autotune_timed_on_busy_cpus_is_measured_again(demo, busy_cpus):
    with torch.no_grad():
        [region] = dispatch.explain(pointwise, *INPUTS, options=TUNED).regions
        assert region.route == "eager" and NOT_CACHED in region.measured
        compiles = demo.compiles
        [region] = dispatch.explain(pointwise, *INPUTS, options=TUNED).regions
    assert region.route == "eager"
    assert demo.compiles > compiles, "a decision timed on busy CPUs was read from the cache"
