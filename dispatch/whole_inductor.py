"""A Dynamo graph's ORT regions, or the whole graph before its split, compiled by
inductor in the middle of a call, checked against torch, and swapped in.

The whole-graph check (``graph_tuning``) and the in-place trial
(``graph_trial``) both time inductor against the routes the regions chose; this
is how either compiles it. The whole graph goes first: inductor then runs the
eager regions' ops inside its own program, as plain inductor does, keeping the
fusions across the cuts. Where it fails, each ORT region is compiled alone.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from .autotune import check_close
from .cache import ArtifactCache, inductor_cache, using
from .config import Config
from .errors import error_line
from .inductor_bar import CUTTING_ROUTE
from .routes import CompiledFn, registry
from .stitch import COMPILE_LOCK, FallbackWarning, RegionRunner, StitchedGraph


def cutting_regions_on_inductor(
    runners: Sequence[RegionRunner], region_args: dict[str, Sequence[Any]]
) -> tuple[dict[str, CompiledFn], RegionRunner | None]:
    """Each ``CUTTING_ROUTE`` region compiled by inductor on the inputs it ran on
    (``region_args``) and checked against torch, by name; stops at the first that
    fails, returned second (its reason is in its ``measured``), else None."""
    compiled: dict[str, CompiledFn] = {}
    for runner in runners:
        if runner.chain[0] != CUTTING_ROUTE:
            continue
        inputs = region_args.get(runner.plan.name)
        fn = None if inputs is None else runner.candidate("inductor", inputs)
        if fn is None:
            return compiled, runner
        compiled[runner.plan.name] = fn
    return compiled, None


def whole_graph_on_inductor(
    stitched: StitchedGraph, args: Sequence[Any], config: Config
) -> tuple[CompiledFn | None, str | None]:
    """The graph as it was before the split, compiled by inductor in one piece and
    checked against torch on ``args``; else None and why.

    Inductor runs the eager regions' ops inside its own program, as plain
    inductor does (an op it cannot lower becomes a call to torch's kernel), so
    the fusions across the cuts are kept and no region boundary is paid: on
    Mixtral, Qwen2-MoE and OLMoE the ORT regions compiled one by one ran the
    graph 6-10% slower than plain inductor, the whole graph within 2% of it."""
    whole = stitched.whole
    if whole is None:
        return None, "the graph before its split was not kept"
    try:
        fn = _compiled_whole(whole, args, config)
        with _disable_current_modes():
            check_close(whole(*args), fn(*args))
    except Exception as error:  # a failing candidate loses; the regions are tried one by one
        return None, f"not measured: {error_line(error)}"
    return fn, None


@contextlib.contextmanager
def compiling_whole_graph(config: Config) -> Iterator[None]:
    """Where a graph is compiled whole by inductor during a call: ``config``'s
    caches (dispatch's and inductor's), no fake or dispatch mode of the caller,
    and one compile at a time."""
    cache_dir = config.cache_dir
    with using(ArtifactCache(cache_dir)), _disable_current_modes(), COMPILE_LOCK, inductor_cache(cache_dir):
        yield


def _compiled_whole(whole: torch.fx.GraphModule, args: Sequence[Any], config: Config) -> CompiledFn:
    with compiling_whole_graph(config):
        return registry.get("inductor").compile(whole, args)


def run_whole_on_inductor(
    stitched: StitchedGraph, fn: CompiledFn | None, reason: str, config: Config
) -> None:
    """Run ``stitched`` as inductor compiled it whole: ``fn``, or where None (a
    warm start: inductor's cache serves it), the graph compiled on its next call.
    Where inductor fails it then, one warning, and the split graph runs, each
    region compiled by inductor on its own. Every region shows inductor: its ops
    run inside that program."""
    for runner in stitched.runners:
        # Not called while the whole graph runs; a region called alone compiles on inductor.
        runner.run_on("inductor", reason)
    if fn is not None:
        stitched.forward, stitched.whole = fn, None  # compiled: the copy has served
        return
    lock = threading.Lock()

    def first(*args: Any) -> Any:
        with lock:
            if stitched.forward is first:
                stitched.forward = _whole_or_split(stitched, args, config)
        return stitched.forward(*args)

    stitched.forward = first


def _whole_or_split(stitched: StitchedGraph, args: Sequence[Any], config: Config) -> CompiledFn:
    try:
        assert stitched.whole is not None, "a cached whole-graph decision without the graph"
        fn = _compiled_whole(stitched.whole, args, config)
    except Exception as error:
        warnings.warn(
            f"dispatch: inductor failed to compile graph {stitched.runners[0].plan.graph} whole: "
            f"{error_line(error, 300)}; its regions now run on 'inductor' one by one",
            FallbackWarning,
            stacklevel=4,
        )
        return stitched.split_forward
    stitched.whole = None  # compiled: the copy has served
    return fn
