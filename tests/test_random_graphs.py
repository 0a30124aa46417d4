"""Property test: random graphs of pointwise, reduction, matmul, view and custom
ops, on random shapes and dtypes, give eager's results under ``auto``.

``nox -s tests`` runs a fixed, bounded set of examples (derandomized, so CI
is reproducible); ``nox -s fuzz`` runs many more, freshly random, set by
``DISPATCH_FUZZ_EXAMPLES``."""

import os

import pytest
import torch

from tests.models import scaled_tanh

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("DISPATCH_FUZZ_EXAMPLES", "0"))

UNARY = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "neg": torch.neg,
    "abs_sqrt": lambda x: torch.sqrt(torch.abs(x) + 1),
    "custom": lambda x: scaled_tanh(x, 0.5),
    "sum": lambda x: x.sum(-1, keepdim=True),
    "mean": lambda x: x.mean(0, keepdim=True),
    "amax": lambda x: x.amax(-1, keepdim=True),
    "softmax": lambda x: torch.softmax(x, -1),
    "transpose": lambda x: x.transpose(0, 1),
    "flatten_back": lambda x: x.reshape(-1).reshape(x.shape),
    "unsqueeze_sum": lambda x: x.unsqueeze(0).sum(0),
}
BINARY = ("add", "mul", "sub", "matmul")
OPS = tuple(UNARY) + BINARY


class RandomGraph(torch.nn.Module):
    """Applies ``ops`` in turn; binary ops take a parameter shaped to fit."""

    def __init__(self, ops: list[str], shape: tuple[int, int], dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        self.ops = ops
        generator = torch.Generator().manual_seed(seed)
        probe = torch.zeros(shape, dtype=dtype)
        self.weights = torch.nn.ParameterList()
        for op in ops:
            if op in UNARY:
                probe = UNARY[op](probe)
                continue
            cols = int(torch.randint(1, 7, (), generator=generator)) if op == "matmul" else probe.shape[-1]
            shape_w = (probe.shape[-1], cols) if op == "matmul" else probe.shape
            self.weights.append(torch.nn.Parameter(torch.randn(shape_w, generator=generator, dtype=dtype)))
            probe = self._binary(op, probe, self.weights[-1])

    @staticmethod
    def _binary(op: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if op == "matmul":
            return x @ w
        return {"add": torch.add, "mul": torch.mul, "sub": torch.sub}[op](x, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = iter(self.weights)
        for op in self.ops:
            x = UNARY[op](x) if op in UNARY else self._binary(op, x, next(weights))
        return x


def fuzz_settings(ci_examples: int):
    """A fixed, derandomized set of ``ci_examples`` in CI; DISPATCH_FUZZ_EXAMPLES fresh ones under nox -s fuzz."""
    return settings(
        max_examples=FUZZ_EXAMPLES or ci_examples,
        derandomize=not FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7), torch.bfloat16: (3e-2, 3e-2)}


@fuzz_settings(ci_examples=8)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6),
    rows=st.integers(1, 6),
    cols=st.integers(1, 8),
    dtype=st.sampled_from(list(TOLERANCE)),
    seed=st.integers(0, 2**16),
)
def test_random_graph_matches_eager(ops, rows, cols, dtype, seed):
    torch._dynamo.reset()
    model = RandomGraph(ops, (rows, cols), dtype, seed).eval()
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="auto")(x)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=lambda m: f"{ops}: {m}")


@fuzz_settings(ci_examples=4)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6),
    rows=st.integers(1, 6),
    cols=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_random_graph_trains_as_eager(ops, rows, cols, dtype, seed):
    """A training step (forward and backward) through auto, which hands training
    graphs to inductor's own compile: the output and every gradient as eager's."""
    torch._dynamo.reset()
    model = RandomGraph(ops, (rows, cols), dtype, seed)
    reference = RandomGraph(ops, (rows, cols), dtype, seed)
    x = torch.randn(
        rows, cols, generator=torch.Generator().manual_seed(seed), dtype=dtype, requires_grad=True
    )
    x_ref = x.detach().clone().requires_grad_(True)
    got = torch.compile(model, backend="auto")(x)
    expected = reference(x_ref)
    got.sum().backward()
    expected.sum().backward()
    rtol, atol = (1e-4, 1e-4) if dtype == torch.float32 else (1e-7, 1e-7)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=lambda m: f"{ops}: {m}")
    torch.testing.assert_close(
        x.grad, x_ref.grad, rtol=rtol, atol=atol, msg=lambda m: f"{ops} input grad: {m}"
    )
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(
            p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m: f"{ops} weight grad: {m}"
        )
