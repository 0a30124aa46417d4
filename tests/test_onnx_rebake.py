"""Another set of weights baked into an earlier export's program is the model a
fresh export of those weights gives, and it costs no export: blocks compiled one
by one (regional compilation) exported every block's weights from the start,
13 s of a 12-block ViT's 18 s first call."""

import numpy as np
import onnx
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dispatch.routes import onnx_rebake
from dispatch.routes.onnx_export import export_region


class _ConvBnLinear(torch.nn.Module):
    """BatchNorm that the ONNX optimizer folds into the convolution, and a linear
    layer whose transposed weight it folds: both depend on the weights' values."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.linear = torch.nn.Linear(8, 5)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.linear(h.mean((2, 3)))


def _region(model: torch.nn.Module, x: torch.Tensor):
    """The aten graph of ``model`` with its weights as inputs, those inputs for
    ``model``, and the positions of the weights."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]

    def run(x, *weights):
        return (torch.func.functional_call(model, dict(zip(names, weights)), (x,)),)

    weights = [t.detach() for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    with torch.no_grad():
        gm = make_fx(run, pre_dispatch=False)(x, *weights)
    return gm, [x, *weights], frozenset(range(1, 1 + len(weights)))


def _contents(model) -> tuple[list[str], dict[str, np.ndarray]]:
    proto = onnx.load_from_string(model.graph)
    arrays = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    arrays.update(model.initializers)
    return [n.op_type for n in proto.graph.node], arrays


def _other_weights(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return _ConvBnLinear().eval()


@torch.no_grad()
def test_another_set_baked_in_is_what_its_own_export_gives():
    x = torch.randn(2, 3, 8, 8)
    gm, first_args, frozen = _region(_other_weights(0), x)
    first = export_region(gm, first_args, frozen)
    assert sorted(first.for_other_weights.buffers) == sorted(frozen)  # every weight, none else
    _, second_args, _ = _region(_other_weights(1), x)
    rebaked = first.for_other_weights.model(second_args)
    exported = export_region(gm, second_args, frozen)
    ops, arrays = _contents(rebaked)
    expected_ops, expected_arrays = _contents(exported)
    assert "BatchNormalization" not in ops  # folded into the convolution, from the second set's values
    assert ops == expected_ops
    assert arrays.keys() == expected_arrays.keys()
    for name, array in arrays.items():
        np.testing.assert_array_equal(array, expected_arrays[name])
    # And not the first set's values: the folded weights differ between the sets.
    _, first_arrays = _contents(first)
    assert any(not np.array_equal(first_arrays[n], arrays[n]) for n in arrays if arrays[n].size > 8)


@torch.no_grad()
def test_weights_of_other_shapes_are_exported_from_the_start():
    x = torch.randn(2, 3, 8, 8)
    gm, args, frozen = _region(_other_weights(0), x)
    rebake = export_region(gm, args, frozen).for_other_weights
    wider = list(args)
    wider[1] = torch.randn(8, 3, 5, 5)  # the convolution's weight, another kernel size
    assert rebake.model(wider) is None


@torch.no_grad()
def test_the_export_keeps_no_set_of_weights_alive():
    x = torch.randn(2, 3, 8, 8)
    gm, args, frozen = _region(_other_weights(0), x)
    rebake = export_region(gm, args, frozen).for_other_weights
    rebake.model(_region(_other_weights(1), x)[1])
    kept = [rebake.program.state_dict[name] for name in rebake.buffers.values()]
    assert [t.device.type for t in kept] == ["meta"] * len(kept)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(self.norm(x)))


def _failing_translation():
    def translate(program):
        raise TypeError("the exporter's private signature changed")

    return translate


@pytest.mark.parametrize(
    "translation",
    [None, lambda: None, _failing_translation],
    ids=["kept", "exporter-without-steps", "failing"],
)
@torch.no_grad()
def test_blocks_compiled_one_by_one_export_once(monkeypatch, onnx_exports, onnx_bakes, translation):
    """Regional compilation: each block compiled on its own runs the same Dynamo
    graph with its own weights. One export; every other block's weights baked
    into its program. Where the exporter lacks the steps, or they fail, each
    block exports."""
    if translation is not None:
        monkeypatch.setattr(onnx_rebake, "translation", translation)
    blocks = torch.nn.Sequential(*[_Block() for _ in range(4)]).eval()
    for i in range(len(blocks)):
        blocks[i] = torch.compile(blocks[i], backend="auto")
    eager = torch.nn.Sequential(*[b._orig_mod for b in blocks])
    x = torch.randn(4, 16)
    for _ in range(2):
        torch.testing.assert_close(blocks(x), eager(x))
    assert onnx_exports[0] == (1 if translation is None else 4)
    assert onnx_bakes[0] == 4
