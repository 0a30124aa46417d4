"""Hand kernels inside inductor's graph, kept only where the whole graph runs faster with them.

Under autotune, a Dynamo graph that inductor compiles whole (CUDA inference;
on CPU only under the Triton interpreter, for tests) is compiled by inductor
again with a decomposition table in which softmax and layer norm become the
ops of their ``kernels/`` (``routes/triton_ops.py``) wherever the kernel takes
their inputs; inductor calls them as extern kernels inside its one graph,
fusing the ops around them, captured alike. A graph that holds both families
is also compiled with each family alone: on an H100 the softmax kernel beat
inductor's and the layer norm kernel lost to it, so all-or-nothing would
throw the winner away with the loser. The first call with real inputs checks
each program against inductor's own and times them all in turn on those
inputs (``autotune.measure``, the device synchronised); the fastest
serves every later call, and ``explain`` shows every time. So a kernel is
judged by what it does to the whole graph, the fusions it breaks included,
never by itself. The decision is stored in the persistent cache: a warm start
measures nothing, and compiles only the families that won.

Why a decomposition table and not the triton route's pattern matcher: inductor
decomposes ``_softmax`` and ``native_layer_norm`` while AOTAutograd traces, so
the aten graph it compiles no longer holds the patterns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.fx

from .autotune import flat_outputs, format_seconds, measure
from .cache import ArtifactCache, region_key, timing_context
from .config import Config
from .cpu_contention import NOT_CACHED
from .errors import error_line
from .planner import availability
from .region import Region
from .routes.registry import registry
from .routes.triton_checks import FLOATS
from .routes.triton_ops import kernel_ops

log = logging.getLogger("dispatch")
aten = torch.ops.aten

TRITON = "triton"
_KIND = "kernel_trial"  # the persistent cache's entries of decisions
#: the kernel families that replace one aten op each, in the order they are reported
FAMILIES = ("softmax", "layer_norm")
PLAIN = "plain"  # inductor's graph as it is, among the candidates timed


def trials_kernels(config: Config, device: str) -> bool:
    """Whether an inductor graph on ``device`` tries the kernels inlined: under
    autotune, where the triton route is allowed, installed and serves ``device``."""
    if not config.autotune or not config.allows(TRITON):
        return False
    route = registry.get(TRITON)
    return availability(route).ok and route.serves_device(device)


def kernel_decompositions(
    used: list[str], families: Sequence[str] = FAMILIES
) -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table, with the ``families`` among softmax and layer
    norm decomposed into their kernels' ops where the kernel takes the inputs
    (each op so decomposed appends its family's name to ``used``)."""
    from torch._inductor.decomposition import select_decomp_table

    from .kernels.layer_norm import stats_dtype_for

    table = dict(select_decomp_table())
    ops = kernel_ops()
    softmax, layer_norm = aten._softmax.default, aten.native_layer_norm.default
    plain_softmax, plain_layer_norm = table[softmax], table[layer_norm]

    def softmax_kernel(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
        if "softmax" not in families or half_to_float or not _rows(x) or dim not in (-1, x.dim() - 1):
            return plain_softmax(x, dim, half_to_float)
        used.append("softmax")
        return ops["softmax"](x)

    def layer_norm_kernel(x: torch.Tensor, shape: list[int], weight: Any, bias: Any, eps: float) -> Any:
        takes = (
            "layer_norm" in families and _rows(x) and tuple(x.shape[x.dim() - len(shape) :]) == tuple(shape)
        )
        if not takes or any(t is not None and (t.dtype != x.dtype or not _rows(t)) for t in (weight, bias)):
            return plain_layer_norm(x, shape, weight, bias, eps)
        used.append("layer_norm")
        return ops["layer_norm"](x, list(shape), weight, bias, eps, stats_dtype_for(x))

    table[softmax], table[layer_norm] = softmax_kernel, layer_norm_kernel
    return table


def _rows(x: torch.Tensor) -> bool:
    """A tensor the row kernels take: static shape, contiguous, a float dtype they compute in."""
    return (
        x.dim() >= 1
        and all(type(n) is int for n in x.shape)
        and x.numel() > 0
        and x.dtype in FLOATS
        and x.is_contiguous()
    )


def trial_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    return region_key(
        gm,
        _KIND,
        [(tuple(t.shape), t.dtype, t.device.type) for t in example_inputs if isinstance(t, torch.Tensor)],
        timing_context(),
    )


def stored_decision(cache_dir: Path, key: str) -> dict[str, Any] | None:
    """The decision stored for ``key``; None where there is none, or where an
    older dispatch stored one choice for every family together."""
    record = ArtifactCache(cache_dir).get_json(_KIND, key)
    return record if isinstance(record, dict) and isinstance(record.get("chosen"), list) else None


def stored_chosen(stored: dict[str, Any]) -> tuple[str, ...]:
    """The families that won, as a stored decision names them (known names only)."""
    return families_of([str(name) for name in stored["chosen"]])


def stored_measured(stored: dict[str, Any]) -> dict[str, str]:
    measured = stored.get("measured")
    return {str(k): str(v) for k, v in measured.items()} if isinstance(measured, dict) else {}


def stored_kernels(stored: dict[str, Any]) -> list[str]:
    kernels = stored.get("kernels")
    return [str(k) for k in kernels] if isinstance(kernels, list) else []


def families_of(kernels: Sequence[str]) -> tuple[str, ...]:
    """The families among ``kernels`` (a family's name per op decomposed), in report order."""
    return tuple(family for family in FAMILIES if family in kernels)


def candidate_families(kernels: Sequence[str]) -> list[tuple[str, ...]]:
    """What to try beside inductor's graph as it is: every family the graph holds
    together and, where it holds several, each family alone."""
    every = families_of(kernels)
    return [every, *((family,) for family in every)] if len(every) > 1 else [every]


def summary(kernels: Sequence[str]) -> str:
    counts = {name: kernels.count(name) for name in dict.fromkeys(kernels)}
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.items())


