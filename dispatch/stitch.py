"""Run a split graph: each region submodule becomes a ``RegionRunner``.

A runner compiles its region with the planned route on the region's first real
inputs, and falls back along the region's chain (ending in eager, unless strict
forbids it) when a route fails to compile, fails to run, or (with ``verify``)
returns numbers that differ from eager. Each failure warns once and is recorded
in the runner's ``RegionRun`` beside the plan, which stays as it was made;
``explain`` shows the outcome. ``stitch`` returns a ``StitchedGraph``, which
owns the graph and its runners.
"""

from __future__ import annotations

import copy
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils._python_dispatch import _disable_current_modes

from .autotune import check_close, format_seconds, measure
from .cache import ArtifactCache, inductor_cache, region_key, timing_context, using
from .config import Config
from .cpu_contention import NOT_CACHED
from .errors import RouteFailedError, error_line
from .planner import fallback_advice
from .region import GraphPlan, Region, RegionRun
from .routes import CompiledFn, WrappingRoute, registry

log = logging.getLogger("dispatch")


class CompileLock:
    """One compile at a time in the process, planning and region compiles alike.

    FX tracing keeps module-global state (``torch.fx._symbolic_trace``'s
    ``CURRENT_PATCHER`` and ``_is_fx_tracing_flag``), and threads making their
    first calls together broke each other's traces. The tracing flag is seen by
    every thread: a call to a compiled function, made by another thread while
    the flag is set, is taken by Dynamo for a nested FX trace and raises
    ("Detected that you are using FX to symbolically trace a dynamo-optimized
    function") unless torch has marked the process as compiling. It marks it
    for Dynamo and ``torch.export``, not for ``torch._inductor.compile``, which
    the inductor route runs when a region makes its first call: on the H100 3
    of 4 threads raised. While the lock is held, Dynamo runs such a call as the
    function is written (its option ``error_on_nested_fx_trace=False``), for
    every thread; the thread's next call runs compiled."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._restore: Callable[[], None] | None = None

    def __enter__(self) -> CompileLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._restore = _process_wide_default("error_on_nested_fx_trace", False)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._restore is not None:
            self._restore()
            self._restore = None
        self._lock.release()


def _process_wide_default(name: str, value: object) -> Callable[[], None] | None:
    """Set the default of a ``torch._dynamo.config`` entry; what undoes it, or
    None where this torch keeps its config otherwise.

    A plain assignment to the config is a per-thread override in torch 2.12 and
    later; the entry's default is read by every thread that has not overridden
    it. Only this lock writes that default, so restoring it races with nobody."""
    entry = getattr(torch._dynamo.config, "_config", {}).get(name)
    if entry is None or not hasattr(entry, "default"):
        return None
    previous = entry.default
    entry.default = value

    def restore() -> None:
        entry.default = previous

    return restore


COMPILE_LOCK = CompileLock()


class FallbackWarning(UserWarning):
    """A route failed on a region; the region now runs on the next route."""


class StitchedGraph:
    """A split graph whose region submodules run through ``RegionRunner``s.

    Calling it runs the graph's own forward (not ``nn.Module.__call__``, which
    would add its hooks' cost to every call). ``whole``: the graph as it was
    before it was split, where a route may compile it in one piece
    (``graph_tuning``: inductor in place of a graph cut among routes)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        runners: list[RegionRunner],
        whole: torch.fx.GraphModule | None = None,
    ) -> None:
        if isinstance(gm, _LazyGraphModule) and gm._needs_recompile():
            gm.real_recompile()
        self.gm = gm
        self.runners = runners
        #: the split graph's own forward, which calls the region runners
        self.split_forward = type(gm).forward.__get__(gm)
        self.forward = self.split_forward  # what a call runs: the whole graph once compiled so
        self.whole = whole

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)

    @property
    def inputs(self) -> int:
        return len(self.gm.graph.find_nodes(op="placeholder"))

    def outcome(self) -> list[Region]:
        """Each region as it turned out at run time (the plan, where nothing happened)."""
        return [runner.run.outcome() for runner in self.runners]


def with_region_inputs(
    stitched: Sequence[StitchedGraph], call: Callable[[], Any]
) -> tuple[Any, dict[str, Any]]:
    """``call()``'s result, and the inputs each region of ``stitched`` ran on in it
    (by region name): what a rival route of a region compiles for."""
    region_args: dict[str, Sequence[Any]] = {}

    def recorder(runner: RegionRunner) -> Callable[..., Any]:
        def run(*inputs: Any) -> Any:
            region_args[runner.plan.name] = inputs
            return runner(*inputs)

        return run

    for graph in stitched:
        for runner in graph.runners:
            setattr(graph.gm, runner.plan.name, recorder(runner))
    try:
        return call(), region_args
    finally:
        for graph in stitched:
            for runner in graph.runners:
                setattr(graph.gm, runner.plan.name, runner)


