"""When inductor is worth compiling beside ONNX Runtime: the share of all eager's
time past which a graph's ORT regions are timed against inductor.

Compiling inductor costs seconds, so a graph whose ORT regions run well under
eager's time keeps them untimed against it. How far under depends on what the
regions do: where they are matmul-bound, ORT's lead holds; where most of their
ops are fine, many and small, or only move data, inductor fuses what ORT runs
one op at a time. The shares were measured on the zoo's models; the numbers
behind each are beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch.fx

from .stitch import RegionRunner
from .work import convolution_flops, data_moved, estimated_flops, loop_ops

CUTTING_ROUTE = "onnxrt"  # runs on threads of its own: its regions contend with the eager ones
# Inductor is tried as well (compiled by the check, or left to the in-place
# trial: graph_tuning) only where ORT ran the graph in more than this share of
# eager's time. Inductor ran the zoo's CPU graphs in 0.6 to
# 0.85 of eager's time, so past it inductor may well win. And a graph timed
# alone flatters ORT: layer_graph_break's layer measured 0.89 to 0.94 of
# eager's time there in three cold starts of five, and ran at 1.11 in the
# model (four weight sets, four sessions); at 1.0 it stayed on ORT, 1.40x
# inductor's time. Below it ORT's lead rarely repays a compile of seconds. The
# price, where it is tried: a cold start of hf_bert took 18.5 s against 3.4
# (ORT kept by measurement).
INDUCTOR_PAST_EAGER_SHARE = 0.8
# From this lower share where the ORT regions average under FINE_OP_FLOPS an op:
# many ops besides the matmuls, which inductor fuses and ORT runs one by one.
# Mamba-2 (195 ops of 0.35 MFLOP, ORT at 0.64: 1.53 ms a call against plain
# inductor's 1.05) and Longformer's encoder (230 ops of 0.33 MFLOP, ORT at 0.70;
# inductor 0.41 of ORT's time) stayed on ORT at 0.8. The encoders near 0.6 are
# matmul-bound and faster on ORT (BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT,
# BART, DeBERTa-v2: 1.2 to 2.2 MFLOP an op; at 0.6 for all, DistilBERT's and
# DeBERTa-v2's cold starts compiled inductor in vain, 13.9 and 16.0 s against
# 3.2 for BERT's).
INDUCTOR_PAST_EAGER_SHARE_FINE_OPS = 0.6
FINE_OP_FLOPS = 600_000
# And from any share where the graph is a long chain of small ops: at least
# MANY_OPS computing ops in its ORT regions, doing under SMALL_OP_FLOPS each on
# average. That is a recurrence unrolled by Dynamo, where ORT pays its per-op
# cost on every op and inductor fuses them: transformers' RWKV (3595 ops of 22
# kFLOP) ran in 0.33 of eager's time on ORT, 3.3 ms, and in 1.34 ms under plain
# inductor. The ordinary networks of the zoo run 100 to 400 ops of 0.1 to 2
# MFLOP; hf_levit's 154 ops of 21 kFLOP run faster on ORT (488 µs against
# inductor's 760).
MANY_OPS = 500
SMALL_OP_FLOPS = 50_000
# And from a lower share still where the ORT regions mostly move data: their
# permutes, copies, concatenations and gathers write at least
# MOVED_BYTES_PER_KFLOP bytes per thousand FLOPs of their matmuls. ORT runs each
# as a kernel of its own, where inductor folds them into the kernels that read
# them. In ORT's own profile XLNet's Transposes and Gathers took 44% of its
# time (85 bytes a kFLOP; ORT at 0.52-0.62 of eager and 1.2-1.45x plain
# inductor's time), ConvBERT's 42% (51; 0.51-0.61, 1.13x), and BERT's, GPT-2's
# and DeBERTa-v2's 8-9% (12 to 25). The models past the line where ORT leads
# inductor ran ORT at 0.44 of eager or less (Swin 43, PVT v2 41, SqueezeBERT
# 59, EfficientViT 51), so the share still decides.
INDUCTOR_PAST_EAGER_SHARE_MOVING = 0.5
MOVED_BYTES_PER_KFLOP = 40
# ORT regions whose convolutions do at least this share of their FLOPs
# (``conv_bound``): in the graphs measured the share sat at 0.93 to 1.0 for the
# CNNs (ResNet-18, DLA, ResNeSt, BoTNet, EfficientNet-B0, ConvNeXt, a small
# U-Net, a 1-D audio stack) and at 0.05 or under for the transformers, with
# wav2vec2 (0.28), ViT-MAE (0.40) and SEW (0.67, its convolutional feature
# encoder) between.
CONV_BOUND_SHARE = 0.5

# A graph under ``trial_margins.INDUCTOR_TRIAL_S`` a call still tries inductor,
# however far ORT leads, where its ORT regions are mostly loops (``mostly_loops``,
# ``work.loop_ops``): at least LOOP_OPS ops that inductor writes as loops, and
# LOOPS_PER_RUN of them on average between two ops that run a library kernel
# (matmuls, convolutions, sorts, attention: each ends a run of loops that inductor
# fuses). Run as traced each such op costs a dispatch of a few µs, and on ORT
# about one, for little work; inductor runs a run of them as one loop nest.
# Measured in the zoo (Intel Xeon, AVX-512, 2 cores, 2026-12-06; loops a run;
# auto's time before the rule, on the route it kept; plain inductor's):
#   einsum_masked 5.0, as traced 68.3 µs, inductor 31.9; masked_positions 6.0,
#   as traced 64.5, inductor 37.1; smoothed_cross_entropy 8.0, as traced 80.1,
#   inductor 56.8; focal_loss 8.0, ORT 35.1 (at 0.50 of the traced graph's
#   time in place), inductor 28.6; contrastive_loss 3.75, as traced 73.5,
#   inductor 43.3; box_decoder 10.5 and top2_router 5.0 moved to inductor.
# Under 3.5 a run ORT ran faster than inductor: python_loop 3.4 (93.6 against
# 104.8), pixel_shuffle 3.3 (86.0 against 129.7), swiglu_block 2.3,
# masked_attention 2.0; and under LOOP_OPS loops inductor ran no faster than
# the traced graph (inplace_input, 5: 42.5 against the floor's 43.7;
# dict_list_outputs, data_dependent, topk_scatter). The line between 3.4 and
# 3.75 is thin; a graph tried in vain costs an inductor compile once (about
# 6 s), one left out its per-call time on every call.
LOOP_OPS = 8
LOOPS_PER_RUN = 3.5
# Where the traced graph led ORT, auto would run the graph at the floor, and
# only inductor can run it faster: it is tried where it would fuse away
# FUSED_AWAY_OPS of the traced graph's dispatches or more (``fused_away_ops``:
# each run of loop ops between two kernels becomes one loop nest, so at least
# the loop ops past one per run go). Measured (AMD EPYC, AVX-512, 2 cores,
# 2026-12-07; one process each, in turn; auto before the rule against plain
# inductor): inplace_input (5 loop ops, 1 matmul: 3 fused away) ran as traced
# at 60.8 µs against inductor's 44.0 (with the rule: 47.7 against 47.9), as on
# this kind of machine before (73.0 against 57.6; 35.6 against 32.1). With
# every such graph tried, whatever its loops, those where inductor fuses away
# 1 op or none gained 4% or less: data_dependent's three graphs (the model
# 259.6 µs against the floor's 265.1), dict_list_outputs (inductor 79.9
# against the floor's 71.4) and topk_scatter (5 loop ops among 4 kernels). On
# an Intel Xeon inductor and the traced graph tied on inplace_input (42.5
# against 43.7 µs): there the rule costs one inductor compile on a later call,
# whose losing decision is cached.
FUSED_AWAY_OPS = 3


def onnx_work(runners: Sequence[RegionRunner]) -> int | None:
    """The FLOPs of the ONNX Runtime regions among ``runners`` (0 with none); None
    where a region's work is unknown (a symbolic size)."""
    return _onnx_total(runners, estimated_flops)


