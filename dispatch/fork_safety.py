"""Inductor's compile thread pool, forgotten in a forked child.

torch clears Inductor's compile *process* pool after ``fork()``
(``torch/_inductor/async_compile.py``, ``after_fork``) but not its *thread*
pool, ``AsyncCompile.pool``: an ``lru_cache``'d ``ThreadPoolExecutor`` whose
threads stay behind in the parent. The child's first C++ kernel is submitted to
it and waited on forever (pytorch/pytorch#196972 is about the same stale cache).
Plain inductor hangs there only when a child meets a new shape; ``auto`` keeps
compiling after the first call (trials, the whole-graph check), so a worker
forked from a process that has served a few calls hangs on its first call.
"""

from __future__ import annotations

import os
import sys


def forget_inductor_thread_pool() -> None:
    """Drop the parent's thread pool, so the child's next compile builds its own."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is None:  # nothing compiled before the fork
        return
    pool = getattr(async_compile.AsyncCompile, "pool", None)
    cache_clear = getattr(pool, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=forget_inductor_thread_pool)