def with_regions_swapped(
    runners: Sequence[RegionRunner], fns: dict[str, CompiledFn], call: Callable[..., Any]
) -> Callable[..., Any]:
    """``call`` with the regions named in ``fns`` run by those functions, for that call only."""

    def run(*args: Any) -> Any:
        chosen = {r.plan.name: r.swap(fns[r.plan.name]) for r in runners if r.plan.name in fns}
        try:
            return call(*args)
        finally:
            for r in runners:
                if r.plan.name in chosen:
                    r.swap(chosen[r.plan.name])

    return run


def with_forward_swapped(
    stitched: StitchedGraph, forward: Callable[..., Any], call: Callable[..., Any]
) -> Callable[..., Any]:
    """``call`` with ``stitched`` run by ``forward`` (its graph compiled whole, or a
    recording of its inputs), for that call only."""

    def run(*args: Any) -> Any:
        previous, stitched.forward = stitched.forward, forward
        try:
            return call(*args)
        finally:
            stitched.forward = previous

    return run


def unsplit_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm``'s graph, to keep as it is while ``gm`` is split in place;
    its attributes (constants) are shared, not copied."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def stitch(
    gm: torch.fx.GraphModule, plan: GraphPlan, config: Config, whole: torch.fx.GraphModule | None = None
) -> StitchedGraph:
    """Replace every region submodule of ``gm`` by a runner for it (``whole``:
    the graph before the split, kept on the ``StitchedGraph``).

    A runner is a plain attribute, not a submodule: the generated code calls
    ``self.<region>(...)`` either way, and ``nn.Module.__call__`` would add
    about 4 µs per region to every call (measured)."""
    runners = []
    for region in plan.regions:
        sub = gm.get_submodule(region.name)
        assert isinstance(sub, torch.fx.GraphModule)
        delattr(gm, region.name)
        runners.append(RegionRunner(sub, region, config))
        setattr(gm, region.name, runners[-1])
    return StitchedGraph(gm, runners, whole)


