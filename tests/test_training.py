"""Training loops under ``auto``: forward and backward graphs are both routed, and
20 optimizer steps follow eager's losses and gradients."""

import copy
import warnings

import pytest
import torch

from dispatch.inspect import GRAPH_BACKWARD, GRAPH_FORWARD
from dispatch.record import recorder
from dispatch.stitch import FallbackWarning

STEPS = 20
pytestmark = pytest.mark.usefixtures("training_stays_on_inductor")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)), (8, 16)


def conv_net():
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    return net, (4, 3, 8, 8)


def transformer():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return layer, (2, 5, 16)


@pytest.mark.parametrize("make", [mlp, conv_net, transformer], ids=["mlp", "conv", "transformer"])
def test_twenty_steps_track_eager(make):
    torch.manual_seed(0)
    model, shape = make()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="auto")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    losses, reference_losses = [], []
    with recorder.recording() as plans:
        for step in range(STEPS):
            x = torch.randn(shape, generator=data)
            target = torch.randn(x.shape[0], *compiled(x).shape[1:], generator=data)
            loss = torch.nn.functional.mse_loss(compiled(x), target)
            reference_loss = torch.nn.functional.mse_loss(reference(x), target)
            optimizer.zero_grad()
            reference_optimizer.zero_grad()
            loss.backward()
            reference_loss.backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=f"step {step}: {name}")
            optimizer.step()
            reference_optimizer.step()
            losses.append(loss.item())
            reference_losses.append(reference_loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses), rtol=1e-3, atol=1e-5)
    assert losses[-1] < losses[0]  # it trained
    kinds = {p.kind for p in plans}
    assert {GRAPH_FORWARD, GRAPH_BACKWARD} <= kinds
    routes = {r.route for p in plans for r in p.regions if p.kind in (GRAPH_FORWARD, GRAPH_BACKWARD)}
    assert "inductor" in routes


def test_changing_batch_sizes_train_on_inductor_without_falling_back():
    """A dynamic-shape training graph: inductor compiles its regions once for
    all batch sizes (on real inputs alone it would specialise, fail the next
    size and fall back to eager)."""
    torch.manual_seed(0)
    model, _ = mlp()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="auto")
    with warnings.catch_warnings(), recorder.recording() as plans:
        warnings.simplefilter("error", FallbackWarning)
        for batch in (2, 3, 5, 8):
            x = torch.randn(batch, 16)
            compiled(x).pow(2).mean().backward()
            reference(x).pow(2).mean().backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=f"batch {batch}: {name}")
    dynamic = [p for p in plans if p.dynamic]
    assert dynamic and all(r.route == "inductor" for p in dynamic for r in p.regions)
