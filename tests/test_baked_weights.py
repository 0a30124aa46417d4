"""The onnxrt route bakes weights into its ONNX model: every way a user changes a
weight after the first call must reach the next call, as it does under inductor."""

import pytest
import torch

from dispatch.routes.baked_weights import EDGE_BYTES, MIN_CALLS_PER_BAKE, BakedWeights
from tests.models import MLP


def _conv_bn() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    model[1].running_mean.uniform_(-1, 1)
    model[1].running_var.uniform_(0.5, 2)
    return model.eval()


@torch.no_grad()
def test_writes_through_data_reach_the_next_call():
    # `.data` is a tensor with a version counter of its own: neither the weight's
    # version nor its address moves, and auto ran the stale weights (max error 0.78
    # after `.data.mul_(2)`, 151 after `.data.copy_`) where inductor was right.
    model, x = MLP().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x))
    model.net[0].weight.data.mul_(2)
    torch.testing.assert_close(compiled(x), model(x))
    for p in model.parameters():
        p.data.copy_(torch.randn_like(p))
    torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_weight_changes_are_seen_without_dynamos_guards_on_modules():
    """The README offers torch's guard filter that drops Dynamo's guards on modules
    (most of Dynamo's cost on a model of many weights). The weight check is
    dispatch's own, so every change still reaches the next call: in place,
    through ``.data``, a tensor put in ``.data``, a new Parameter."""
    model, x = MLP().eval(), torch.randn(4, 16)
    skip_module_guards = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    compiled = torch.compile(model, backend="auto", options={"guard_filter_fn": skip_module_guards})
    torch.testing.assert_close(compiled(x), model(x))
    first, last = model.net[0], model.net[-1]
    changes = (
        lambda: first.weight.mul_(2),
        lambda: first.bias.data.add_(1),
        lambda: setattr(last.weight, "data", torch.randn_like(last.weight)),
        lambda: setattr(first, "weight", torch.nn.Parameter(torch.randn_like(first.weight))),
    )
    for change in changes:
        change()
        torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_a_batchnorm_statistic_changed_through_data_reaches_the_folded_conv():
    model, x = _conv_bn(), torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(x), model(x))
    model[1].running_var.data.mul_(3)
    model[1].running_mean.data.add_(0.5)
    torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_weights_updated_every_step_stay_right_and_stop_re_exporting(onnx_bakes, onnx_exports):
    """An EMA teacher: `p.data.mul_(m).add_(q, alpha=1 - m)` before every call.
    Each change re-exported the region (seconds a call on a real model); once a
    re-export serves fewer than MIN_CALLS_PER_BAKE calls, the region reads its
    weights as inputs."""
    teacher, student, x = MLP().eval(), MLP().eval(), torch.randn(4, 16)
    compiled = torch.compile(teacher, backend="auto")
    for _ in range(6):
        for t, s in zip(teacher.parameters(), student.parameters()):
            t.data.mul_(0.9).add_(s.data, alpha=0.1)
        student.net[0].weight.data.add_(0.01)
        torch.testing.assert_close(compiled(x), teacher(x))
    assert onnx_bakes[0] == 3  # baked, re-baked, then fed
    assert onnx_exports[0] == 2  # the re-bake reused the first export


@torch.no_grad()
def test_weights_changed_between_evaluations_are_baked_again_each_time(
    onnx_bakes, onnx_exports, routed_throughout
):
    """An optimizer step between evaluation passes: each pass is long enough to
    repay a re-export, so the region keeps folding and pre-packing its weights."""
    model, x = MLP().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="auto")
    for _epoch in range(4):
        for _ in range(MIN_CALLS_PER_BAKE):
            torch.testing.assert_close(compiled(x), model(x))
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.testing.assert_close(compiled(x), model(x))
    assert onnx_bakes[0] == 5  # the first export and one per change
    assert onnx_exports[0] == 1


@torch.no_grad()
def test_rows_written_at_the_end_of_an_embedding_are_seen():
    # New tokens' rows, written after resizing: the far end of the weight.
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4)).eval()
    ids = torch.tensor([[1, 2, 98, 99]])
    compiled = torch.compile(model, backend="auto")
    torch.testing.assert_close(compiled(ids), model(ids))
    model[0].weight.data[-2:] = torch.randn(2, 16)
    torch.testing.assert_close(compiled(ids), model(ids))


