"""The in-place trial's inductor side: a Dynamo graph compiled as plain inductor compiles it."""

import torch
from torch._dynamo.eval_frame import innermost_fn
from torch._dynamo.utils import counters

from dispatch.config import Config
from dispatch.plain_inductor import compile_plain


class _Step(torch.nn.Module):
    """A layer whose buffer the graph updates in place, as a running statistic is."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.register_buffer("seen", torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.sum(0))
        return torch.relu(self.linear(x)) * 2


def _dynamo_graph(
    model: torch.nn.Module, x: torch.Tensor, dynamic: bool | None = None
) -> tuple[torch.fx.GraphModule, list]:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, dynamic=dynamic)(x)
    ((gm, example_inputs),) = graphs
    return gm, example_inputs


@torch.no_grad()
def test_the_graph_as_plain_inductor_compiles_it_is_served_by_inductors_cache_the_second_time():
    """A warm start that moves a graph to plain inductor finds its program in
    inductor's FX graph cache; compiled on the real tensors, the cache bypassed
    the graph ("No shape env") and every process ran all of inductor's codegen
    again (Falcon: 12.3 s to the first result against 6.5)."""
    torch.manual_seed(0)
    model, x = _Step().eval(), torch.randn(4, 6)
    gm, args = _dynamo_graph(model, x)
    reference = _Step().eval()
    reference.load_state_dict(model.state_dict())
    for _ in range(2):
        counters.clear()
        compiled = compile_plain(gm, args, Config())
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    assert counters["inductor"]["fxgraph_cache_hit"] == 1
    # without the Dynamo-disable wrapper compile_fx adds (0.65 µs a call): auto's
    # callable, which runs the program, already runs disabled
    assert innermost_fn(compiled) is compiled
    seen = model.seen.clone()
    out = compiled(*args)  # the Dynamo graph's inputs: the buffer itself among them
    torch.testing.assert_close(out[0], reference(x))
    torch.testing.assert_close(model.seen, seen + x.sum(0))  # updated once, in place


@torch.no_grad()
def test_a_graph_of_symbolic_sizes_compiles_for_every_size():
    """Dynamo's graph keeps its values under "example_value", not "val": read from
    "val" only, every size was static, and the program compiled for one call's
    rows refused every other row count."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU()).eval()
    gm, _ = _dynamo_graph(model, torch.randn(4, 6), dynamic=True)
    weight, bias = model[0].weight, model[0].bias

    def call(x: torch.Tensor) -> list:  # the graph's inputs on a call: weights, the row count, x
        return [weight, bias, x.shape[0], x]

    size = gm.graph.find_nodes(op="placeholder")[2]
    assert isinstance(size.meta["example_value"], torch.SymInt)
    compiled = compile_plain(gm, call(torch.randn(4, 6)), Config())
    for rows in (4, 9):
        x = torch.randn(rows, 6)
        torch.testing.assert_close(compiled(*call(x))[0], model(x))
