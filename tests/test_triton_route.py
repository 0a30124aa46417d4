"""The triton route end to end on CPU, through the Triton interpreter."""

import pytest
import torch

import dispatch
from tests.conftest import needs_triton

pytestmark = needs_triton


class Block(torch.nn.Module):
    """LayerNorm -> Linear + GELU -> Linear -> softmax, and an RMSNorm."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.rms = torch.nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(self.norm(x)))
        return torch.softmax(self.down(h), dim=-1), self.rms(x)


@pytest.fixture
def forced_triton(monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@torch.no_grad()
def test_forced_triton_runs_the_kernels_and_matches_eager(forced_triton):
    model = Block().eval()
    x = torch.randn(3, 5, 24)
    explanation = dispatch.explain(model, x)
    triton_ops = {op for r in explanation.regions if r.route == "triton" for op in r.ops}
    assert {
        "aten.native_layer_norm.default",
        "aten.addmm.default",
        "aten.gelu.default",
        "aten._softmax.default",
        "aten.rsqrt.default",
    } <= triton_ops
    for got, expected in zip(torch.compile(model, backend="auto")(x), model(x)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_kernels_are_what_runs(forced_triton, monkeypatch):
    import kernels.softmax as softmax_module

    calls = []
    real = softmax_module.softmax

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(softmax_module, "softmax", counting)
    torch.compile(lambda x: torch.softmax(x * 2, dim=-1) + 1, backend="auto")(torch.randn(4, 9))
    assert calls == [torch.Size([4, 9])]


@torch.no_grad()
def test_ops_outside_patterns_go_to_eager_with_reason(forced_triton):
    def fn(x):
        return torch.softmax(x, dim=0).cos()  # softmax over dim 0 is not a kernels/ pattern

    explanation = dispatch.explain(fn, torch.randn(4, 6))
    assert {r.route for r in explanation.regions} == {"eager"}
    reasons = " ".join(r.rejected["triton"] for r in explanation.regions)
    assert "no kernels/ pattern covers aten._softmax.default" in reasons
    torch.testing.assert_close(torch.compile(fn, backend="auto")(torch.ones(4, 6)), fn(torch.ones(4, 6)))


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    plan = dispatch.plan(torch.fx.symbolic_trace(Block().eval().requires_grad_(False)), [torch.randn(2, 24)])
    assert {r.route for r in plan.regions} == {"eager"}
    assert "TRITON_INTERPRET=1" in plan.regions[0].rejected["triton"]


def test_mm_add_activation_pattern_is_claimed(forced_triton):
    def fn(x, w, b):
        return torch.nn.functional.silu(x @ w + b)

    x, w, b = torch.randn(5, 8), torch.randn(8, 3), torch.randn(3)
    with torch.no_grad():
        explanation = dispatch.explain(fn, x, w, b)
        assert [r.route for r in explanation.regions] == ["triton"]
        torch.testing.assert_close(
            torch.compile(fn, backend="auto")(x, w, b), fn(x, w, b), rtol=1e-5, atol=1e-5
        )
