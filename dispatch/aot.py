"""AOTAutograd for ``auto``: what torch's ``aot_autograd`` backend helper does, less one import.

The helper (``torch._dynamo.backends.common.aot_autograd``) imports
``torch._inductor.debug`` on every compile, for a logging context only; that
pulls in Inductor's IR and scheduler: 0.34 s of a 0.9 s warm start of the
1024-wide MLP (``python -X importtime``), in a backend that may never run
Inductor. Everything else it does is kept here, through the same torch
functions:

- graphs with list, tuple or dict inputs are flattened first;
- ``counters["aot_autograd"]`` is bumped, which Dynamo's DDP optimizer reads to
  learn that a bucket went through AOTAutograd (it then hands each bucket's
  metadata to the runtime);
- the backward compiler and the compiled graph run outside Dynamo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx


def aot_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Callable[..., Any],
    bw_compiler: Callable[..., Any],
    inference_compiler: Callable[..., Any],
    decompositions: dict[Any, Callable[..., Any]] | None,
) -> Callable[..., Any]:
    """Lower ``gm`` through AOTAutograd; the compilers get its aten graphs."""
    from torch._dynamo import disable
    from torch._dynamo.utils import counters, flatten_graph_inputs
    from torch._functorch.aot_autograd import aot_module_simplified

    compilers: dict[str, Any] = {
        "fw_compiler": fw_compiler,
        "bw_compiler": bw_compiler,
        "inference_compiler": inference_compiler,
        "decompositions": decompositions,
    }
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, functools.partial(aot_compile, **compilers))

    def backward(*args: Any, **kwargs: Any) -> Any:
        compiled = disable(bw_compiler, reason="do not trace the backward compiler")(*args, **kwargs)
        return disable(compiled, reason="do not trace the compiled backward graph")

    counters["aot_autograd"]["total"] += 1
    try:
        compiled = aot_module_simplified(gm, example_inputs, **{**compilers, "bw_compiler": backward})
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled, reason="do not trace the AOT-compiled graph")
