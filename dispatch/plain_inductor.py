"""A Dynamo graph compiled as ``torch.compile(backend="inductor")`` compiles it:
the in-place trial's inductor side (``graph_trial.py``).

The graph after ``auto``'s AOTAutograd pass, compiled by inductor, is not what
plain inductor runs: inductor lowers it through AOTAutograd a second time, under
ONNX-friendly decompositions, and the inputs it updates in place are copied back
outside inductor's program instead of inside its kernels. On the zoo's
inplace_input model (a ``sub_`` of its input and a buffer's ``add_`` around a
linear layer; AMD EPYC, AVX2, 2 cores) the graph so compiled ran in place in
153 µs a call, the traced graph in 152, so ``auto`` kept the traced graph and
ran the model 1.19x slower than plain inductor; plain inductor's program of the
same graph ran in 119 to 145 µs against 146 to 163 as traced (four processes).
Compiled from the Dynamo graph itself, inductor's side of the trial is plain
inductor's program, by construction. It needs the inputs the graph updates in
place (AOTAutograd's view, ``backend.py``): a graph served from the stored aten
graphs (``aten_cache.py``) tries inductor on the graph as split instead.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from .autotune import check_close
from .config import Config
from .errors import error_line
from .inductor_start import prepare_inductor
from .routes import CompiledFn
from .routes.inductor import compiled_per_shape_class
from .stitch import FallbackWarning
from .whole_inductor import compiling_whole_graph

PLAIN_INDUCTOR = "graph as plain inductor compiles it"


def compile_plain(traced: torch.fx.GraphModule, args: Sequence[Any], config: Config) -> CompiledFn:
    """``traced`` (a Dynamo graph) compiled by inductor's ``compile_fx`` for ``args``.

    On fakes of them with a shape environment, as the inductor route compiles a
    region (``routes/inductor.fake_inputs``): on the real tensors inductor's FX
    graph cache and AOTAutograd's both bypass the graph ("No shape env"), and a
    warm start that ran the graph so did all of inductor's codegen again
    (Falcon: 12.3 s to its first result; 6.5 s so, as for plain inductor on the
    same cache). Inductor's vector-ISA probe is answered from dispatch's cache
    (``inductor_isa.py``), as for the inductor route: unanswered, its child
    processes took 2.2 s of a warm start's 5.3 (Falcon, Xeon with AMX).

    That shape environment is this program's own, not Dynamo's, so what inductor
    assumed of the symbolic sizes there is checked on each call, as for an
    inductor region (``routes/inductor.compiled_per_shape_class``): a call that
    breaks it gets a program compiled for its shapes, and past
    ``MAX_SHAPE_CLASSES`` runs as traced. Unchecked, a ``torch.cond`` graph
    compiled on a batch of 2 returned 2 rows for every batch after it.

    Returned without the ``torch._dynamo.disable`` wrapper ``compile_fx`` puts
    around its program: it runs only inside auto's callable, which Dynamo already
    runs disabled, and the second wrapper cost 0.65 µs a call (focal_loss's
    program, 11.2 against 10.6 µs; Xeon, 2 cores), 2-3% of a small graph's call."""
    from torch._dynamo.eval_frame import innermost_fn
    from torch._inductor.compile_fx import compile_fx

    def compile_fakes(fakes: list[Any], call_args: Sequence[Any]) -> CompiledFn:
        with compiling_whole_graph(config):
            prepare_inductor(call_args)
            _in_canonical_order(traced)
            compiled = compile_fx(traced, fakes)
        assert callable(compiled), f"inductor returned {type(compiled).__name__}, not a program"
        return innermost_fn(compiled)

    placeholders = traced.graph.find_nodes(op="placeholder")
    return compiled_per_shape_class(placeholders, args, compile_fakes, traced.forward)


def _in_canonical_order(traced: torch.fx.GraphModule) -> None:
    """``traced``'s attributes as every process has them when it compiles.

    AOTAutograd's cache key pickles the graph module's ``__dict__`` in insertion
    order. A Dynamo graph writes its code on its first run (a lazy graph module),
    and the key adds the fields it clears where they are absent, so the same
    graph got another key when it had run before its compile (the trial, after
    the graph ran as traced) than when it had not (a warm start compiling it on
    its first call). hf_mixtral's warm start then missed the cache and ran
    AOTAutograd and inductor's graph passes again: 3.0 s to its first result
    against 2.4 on a hit (Xeon, 2 cores). Written, filled and sorted here, every
    process pickles the same bytes for the same graph."""
    from torch._functorch._aot_autograd.autograd_cache import sanitize_gm_for_cache
    from torch.fx._lazy_graph_module import _LazyGraphModule

    _LazyGraphModule.force_recompile(traced)
    with sanitize_gm_for_cache(traced):  # leaves each field it clears present
        pass
    # Swapped whole, not cleared and refilled: a thread running the graph as
    # traced meanwhile sees one complete set of attributes or the other.
    object.__setattr__(traced, "__dict__", dict(sorted(traced.__dict__.items())))


def checked_plain_call(
    routed: Callable[..., Any],
    traced: torch.fx.GraphModule,
    args: Sequence[Any],
    mutated: frozenset[int],
    config: Config,
) -> tuple[Any, CompiledFn | None, str | None]:
    """This call run by ``routed`` (its result first), and ``traced`` compiled as
    plain inductor, checked against that call: run on copies, taken before the
    call, of the inputs the graph updates in place (``mutated``), so that the
    user's tensors are updated once; else None and why."""
    before = {i: args[i].clone() for i in mutated}
    out = routed(*args)
    try:
        fn = compile_plain(traced, args, config)
        with _disable_current_modes():
            got = fn(*[before.get(i, arg) for i, arg in enumerate(args)])
            check_close(list(out), list(got))
            check_close([args[i] for i in before], list(before.values()))
    except Exception as error:  # a failing candidate loses; the split graph is tried instead
        return out, None, f"not measured: {error_line(error)}"
    return out, fn, None


def plain_on_first_call(traced: torch.fx.GraphModule, config: Config, graph_index: int) -> Callable[..., Any]:
    """``traced`` compiled as plain inductor on its first call's inputs (a warm
    start: inductor's cache serves it); where inductor fails there, one warning,
    and the graph runs as traced."""
    lock = threading.Lock()
    compiled: list[Callable[..., Any]] = []

    def first(*args: Any) -> Any:
        if not compiled:
            with lock:
                if not compiled:
                    compiled.append(_plain_or_traced(traced, args, config, graph_index))
        return compiled[0](*args)

    return first


def _plain_or_traced(
    traced: torch.fx.GraphModule, args: Sequence[Any], config: Config, graph_index: int
) -> Callable[..., Any]:
    try:
        return compile_plain(traced, args, config)
    except Exception as error:
        warnings.warn(
            f"dispatch: inductor failed to compile graph {graph_index}: {error_line(error, 300)}; "
            "it now runs as Dynamo traced it",
            FallbackWarning,
            stacklevel=4,
        )
        return traced.forward