def _onnx_total(
    runners: Sequence[RegionRunner], measure: Callable[[torch.fx.GraphModule], int | None]
) -> int | None:
    """``measure`` summed over the ONNX Runtime regions among ``runners`` (0 with
    none); None where it is None for one of them."""
    counts = [measure(gm) for gm in _onnx_graphs(runners)]
    return None if None in counts else sum(c for c in counts if c is not None)


def _onnx_graphs(runners: Sequence[RegionRunner]) -> list[torch.fx.GraphModule]:
    """The graphs of the ONNX Runtime regions among ``runners``."""
    return [r.gm for r in runners if r.chain[0] == CUTTING_ROUTE]


def many_small_ops(runners: Sequence[RegionRunner]) -> bool:
    """Whether the ONNX Runtime regions among ``runners`` are a long chain of small
    ops (``MANY_OPS``, ``SMALL_OP_FLOPS``): inductor is then timed against them
    however far ORT leads eager."""
    return _many_small(_onnx_ops(runners), onnx_work(runners))


def _many_small(ops: int, work: int | None) -> bool:
    return work is not None and ops >= MANY_OPS and work < SMALL_OP_FLOPS * ops


@dataclass(frozen=True)
class InductorBar:
    """The share of all eager's time past which ORT's regions are timed against
    inductor, and for which regions that share holds (shown in ``explain``)."""

    share: float
    regions: str = ""