def test_the_byte_check_covers_both_ends_of_a_non_contiguous_weight():
    weight = torch.randn(64, 32).t()  # a transposed view: its last element ends its memory
    baked = BakedWeights([weight], [0])
    assert not baked.changed([weight])
    weight.data[-1, -1] += 1
    assert baked.changed([weight])
    baked = BakedWeights([weight], [0])
    weight.data[0, 0] += 1
    assert baked.changed([weight])


@pytest.mark.parametrize("count", [1, 2, 9])
@pytest.mark.parametrize("change", ["in place", "new data", "inference tensor swapped"])
def test_a_change_to_any_one_of_the_weights_is_seen(count, change):
    """Each kind of change, to the last of ``count`` weights laid between other
    arguments, and none where nothing changed."""
    with torch.inference_mode(change == "inference tensor swapped"):
        weights = [torch.randn(8, 8) for _ in range(count)]
    args = [x for w in weights for x in (torch.randn(2), w)]
    positions = list(range(1, 2 * count, 2))
    baked = BakedWeights(args, positions)
    assert not baked.changed(args)
    assert not baked.changed(list(args))  # the same tensors in another list
    target = weights[-1]
    if change == "in place":
        with torch.no_grad():
            target.mul_(1.0)  # same values, a new version
    elif change == "new data":
        target.data = target.clone()  # same values, another address
    else:
        with torch.inference_mode():
            args[positions[-1]] = target.clone()
    assert baked.changed(args)


def test_a_small_weight_is_compared_whole():
    bias = torch.randn(EDGE_BYTES // 4)  # fp32: fewer bytes than two edges
    baked = BakedWeights([bias], [0])
    bias.data[len(bias) // 2] += 1
    assert baked.changed([bias])


def test_a_model_built_under_inference_mode_runs_on_onnx_runtime():
    # Its weights are inference tensors, which have no version counter: reading it
    # raised, and every region fell back to eager with a warning.
    import warnings

    from dispatch.stitch import FallbackWarning

    with torch.inference_mode():
        model, x = MLP().eval(), torch.randn(4, 16)
        compiled = torch.compile(model, backend="auto")
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            torch.testing.assert_close(compiled(x), model(x))
            model.net[0].weight.mul_(2)  # in place, inside inference_mode
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("freezing", [False, True])
@torch.no_grad()
def test_weights_are_checked_on_every_call_unless_inductor_freezing_is_on(monkeypatch, freezing):
    # freezing is the user's promise to torch.compile that weights never change
    # after compiling: inductor checks nothing then, and neither does onnxrt.
    import torch._inductor.config

    checks = []
    real = BakedWeights.changed

    def counted(self, args):
        checks.append(1)
        return real(self, args)

    monkeypatch.setattr(BakedWeights, "changed", counted)
    model, x = MLP().eval(), torch.randn(4, 16)
    with torch._inductor.config.patch(freezing=freezing):
        compiled = torch.compile(model, backend="auto")
        compiled(x)  # compiles
        checks.clear()
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert len(checks) == (0 if freezing else 3)


class _BlockWithBreak(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.linear(x))
        if y.sum().item() > 1e9:  # a graph break inside the layer
            y = y * 2
        return x + y


class _Layers(torch.nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_BlockWithBreak() for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@torch.no_grad()
def test_layers_that_share_one_graph_each_keep_their_weights_baked(monkeypatch, onnx_bakes):
    """A graph break inside a layer: Dynamo compiles the layer's code once and runs
    that graph with every layer's parameters. Re-baking on each change of layer
    ended in reading the weights as inputs (no folding, no pre-packing): a conv
    model ran 1.5x slower than eager. Each layer keeps a session of its own."""
    import dispatch.routes.onnxrt as onnxrt_route

    baked = []  # how many weights each export baked in
    export = onnxrt_route.export_region

    def recording(gm, args, frozen=frozenset(), **options):
        baked.append(len(frozen))
        return export(gm, args, frozen, **options)

    monkeypatch.setattr(onnxrt_route, "export_region", recording)
    model, x = _Layers(4).eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="auto")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    # The graph before the break (the graph after it holds no weight), exported
    # once with the first layer's weight and bias baked in; the other layers'
    # weights baked into that export's program, once each (onnx_rebake.py).
    assert baked == [2]
    assert onnx_bakes[0] == 4


@torch.no_grad()
def test_each_layers_export_is_stored_for_the_next_process(onnx_bakes):
    # The layers after the first are baked on later calls, outside the compile:
    # they went to no cache, and every warm start exported them again.
    model, x = _Layers(3).eval(), torch.randn(4, 16)
    torch.compile(model, backend="auto")(x)
    assert onnx_bakes[0] == 3
    torch._dynamo.reset()  # as a new process would start, with the same cache
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))
    assert onnx_bakes[0] == 3


