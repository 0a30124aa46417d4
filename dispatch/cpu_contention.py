"""Whether other work held this process's CPUs while it timed its routes.

A timed decision is cached for every later process on the same CPU and thread
count (``cache.timing_context``), so one timed while another process took the
cores misleads them all. Measured (Xeon, 2 cores): hf_resnet's in-place trial,
run beside busy processes, timed the graph on ORT at 5.05 ms, as traced at
3.62 and on plain inductor at 3.09, and cached plain inductor; every later
process on the quiet machine then ran it at 1075 µs a call against 360 on ORT.

Linux's scheduler counts, per thread, the time it waited runnable for a CPU
(``/proc/self/task/<tid>/schedstat``, second field). The thread that times the
calls runs them and the Python around them: on a quiet 2-core machine it
waited at most 2% of the wall time (in-place trials and whole-graph checks of
hf_resnet, hf_bert, timm_mobilenetv3 and the graph-break model), beside two
busy processes 40% to 50%. Its worker threads are no measure: when the sides
of a trial alternate, torch's OpenMP workers, spinning after their ops, and
ORT's wait for each other, up to 18% of the wall time on the quiet machine.
The in-place trial times a round so held once more (``graph_trial``), and a
decision whose timing thread waited ``CONTENDED_SHARE`` of its wall time or
more is applied in this process and not cached: the next process times it
again. Where the kernel does not say (another OS), every timing counts as quiet.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from time import perf_counter

# A share of the timing's wall time: on a quiet machine the timing thread waited
# at most 0.02 of it, beside two busy processes 0.4 or more.
CONTENDED_SHARE = 0.10
NOT_CACHED = "not cached"  # a decision's note: timed while other work held the CPUs


def thread_wait(tid: int) -> int | None:
    """Nanoseconds this process's thread ``tid`` has waited, runnable, for a CPU;
    None where the kernel does not say."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as stat:
            return int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class ContentionMeter:
    """Adds up, over the windows it runs in (``running``, or ``resume`` and
    ``pause``), their wall time and the time the thread that opened each window
    waited in it for a CPU. Compiles stay outside its windows: inductor's
    compile workers are other processes that take the cores from this one."""

    def __init__(
        self,
        read: Callable[[int], int | None] | None = None,
        clock: Callable[[], float] = perf_counter,
    ) -> None:
        self.read = read or thread_wait
        self.clock = clock
        self.wall = 0.0
        self.waited = 0.0
        self.unknown = False  # the kernel did not say for some window
        self._start: tuple[int, float, int | None] | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.resume()
        try:
            yield
        finally:
            self.pause()

    def resume(self) -> None:
        if self._start is None:
            tid = threading.get_native_id()
            self._start = (tid, self.clock(), self.read(tid))

    def pause(self) -> None:
        if self._start is None:
            return
        tid, began, before = self._start
        self._start = None
        after = self.read(tid)  # the same thread's, where another thread closes the window
        self.wall += self.clock() - began
        if before is None or after is None:
            self.unknown = True
            return
        self.waited += max(0, after - before) / 1e9

    def contended(self, since: tuple[float, float] = (0.0, 0.0)) -> bool:
        """Whether the timing thread waited ``CONTENDED_SHARE`` of the wall time or
        more: all of it, or what came after the ``mark`` ``since``."""
        self.pause()
        wall, waited = self.wall - since[0], self.waited - since[1]
        return wall > 0 and waited >= CONTENDED_SHARE * wall

    def mark(self) -> tuple[float, float]:
        """The wall time and wait so far, for ``contended`` and ``discard`` to count from."""
        self.pause()
        return self.wall, self.waited

    def discard(self, since: tuple[float, float]) -> None:
        """Forget what came after the ``mark`` ``since``: a timing thrown away."""
        self.pause()
        self.wall, self.waited = since

    def note(self) -> str:
        """Why a contended timing is ``NOT_CACHED``, to follow those words in its line."""
        share = self.waited / self.wall if self.wall else 0.0
        return (
            f"(timed while other work held the CPUs: the timing thread waited {share:.0%} "
            "of the time for one; the next process times it again)"
        )
