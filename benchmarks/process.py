"""Worker processes for the benchmarks, and timing them in turn.

A ``Worker`` runs one benchmark cell in a process of its own (so that no other
runtime's thread pool spins beside it), waits for its ready line (JSON), and
then asks it for batches of calls: a line ``N`` runs N calls and answers
``BENCH_TIME seconds``; ``quit`` ends it with ``BENCH_RSS {json}``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
SPIN_DOWN_S = 0.25
#: what a gated worker prints once loaded, before it waits for ``go``
LOADED = "WORKER_LOADED"


def collect_set_up_garbage() -> None:
    """A full garbage collection just before a timed compile.

    A cell's set-up (the model, its fp64 copy, the reference calls) leaves
    objects that Python's next full collection walks: 0.2-0.3 s in a process
    holding torch and transformers. Without this it landed inside whichever
    compile was timed next (0.19 of auto's 0.34 s warm start on python_loop),
    so a compile time read the harness's garbage as the backend's."""
    gc.collect()


def child_env(**overrides: str) -> dict[str, str]:
    """The environment of a benchmark's child process: this one's without the
    user's ``DISPATCH_*`` settings (a forced route would change what auto's column
    measures), plus ``overrides``. Bytecode is written and read as for an
    installed package: with PYTHONDONTWRITEBYTECODE (set on the machines these
    numbers come from) every worker compiled dispatch's sources again, 57 ms of
    each start."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DISPATCH_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    return {**env, **overrides}


def marked_report(
    module: str, args: list[str], marker: str, timeout: float, env: dict[str, str] | None = None
) -> tuple[dict[str, Any] | None, str]:
    """``python -m module args`` run to its end in a child process: the JSON on its
    stdout line that starts with ``marker``, or None and the last line of its
    stderr (why it gave none). ``env``: the child's environment, ``child_env()`` where None."""
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else child_env(),
    )
    for line in result.stdout.splitlines():
        if line.startswith(marker):
            return json.loads(line.removeprefix(marker)), ""
    return None, (result.stderr.strip().splitlines() or ["no output"])[-1][:300]


class Worker:
    """A running worker module (``python -m MODULE ARGS...``) for one cell."""

    def __init__(
        self, module: str, args: list[str], ready_prefix: str, log: Path | None = None, gated: bool = False
    ) -> None:
        """``log``: where the worker's stderr goes (warnings, tracebacks); dropped without one.
        ``gated``: the worker loads, prints ``LOADED`` and waits for ``go`` before it
        compiles (``release``), so that several load at once and compile in turn."""
        env = child_env()
        self._log = log.open("w") if log is not None else None
        self._quitting = False
        self._released = not gated
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.ready_prefix = ready_prefix
        self.ready: dict[str, Any] = {}
        #: what the worker reported as it ended (``BENCH_RSS``): peak memory, and what else it adds
        self.final: dict[str, Any] = {}
        if not gated:
            self._read_ready()

    def let_compile(self) -> None:
        """For a ``gated`` worker: wait until it has loaded, then let it compile."""
        if self._released:
            return
        self._released = True
        if self._expect(LOADED) is None:
            self.ready = {"ok": False, "error": "worker died while loading"}
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def release(self) -> None:
        """For a ``gated`` worker: let it compile (if not yet) and read its ready line."""
        self.let_compile()
        if not self.ready:
            self._read_ready()

    def _read_ready(self) -> None:
        line = self._expect(self.ready_prefix)
        self.ready = json.loads(line) if line else {"ok": False, "error": "worker died while compiling"}

    def _expect(self, prefix: str) -> str | None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        return None

    def time(self, calls: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{calls}\n")
        self.proc.stdin.flush()
        answer = self._expect("BENCH_TIME ")
        if answer is None:
            raise RuntimeError("worker died while timing")
        return float(answer) / calls

    def quit(self) -> None:
        """Asks the worker to end, without waiting (``close`` collects it)."""
        if self.proc.poll() is None and not self._quitting:
            assert self.proc.stdin is not None
            self._quitting = True
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:  # it ended meanwhile (a cell that failed does not wait)
                pass

    def close(self) -> float | None:
        """Ends the worker; its peak memory in MB (None where it had ended)."""
        if self.proc.poll() is None or self._quitting:
            self.quit()
            rss = self._expect("BENCH_RSS ")
            self.proc.wait(timeout=60)
            self._close_log()
            self.final = json.loads(rss) if rss else {}
            return self.final.get("peak_rss_mb")
        self._close_log()
        return None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def warm_start_error(worker: Worker, later: Callable[[dict[str, Any]], str | None]) -> str | None:
    """Why a warm start (a ready worker on an earlier one's caches) failed, or None.

    A warm start is a fresh-process round trip of everything the caches keep, so
    it is judged as the first process was: on its first call (its ready line),
    and after one more call (a zoo worker's warm-up comes before it) by its own
    check at its end, which ``later`` reads from its final report. The worker is
    closed."""
    if not worker.ready.get("ok"):
        worker.close()
        return f"warm start: {worker.ready.get('error') or 'failed'}"
    try:
        worker.time(1)
    except RuntimeError as died:
        worker.close()
        return f"warm start: {died}"
    worker.close()
    why = later(worker.final)
    return f"warm start, {why}" if why else None


def time_in_turn(workers: dict[str, Worker], seconds: float, batch_s: float = 0.1) -> dict[str, float]:
    """Median per-call time of each ready worker, from batches taken in turn.

    Every batch lasts about ``batch_s``; a pause before each lets the previous
    column's idle threads stop spinning, so no column pays for another. At
    least 5 rounds, then rounds until ``seconds`` are spent (60 at most)."""
    live = {c: w for c, w in workers.items() if w.ready.get("ok")}
    calls = {}
    for column, worker in list(live.items()):
        try:
            calls[column] = _calls_per_batch(worker, batch_s)
        except RuntimeError:
            del live[column]
    samples: dict[str, list[float]] = {c: [] for c in live}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while live and (rounds < 5 or (time.perf_counter() < deadline and rounds < 60)):
        for column, worker in list(live.items()):
            time.sleep(SPIN_DOWN_S)
            try:
                samples[column].append(worker.time(calls[column]))
            except RuntimeError:
                del live[column]
        rounds += 1
    return {c: sorted(v)[len(v) // 2] for c, v in samples.items() if v}


def _calls_per_batch(worker: Worker, batch_s: float) -> int:
    """How many calls fill ``batch_s``, from warm batches of growing size.

    The batch was sized from one early call, which can be far off: on
    Conv-BN-ReLU the lowered column's took 33 ms (3 ms a call later), so its
    batches held 3 calls, the slow first call after each pause weighed as much
    as the rest, and the column read 1.4x slower than it runs, in two runs.
    Each size is timed twice and the faster taken: a one-off slow call (a
    recompile when a data-dependent branch flips) left the graph-break model's
    compiled training columns at one call a batch, 2.3x slower than they run."""
    n = 1
    while True:
        per_call = min(worker.time(n), worker.time(n))
        if per_call * n >= batch_s / 2 or n >= 5000:
            return max(1, min(5000, int(batch_s / max(per_call, 1e-6))))
        n = min(5000, max(2 * n, int(batch_s / 2 / max(per_call, 1e-6))))
