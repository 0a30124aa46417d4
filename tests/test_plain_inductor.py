"""The in-place trial's inductor side: a Dynamo graph compiled as plain inductor compiles it."""

import torch
import torch._functorch.config
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
    model: torch.nn.Module, x: torch.Tensor, dynamic: bool | None = None, run: bool = True
) -> tuple[torch.fx.GraphModule, list]:
    """Dynamo's graph of ``model`` on ``x`` and its inputs; where not ``run``, the
    call ran it through an interpreter, so the graph (a lazy graph module) has
    not written its code yet."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward if run else lambda *args: torch.fx.Interpreter(gm).run(*args)

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
def test_a_graph_run_before_its_compile_is_served_the_program_of_one_that_was_not(monkeypatch, tmp_path):
    """The trial compiles a graph that has already run; a warm start compiles it
    on its first call, before it has. AOTAutograd's key pickled the two graph
    modules' attributes in different orders, so the warm start missed the cache
    and ran AOTAutograd and inductor's graph passes again (hf_mixtral: 3.0 s to
    its first result, 2.4 on a hit)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # no earlier run's entries
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.GELU()).eval(), torch.randn(3, 7)
    with torch._functorch.config.patch(enable_autograd_cache=True):
        ran, args = _dynamo_graph(model, x)  # the cold process: its trial compiles after the graph ran
        compile_plain(ran, args, Config())
        counters.clear()
        fresh, args = _dynamo_graph(model, x, run=False)  # the warm start's first call
        assert "_code" not in fresh.__dict__, "the graph wrote its code: the test would not see the bug"
        compiled = compile_plain(fresh, args, Config())
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert counters["aot_autograd"]["autograd_cache_miss"] == 0
    torch.testing.assert_close(compiled(*args)[0], model(x))


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


class _Branches(torch.nn.Module):
    """``torch.cond`` between two heads, as the zoo's cond_branches."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(64, 64)
        self.wide = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 64))
        self.narrow = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x).relu()
        return torch.cond(h.mean() > 0.2, self.wide, self.narrow, (h,)).softmax(-1)


@torch.no_grad()
def test_a_program_compiled_for_one_batch_of_a_dynamic_graph_runs_only_that_batch():
    """Inductor compiles the trial's program in a shape environment of its own, and
    a ``torch.cond`` graph compiled on a batch of 2 took the batch for 2: with
    nothing checking that, it returned 2 rows for every later batch."""
    torch.manual_seed(0)
    model, x = _Branches().eval(), torch.randn(2, 32, 64)
    torch._dynamo.mark_dynamic(x, 0)  # as Dynamo marks a batch size that changed
    gm, args = _dynamo_graph(model, x)
    (position,) = [i for i, a in enumerate(args) if isinstance(a, torch.SymInt)]

    def call(x: torch.Tensor) -> list:  # the graph's inputs on a call: weights, the batch size, x
        return [x.shape[0] if i == position else x if a.dim() == 3 else a for i, a in enumerate(args)]

    compiled = compile_plain(gm, call(torch.randn(2, 32, 64)), Config())
    for batch in (3, 2, 5, 1):
        x = torch.randn(batch, 32, 64)
        torch.testing.assert_close(compiled(*call(x))[0], model(x))
