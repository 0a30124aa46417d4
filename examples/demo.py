"""The main job: compile a small real model with backend="auto", run it, and
show what ran where. Run it with `nox -s demo`.

The model is a small transformer block followed by a user custom op that no
exporter knows, then a classifier head: ONNX Runtime runs what it can, the
custom op runs eager, and the table says why.
"""

from __future__ import annotations

import time

import torch


@torch.library.custom_op("demo::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
    return limit * torch.tanh(x / limit)


@soft_clip.register_fake
def _(x: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(x)


class Classifier(torch.nn.Module):
    def __init__(self, d: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.encoder = torch.nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True)
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x).mean(dim=1)
        return self.head(soft_clip(h, 3.0))


def main() -> None:
    import dispatch

    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(8, 32, 64)
    with torch.no_grad():
        expected = model(x)
        start = time.perf_counter()
        compiled = torch.compile(model, backend="auto")
        got = compiled(x)
        first = time.perf_counter() - start
        explanation = dispatch.explain(model, x)
    error = (got - expected).abs().max().item()
    print(explanation)
    print()
    print(f"first call (compile + run): {first:.2f} s;  max |auto - eager| = {error:.2e}")
    print("Force a route with DISPATCH_ROUTE=<route>; see `python -m dispatch` for what this machine has.")
    assert error < 1e-3, "auto disagrees with eager"


if __name__ == "__main__":
    main()
