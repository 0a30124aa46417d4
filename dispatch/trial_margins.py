"""What each side of the in-place trial (``graph_trial``) must win by, and when
inductor is tried there: the margins, each with the measurement that set it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx

ROUTED_MARGIN = 0.9  # the routed program must take under this share of the traced graph's time
# The faster side's median call at or past which inductor is tried too. Below it
# the graph runs in tens of µs, where Dynamo's own call and the stitching are
# much of the time, and an inductor compile of seconds takes days of calls to
# repay. At 1 ms Longformer's embedding graph (31 ops; 147 µs on ORT, 297 as
# traced) never tried inductor, and the model ran 1.18x plain inductor's time
# in turn (1025 against 870 µs); at 100 µs it moved to inductor, 1.05x (880
# against 838). The zoo's code patterns and small CNNs (graph_break,
# layer_graph_break, data_dependent, python_loop, dict_list_outputs, hf_vit,
# hf_mobilenet_v2, timm_mobilenetv3, timm_regnetx_002) kept their routes and
# times at either value (one process each, in turn; 2026-11-27). The compile
# happens on a later call (after ``graph_trial.ROUTED_FIRST_CALLS``), never the first.
# Below it, inductor is tried only where its ORT regions are mostly loops
# (``inductor_bar.mostly_loops``): plain inductor ran the wider set's such
# graphs in 0.46-0.78 of the faster side's time.
INDUCTOR_TRIAL_S = 1e-4
# Inductor is not tried where the routed program took under this share of the
# traced graph's time (graph_trial.InPlaceTrial._tries_inductor): ONNX Runtime's
# kernels already fuse what inductor would. The wider set's
# hf_levit measured 1.10 ms as routed against 3.08 as traced (0.36) in its trial,
# and plain inductor ran it in 760 µs against auto's 488 settled; Mamba's graph
# measured 0.74-0.97. It holds too where graph_tuning's check kept the routed
# program and left inductor out by its bar: there the check timed the graph in a
# loop of its own, which flatters ORT (Intel Xeon with AVX-512 and AMX, 2 cores:
# a LLaMA-style decoder, 1.47 ms as routed in the check and 2.23 in place
# against 3.04 as traced, ran 1.19x plain inductor's time; Falcon, 1.90 in place
# against 2.45, 1.52x).
INDUCTOR_PAST_ROUTED_SHARE = 0.5  # unless its ORT regions are many small ops (graph_tuning)
# From this higher share where the ORT regions are convolution-bound
# (``inductor_bar.conv_bound``): inductor runs their convolutions as the traced
# graph does, so it rarely beats an ORT program that leads the traced graph by
# much. At INDUCTOR_PAST_ROUTED_SHARE, every such graph that tried inductor in
# place kept ORT, after an inductor compile on a later call (AMD EPYC, AVX2,
# 2 cores, 2026-12-06; routed share, then ORT against inductor in place):
# timm's ResNet-18 0.56 (the zoo: 3.9 s first call, then 19.6 s compiling
# inductor to lose, inductor's column at 1.67x the floor), DLA 0.67 (26.6 s
# later), BoTNet 0.55 (9.6 against 21.3 ms; 38.0 s later), a small U-Net 0.58
# (1.07 against 1.38 ms), a 1-D audio stack 0.61 (0.76 against 0.99). The
# convolution-bound graphs with inductor ahead of the traced graph had ORT
# further ahead (hf_resnet: inductor 0.51-0.55 of the floor, ORT at 0.16).
CONV_BOUND_PAST_ROUTED_SHARE = 0.8
# Inductor, once compiled, replaces a routed leader where it is faster at all: its
# kernels run on torch's threads, where ORT's wake their own pool. Set when the
# sides were judged by their calls alone (ORT's cost to the code after its call
# not in the routed side's time; periods now hold what falls before the graph's
# next call): with ROUTED_MARGIN there, Mixtral at 1x16 tokens kept ORT (whole
# graph on inductor 638 µs in the trial) and ran in 761 µs against plain
# inductor's 672.
INDUCTOR_OVER_ROUTED_MARGIN = 1.0
# Against the traced graph, inductor wins where it ran faster at all in place.
# The trial's readings of the two err by more than 5% (in the zoo run of
# 2026-11-29 19:10, Xeon with AVX-512 and AMX, 2 cores: hf_albert's traced
# graph read 1.41 ms in place against plain inductor's 1.35, and then ran 2.25
# ms a call against plain inductor's 1.44 in the zoo), and the errors cost
# unequally: in that run plain inductor ran 22 of 25 rows faster than the
# traced graph (the floor), two within 4% of it, and timm_resnet18 (which auto
# runs on ORT) at 1.47x, while the traced graph ran the transformers 1.05-1.9x
# plain inductor's time. At 0.95 hf_albert stayed as traced (1.56x
# inductor's time); at 0.9, a 4-layer decoder with Meta's complex-valued rotary
# embedding ran as traced in 35.3 ms against plain inductor's 33.6 (AMD EPYC,
# AVX2). Inductor's warm start costs a compile's cache load where the traced
# graph's costs nothing.
INDUCTOR_OVER_TRACED_MARGIN = 1.0
# Plain inductor's program of the Dynamo graph (``plain_inductor.py``) takes a
# near tie from the same graph compiled by inductor after auto's own lowering,
# where graph_tuning's check moved the graph there: both are inductor's
# kernels on torch's threads, and plain inductor's is the program a user of
# torch.compile gets, the bar auto is held to. The lowered one lowers through
# AOTAutograd twice and copies updated inputs back outside inductor's program:
# on the zoo's inplace_input it ran 153 µs a call against plain inductor's
# 119-145 (AMD EPYC, AVX2), and hf_gpt2, moved to its regions on inductor by
# the check, ran 1.59x plain inductor's time in the zoo (Xeon, AVX-512).
PLAIN_OVER_LOWERED_MARGIN = 1.05
# Rounds of inductor against the leader timed past the first where their
# verdicts disagree (``inductor_wins``).
EXTRA_INDUCTOR_ROUNDS = 1


def inductor_wins(inductor_s: Sequence[float], leader_s: Sequence[float], margin: float) -> bool | None:
    """Whether inductor beat the leader by ``margin``, from each side's median call
    by round: the leader's first round (against the other side), then one per
    round in turn with inductor. A round on a shared machine is mostly slowed by
    what else ran, so each side's better round stands; where that and the latest
    round in turn disagree, the answer is None, and one more round is timed
    (once). Judged by the leader's better round against inductor's only one, a
    round slowed on both sides counted against inductor alone; judged by the
    round in turn alone, timm's LCNet left ORT (0.30-0.37 ms a call) for
    inductor (1.83 ms), ORT slowed in that round. Only roughly: a side's time
    also moves with the program it alternates with (hf_opt's traced graph ran
    1538 µs beside ORT, 2121-2174 beside inductor, 1495 alone; README, "What
    limits auto today")."""
    by_best = min(inductor_s) < margin * min(leader_s)
    in_turn = inductor_s[-1] < margin * leader_s[-1]
    if by_best != in_turn and len(inductor_s) <= EXTRA_INDUCTOR_ROUNDS:
        return None
    return by_best


def runs_subgraphs(gm: torch.fx.GraphModule) -> bool:
    """Whether the Dynamo graph ``gm`` calls a higher-order op (``torch.cond``,
    ``flex_attention``, a checkpointed block, a scan): run as traced, each such
    call runs its subgraph through Python, op by op, where the lowered graph
    inlines or lowers it."""
    return any(
        node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
        for node in gm.graph.nodes
    )


def traced_won_note(routed_s: float, traced_s: float, margin: float) -> str:
    """Why the routed program, at ``routed_s`` a call, lost to the traced graph at
    ``traced_s``: it was slower, or not faster by ``margin``, the one it must win by."""
    if routed_s >= traced_s:
        return "slower in place than the graph as traced"
    if margin == ROUTED_MARGIN:
        why = "the margin that pays for the thread pools it wakes for the code after it"
    else:
        why = "the margin inductor must win by, whose warm start costs a compile"
    return f"in place, under {1 - margin:.0%} faster than the graph as traced, {why}"