def inductor_past(runners: Sequence[RegionRunner], work: int | None) -> InductorBar:
    """The share of all eager's time past which ORT's regions among ``runners``
    (doing ``work``, their ``onnx_work``) are timed against inductor: none for many
    small ops, lower ones for regions that mostly move data and for fine ops."""
    ops = _onnx_ops(runners)
    if _many_small(ops, work):
        return InductorBar(0.0, "of many small ops")
    if moves_much(runners):
        return InductorBar(INDUCTOR_PAST_EAGER_SHARE_MOVING, "that mostly move data")
    if work is not None and work < FINE_OP_FLOPS * ops:
        return InductorBar(INDUCTOR_PAST_EAGER_SHARE_FINE_OPS, "of fine ops")
    return InductorBar(INDUCTOR_PAST_EAGER_SHARE)


def mostly_loops(runners: Sequence[RegionRunner]) -> bool:
    """Whether the ONNX Runtime regions among ``runners`` are mostly ops inductor
    writes as loops (``LOOP_OPS``, ``LOOPS_PER_RUN``): a small graph of them
    runs faster as a few fused loop nests than op by op."""
    counts = _loop_counts(runners)
    loops, kernels = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return loops >= LOOP_OPS and loops >= LOOPS_PER_RUN * (kernels + 1)


def fused_away_ops(runners: Sequence[RegionRunner]) -> int:
    """The fewest dispatches of the traced graph that inductor would fuse away in
    the ONNX Runtime regions among ``runners``: each region's loop ops past one per
    run of them between its kernels (``FUSED_AWAY_OPS``)."""
    return sum(max(0, loops - (kernels + 1)) for loops, kernels in _loop_counts(runners))


def _loop_counts(runners: Sequence[RegionRunner]) -> list[tuple[int, int]]:
    """``work.loop_ops`` of each ONNX Runtime region among ``runners``."""
    return [loop_ops(gm) for gm in _onnx_graphs(runners)]


def moves_much(runners: Sequence[RegionRunner]) -> bool:
    """Whether the ONNX Runtime regions among ``runners`` move at least
    ``MOVED_BYTES_PER_KFLOP`` bytes per thousand matmul FLOPs; False where a size is
    symbolic."""
    counts = _onnx_data_moved(runners)
    if counts is None:
        return False
    moved, matmul = counts
    return moved > 0 and moved * 1000 >= MOVED_BYTES_PER_KFLOP * matmul


def conv_bound(runners: Sequence[RegionRunner]) -> bool:
    """Whether convolutions do at least ``CONV_BOUND_SHARE`` of the ONNX Runtime
    regions' FLOPs among ``runners``: inductor on CPU runs a convolution as the
    traced graph does (ATen's oneDNN kernel, an extern call it fuses nothing
    into), so where ORT leads the traced graph it leads in those kernels.
    False where there is no such region or a size is symbolic."""
    work = onnx_work(runners)
    if not work:
        return False
    convolutions = _onnx_total(runners, convolution_flops)
    return convolutions is not None and convolutions >= CONV_BOUND_SHARE * work


def without_matmuls(runners: Sequence[RegionRunner]) -> bool:
    """Whether the ONNX Runtime regions among ``runners`` hold no matmul and no
    convolution: ORT's lead over inductor is in those kernels. Longformer's
    embedding graph (gathers, adds, a layer norm; 31 ops) ran on ORT in 0.42 to
    0.55 of the traced graph's time, from one process to the next, and in 2.2x
    inductor's (124-147 against 56-58 µs), which fuses it into a few loops.
    False where there is no such region or a size is symbolic."""
    counts = _onnx_data_moved(runners)
    return counts is not None and counts[1] == 0 and any(r.chain[0] == CUTTING_ROUTE for r in runners)


def _onnx_data_moved(runners: Sequence[RegionRunner]) -> tuple[int, int] | None:
    """``work.data_moved`` summed over the ONNX Runtime regions among ``runners``
    ((0, 0) with none); None where a size is symbolic."""
    moved = matmul = 0
    for gm in _onnx_graphs(runners):
        counts = data_moved(gm)
        if counts is None:
            return None
        moved, matmul = moved + counts[0], matmul + counts[1]
    return moved, matmul


def _onnx_ops(runners: Sequence[RegionRunner]) -> int:
    return sum(r.plan.node_count for r in runners if r.chain[0] == CUTTING_ROUTE)
