"""The default route order per (device, graph kind), and why.

These are the rules ``auto`` follows when the user forces nothing. The numbers
behind them are in ``benchmarks/README.md``; each rule carries the reason that
``explain`` shows for the routes it leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .inspect import GRAPH_BACKWARD, GRAPH_FORWARD, GRAPH_INFERENCE


@dataclass(frozen=True)
class Rule:
    routes: tuple[str, ...]
    reason: str


_CPU_INFERENCE = Rule(
    ("onnxrt", "eager"),
    "CPU inference: ONNX Runtime runs what it can; eager runs the rest, it beat inductor "
    "there by measurement (benchmarks/README.md)",
)
_CPU_INFERENCE_BFLOAT16 = Rule(
    ("inductor", "eager"),
    "CPU inference in bfloat16: ONNX Runtime's CPU provider runs no bfloat16 here, and inductor ran "
    "most such graphs faster than eager; each is timed against eager on its first call "
    "(benchmarks/README.md)",
)
_CPU_UPDATE_STEP = Rule(
    ("inductor", "eager"),
    "CPU update step (it writes its inputs in place and multiplies no matrices: an optimizer's "
    "step, an average of weights): inductor writes them in place in fused loops, where ONNX Runtime "
    "returns each as a new tensor to copy back (benchmarks/README.md)",
)
_CPU_TRAINING = Rule(
    ("inductor", "eager"),
    "CPU training: inductor compiles forward and backward graphs; ONNX Runtime runs inference only; "
    "each graph's step is timed against eager on its first call (benchmarks/README.md)",
)
_CUDA_INFERENCE = Rule(
    ("inductor", "eager", "cudagraphs"),
    "CUDA inference starts from torch's best (mode='reduce-overhead'): the graph on inductor, "
    "replayed as CUDA graphs where capture is safe; kernels/ (triton) and ONNX Runtime cut "
    "inductor's fusion and ran slower on every real model measured on an H100 "
    "(../shared/gpu/2026-11-23-h100.md), so they run only where forced or measured (autotune)",
)
_CUDA_TRAINING = Rule(("inductor", "eager"), "CUDA training: inductor compiles forward and backward graphs")
_NOT_YET = Rule(("eager",), "this version routes {device} graphs to eager")
_MPS = Rule(("eager",), "mps graphs run eager: inductor does not serve mps, ONNX Runtime has no mps provider")

RULES: dict[tuple[str, str], Rule] = {
    ("cpu", GRAPH_INFERENCE): _CPU_INFERENCE,
    ("cpu", GRAPH_FORWARD): _CPU_TRAINING,
    ("cpu", GRAPH_BACKWARD): _CPU_TRAINING,
    ("cuda", GRAPH_INFERENCE): _CUDA_INFERENCE,
    ("cuda", GRAPH_FORWARD): _CUDA_TRAINING,
    ("cuda", GRAPH_BACKWARD): _CUDA_TRAINING,
    ("mps", GRAPH_INFERENCE): _MPS,
    ("mps", GRAPH_FORWARD): _MPS,
    ("mps", GRAPH_BACKWARD): _MPS,
}


# Where a graph computes in bfloat16 (a bfloat16 model, or autocast to it), these
# replace the rules above: the rule's first route could not run its arithmetic.
BFLOAT16_RULES: dict[tuple[str, str], Rule] = {("cpu", GRAPH_INFERENCE): _CPU_INFERENCE_BFLOAT16}
# Where a graph is an update step (``update_step.py``), these replace the rules above.
UPDATE_STEP_RULES: dict[tuple[str, str], Rule] = {("cpu", GRAPH_INFERENCE): _CPU_UPDATE_STEP}


def default_rule(device: str, kind: str, bfloat16: bool = False, update_step: bool = False) -> Rule:
    """The rule for ``device``/``kind``; ``bfloat16``: the graph computes in bfloat16;
    ``update_step``: it writes its inputs in place and multiplies no matrices."""
    rule = (
        (UPDATE_STEP_RULES.get((device, kind)) if update_step else None)
        or (BFLOAT16_RULES.get((device, kind)) if bfloat16 else None)
        or RULES.get((device, kind))
    )
    if rule is None:
        return Rule(_NOT_YET.routes, _NOT_YET.reason.format(device=device))
    return rule
