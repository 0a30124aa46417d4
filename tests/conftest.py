"""Shared fixtures: one Inductor cache per test session, a clean environment and
a fresh Dynamo cache per test, and helpers for fake-device models."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

# One Inductor cache for the whole session: a cold C++ compile costs seconds.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "dispatch-tests-inductor")
)

from torch._subclasses.fake_tensor import FakeTensorMode


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DISPATCH_"):
            monkeypatch.delenv(name)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def on_fake_device(module: torch.nn.Module, device: str, mode: FakeTensorMode) -> torch.nn.Module:
    """``module`` with fake parameters on ``device`` (``cuda``/``mps`` need no hardware)."""
    module.requires_grad_(False)
    with mode:
        return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


def fake_inputs(mode: FakeTensorMode, device: str, *shapes: tuple[int, ...], dtype=torch.float32):
    with mode:
        return [torch.randn(*s, device=device, dtype=dtype) for s in shapes]