class TrialRecord:
    """The region of a graph under trial, as ``explain`` reads it (``GraphRecord``'s outcome)."""

    def __init__(self, region: Region) -> None:
        self.region = region

    def outcome(self) -> list[Region]:
        return [self.region]

    def settle(
        self,
        kernels: Sequence[str],
        chosen: Sequence[str],
        measured: dict[str, str],
        failure: str | None = None,
    ) -> None:
        """Record the trial's outcome (``decided``) and say it in the log."""
        self.region = decided(self.region, kernels, chosen, measured, failure)
        outcome = [f"inlined: {', '.join(chosen)}"] if chosen else []
        outcome += [self.region.rejected[TRITON]] if TRITON in self.region.rejected else []
        log.info("graph %d: kernels/ %s", self.region.graph, "; ".join(outcome))


class KernelTrial:
    """A Dynamo graph's program: inductor's as it is (``plain``) or one of the programs
    with some kernel families inlined (``inlined``, by family), whichever ran
    fastest on the first real inputs."""

    def __init__(
        self,
        plain: Callable[..., Any],
        inlined: dict[tuple[str, ...], Callable[..., Any]],
        kernels: list[str],
        record: TrialRecord,
        cache_dir: Path,
        key: str,
    ) -> None:
        self.plain, self.inlined, self.kernels = plain, inlined, kernels
        self.record = record
        self.cache_dir, self.key = cache_dir, key
        self.chosen: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if self.chosen is None:
            with self._lock:
                if self.chosen is None:
                    self._decide(args)
        assert self.chosen is not None
        return self.chosen(*args)

    def _decide(self, args: Sequence[Any]) -> None:
        region = self.record.region
        labels = {", ".join(families): families for families in self.inlined}
        programs = {PLAIN: self.plain, **{name: self.inlined[labels[name]] for name in labels}}

        def expected() -> list[Any]:
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in flat_outputs(self.plain(*args))]

        def flattened(name: str) -> Callable[..., Any]:
            program = programs[name]
            return lambda *a: flat_outputs(program(*a))

        try:
            tuning = measure(list(programs), flattened, expected, args)
        except Exception as error:  # inductor's own program raises: the user sees it on the call
            self.settle((), {}, f"inductor's graph failed before the kernels were tried: {error_line(error)}")
            return
        seconds = tuning.seconds
        failures = [
            f"{name} inlined in inductor's graph failed: {tuning.reasons[name].removeprefix('not measured: ')}"
            for name in labels
            if name not in seconds
        ]
        failure = "; ".join(failures) or None
        if PLAIN not in seconds or len(seconds) == 1:
            self.settle((), {}, failure)
            return
        chosen = labels.get(tuning.best or PLAIN, ())  # inductor's own graph wins a tie
        measured = {region.inner_route or region.route: format_seconds(seconds[PLAIN])}
        for name, families in labels.items():
            if name in seconds:
                ops = [kernel for kernel in self.kernels if kernel in families]
                measured[f"{TRITON} ({summary(ops)} inlined)"] = format_seconds(seconds[name])
        if tuning.not_cached is not None:
            measured[NOT_CACHED] = tuning.not_cached
        else:
            record = {"chosen": list(chosen), "measured": measured, "kernels": self.kernels}
            ArtifactCache(self.cache_dir).put_json(_KIND, self.key, record)
        self.settle(chosen, measured, failure)

    def settle(self, chosen: tuple[str, ...], measured: dict[str, str], failure: str | None = None) -> None:
        """Serve the winner from now on, and record why."""
        self.chosen = self.inlined[chosen] if chosen else self.plain
        self.record.settle(self.kernels, chosen, measured, failure)


def decided(
    region: Region,
    kernels: Sequence[str],
    chosen: Sequence[str],
    measured: dict[str, str],
    failure: str | None = None,
) -> Region:
    """``region`` with the trial's outcome: the times, the families inlined, and why
    triton's kernels are not in its graph (none won, or a candidate failed)."""
    rejected = {k: v for k, v in region.rejected.items() if k != TRITON}
    reasons = [failure] if failure else []
    if not chosen and (measured or not reasons):
        slower = f"kernels/ ({summary(kernels)}) inlined in inductor's graph measured slower as a whole graph"
        reasons.insert(0, slower)
    if reasons:
        rejected[TRITON] = "; ".join(reasons)
    ops = (*(f"{TRITON}:{family}" for family in chosen), *region.ops)
    return replace(region, rejected=rejected, measured=dict(measured), ops=tuple(ops))