class RegionRunner:
    """Runs one region on its route, compiled lazily, with per-region fallback."""

    def __init__(self, gm: torch.fx.GraphModule, region: Region, config: Config) -> None:
        self.gm = gm
        self.plan = region
        self.run = RegionRun.of(region)
        self.config = config
        self.chain = [region.route, *region.fallbacks]
        self.cache = ArtifactCache(config.cache_dir)
        self._fn: CompiledFn | None = None
        self._decided = False  # the chain is in measured order (or needs none)
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is None:
            fn = self._prepare(args)
        try:
            return fn(*args)
        except Exception as error:
            if self.chain[0] == "eager":
                raise  # eager is the reference: its error is the user's to see
            return self._after_failure(fn, error, args)

    def _prepare(self, args: Sequence[Any]) -> CompiledFn:
        with self._lock, using(self.cache):
            if self._fn is None and self.config.autotune:
                self._autotune(args)
            while self._fn is None:
                route = self.chain[0]
                try:
                    # AOTAutograd runs the first call under a checking dispatch mode;
                    # exporters and compilers must trace outside of it.
                    with _disable_current_modes(), COMPILE_LOCK:
                        fn = self._compile(route, args)
                    if self.config.verify and route != "eager":
                        check_close(self.gm(*args), fn(*args))
                except Exception as error:
                    self.next_route("compile", error)
                    continue
                self._fn = fn
            return self._fn

    def read_decision(self) -> bool:
        """Take the cached measured order, compiling nothing; False where this
        region has yet to be measured."""
        with self._lock:
            return self._read_decision()

    def _read_decision(self) -> bool:
        if self._decided or registry.get(self.chain[0]).wraps or len(self.chain) < 2:
            return True  # a capture wraps one inner route; a lone route has no rival
        decision = self.cache.get_json("decision", self._decision_key())
        if decision is None or not set(decision["order"]) <= set(self.chain):
            return False
        self.run.measured = {r: f"{line} (cached)" for r, line in decision["measured"].items()}
        self._reorder(decision["order"], decision["reasons"])
        self._decided = True
        return True

    def _decision_key(self) -> str:
        return region_key(self.gm, "decision", tuple(self.chain), timing_context())

    def _autotune(self, args: Sequence[Any]) -> None:
        """Reorder the chain by measured speed (or by the cached decision) and
        keep the winner's compiled function."""
        run = self.run
        if self._read_decision():
            return
        key = self._decision_key()
        self._decided = True
        with _disable_current_modes(), COMPILE_LOCK:
            tuning = measure(
                self.chain, lambda route: self._compile(route, args), lambda: self.gm(*args), args
            )
        run.measured = {r: format_seconds(t) for r, t in tuning.seconds.items()}
        run.measured.update({r: why for r, why in tuning.reasons.items() if r not in tuning.seconds})
        if tuning.best is None:
            return  # nothing measured: the ordinary chain, with its fallbacks, takes over
        order = tuning.ranking()
        self._reorder(order, tuning.reasons)
        self._fn = tuning.compiled
        if tuning.not_cached is not None:
            run.measured[NOT_CACHED] = tuning.not_cached
            return
        self.cache.put_json(
            "decision", key, {"order": order, "reasons": tuning.reasons, "measured": run.measured}
        )

    def _reorder(self, order: Sequence[str], reasons: dict[str, str]) -> None:
        run = self.run
        self.chain = list(order)
        if "eager" not in self.chain and not self.config.strict:
            self.chain.append("eager")
        run.rejected.update(reasons)
        run.rejected.pop(self.chain[0], None)
        run.route = self.chain[0]
        run.fallbacks = tuple(self.chain[1:])

    def _compile(self, route: str, args: Sequence[Any]) -> CompiledFn:
        with inductor_cache(self.config.cache_dir):
            return self._compile_on(route, args)

    def _compile_on(self, route: str, args: Sequence[Any]) -> CompiledFn:
        chosen = registry.get(route)
        if isinstance(chosen, WrappingRoute):
            inner_route = self.run.inner_route
            assert inner_route is not None, f"{self.plan.name}: a capture without its inner route"
            inner = registry.get(inner_route).compile(self.gm, args)
            return chosen.wrap(inner, self.gm, args, outputs_survive=not self.config.reduce_overhead)
        return chosen.compile(self.gm, args)

    def swap(self, fn: CompiledFn | None) -> CompiledFn | None:
        """Run ``fn`` for this region from now on; returns the one it replaces."""
        previous, self._fn = self._fn, fn
        return previous

    def run_eager(self, reason: str) -> None:
        """Move this region to eager for good; ``reason`` says why its route lost."""
        self.run_on("eager", reason, self.gm.forward)

    def run_on(self, route: str, reason: str, fn: CompiledFn | None = None) -> None:
        """Move this region to ``route`` for good (``fn``: its compiled region, or
        None to compile it on the next call); ``reason`` says why its route lost."""
        with self._lock:
            self._reorder([route], {self.chain[0]: reason})
            self.run.inner_route = None
            self._fn = fn

    def candidate(self, route: str, args: Sequence[Any]) -> CompiledFn | None:
        """This region compiled by ``route`` and checked against torch on ``args``;
        None, with the reason in ``measured``, where either fails."""
        try:
            with using(self.cache), _disable_current_modes(), COMPILE_LOCK:
                fn = self._compile(route, args)
                check_close(self.gm(*args), fn(*args))
        except Exception as error:  # a failing candidate loses; it never breaks the region
            self.run.measured[route] = f"not measured: {error_line(error)}"
            return None
        return fn

    def _after_failure(self, failed: CompiledFn, error: Exception, args: Sequence[Any]) -> Any:
        """This call's result from torch, the route dropped; or, where torch refuses
        the call too (an index out of range, an integer divided by zero), torch's
        error, the route kept: the call was wrong, not the route. Dropping it
        there ran every later call of the region eagerly."""
        expected = self.gm(*args)
        with self._lock:
            if self._fn is failed:  # another thread may have moved on already
                self._fn = None
                self.next_route("run", error)
        return expected

    def next_route(self, stage: str, error: Exception) -> None:
        """Drop the failed route: warn once and go on with the next, or raise under strict."""
        failed = self.chain.pop(0)
        plan, run = self.plan, self.run
        detail = error_line(error, 300)
        run.rejected[failed] = f"{stage} failed: {detail}"
        ops = ", ".join(plan.ops[:4]) + ("..." if len(plan.ops) > 4 else "")
        where = f"region {plan.name} of graph {plan.graph} ({len(plan.ops)} op kinds: {ops}) on {', '.join(sorted(plan.devices))}"
        if not self.chain:
            raise RouteFailedError(
                f"route {failed!r} failed to {stage} {where} and strict mode allows no fallback: "
                f"{detail}. Instead: {fallback_advice(self.config)}."
            ) from error
        run.route = self.chain[0]
        run.fallbacks = tuple(self.chain[1:])
        if not registry.get(run.route).wraps:
            run.inner_route = None
        warnings.warn(
            f"dispatch: route {failed!r} failed to {stage} {where}: {detail}; "
            f"this region now runs on {run.route!r}",
            FallbackWarning,
            stacklevel=3,
        )