@torch.no_grad()
def test_two_instances_of_one_model_class_run_alternately(onnx_bakes, onnx_exports):
    first, second, x = MLP().eval(), MLP().eval(), torch.randn(4, 16)
    one, two = torch.compile(first, backend="auto"), torch.compile(second, backend="auto")
    for _ in range(4):
        torch.testing.assert_close(one(x), first(x))
        torch.testing.assert_close(two(x), second(x))
    assert onnx_bakes[0] == 2
    second.net[0].weight.add_(1.0)  # in place, on one of the two
    torch.testing.assert_close(two(x), second(x))
    torch.testing.assert_close(one(x), first(x))
    assert onnx_bakes[0] == 3
    assert onnx_exports[0] == 1  # the second set and the change baked into the first export


@torch.no_grad()
def test_weights_replaced_on_every_call_stop_re_exporting(onnx_bakes):
    """``p.data = t`` before every call: the same parameter with new memory, each time."""
    model, x = MLP().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="auto")

    def replaced_each_call() -> None:
        for _ in range(10):
            model.net[0].weight.data = torch.randn_like(model.net[0].weight)
            torch.testing.assert_close(compiled(x), model(x))

    replaced_each_call()
    replaced_each_call()
    assert onnx_bakes[0] == 3  # baked, baked again, then fed


@torch.no_grad()
def test_beyond_the_most_weight_sets_a_region_takes_its_weights_as_inputs(monkeypatch, onnx_bakes):
    import dispatch.routes.baked_weights as baked_weights

    monkeypatch.setattr(baked_weights, "MAX_WEIGHT_SETS", 2)
    models, x = [MLP().eval() for _ in range(4)], torch.randn(4, 16)
    compiled = [torch.compile(m, backend="auto") for m in models]
    for _ in range(3):
        for model, run in zip(models, compiled):
            torch.testing.assert_close(run(x), model(x))
    assert onnx_bakes[0] == 3  # two sets baked, then one model with the weights as inputs


@torch.no_grad()
def test_a_deleted_models_weights_are_let_go(onnx_bakes):
    """Checkpoints evaluated one after another, each a new instance of one class:
    each model's set lets go of its weights once the model is gone, not when the
    limit of sets is reached, nor at ``torch._dynamo.reset()``."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    x = torch.randn(4, 16)
    gone = []
    for _ in range(3):
        model = MLP().eval()
        gone.append(StorageWeakRef(model.net[0].weight.untyped_storage()))
        torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))
        del model
    gc.collect()
    assert onnx_bakes[0] == 3
    assert [ref.expired() for ref in gone] == [True, True, True]


class _ReassignedBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.register_buffer("average", torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        self.average = 0.9 * self.average + 0.1 * h.mean(0)  # a new tensor every call
        return h - self.average


@torch.no_grad()
def test_a_buffer_reassigned_every_call_stops_re_exporting(onnx_bakes):
    # Each call passes a new buffer object in the old one's place: keyed by tensor,
    # each was a new set of weights, and the region exported on every call.
    model, reference = _ReassignedBuffer().eval(), _ReassignedBuffer().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="auto")
    for _ in range(12):
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), reference(x))
    assert onnx_bakes[0] == 3  # baked, baked again, then fed


class _ScaledByAConstant(torch.nn.Module):
    """DeBERTa's attention scale: a tensor made in ``forward``, a constant of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.linear(x) / torch.sqrt(torch.tensor(16.0) * 2.0))


@torch.no_grad()
def test_a_tensor_constant_of_the_graph_is_baked_as_a_weight(monkeypatch):
    """It was fed on every call as an input: ORT could neither fold its ops nor fuse
    the scale into the matmul before it (hf_deberta_v2: 76 ops after ORT's
    optimizer, 70 with it baked)."""
    import dispatch.routes.onnxrt as onnxrt_route

    fed = []  # the shapes of each export's inputs that were not baked
    export = onnxrt_route.export_region

    def recording(gm, args, frozen=frozenset(), **options):
        fed.append([tuple(a.shape) for i, a in enumerate(args) if i not in frozen])
        return export(gm, args, frozen, **options)

    monkeypatch.setattr(onnxrt_route, "export_region", recording)
    model, x = _ScaledByAConstant().eval(), torch.randn(4, 16)
    torch.testing.assert_close(torch.compile(model, backend="auto")(x), model(x))
    assert fed == [[(4, 16)]]
