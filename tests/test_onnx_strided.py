"""A view that ``as_strided`` takes of torch's storage runs on ONNX Runtime as torch
computes it, or stays off it (``onnx_ops.as_strided_storage``).

ONNX holds a tensor's values; torch's ``as_strided`` reads the storage behind them.
Longformer chunks a transposed tensor into overlapping windows with it, and its
region computed other hidden states on ONNX Runtime (up to 4e-3 off, under the
first-call check's bar) before the rewrite."""

import warnings

import pytest
import torch

import dispatch
from dispatch.stitch import FallbackWarning

pytest.importorskip("onnxruntime")

ONNX_ONLY = {"routes": ["onnxrt", "eager"], "min_region_size": 1}


def _overlapping_chunks(x, w):
    """Longformer's ``_chunk``: its (sequence, batch, heads, dim) projections with
    heads to the batch (a view of transposed storage), then windows of 8 rows that
    overlap by half, taken with ``as_strided`` over that storage."""
    s, b, h, d = x.shape
    t = (x * 2).transpose(0, 1).transpose(1, 2).reshape(b * h, s, d)  # strides (d, b*h*d, 1)
    t = t.view(b * h, s // 8, 8, d)
    stride = list(t.stride())
    stride[1] //= 2
    chunks = t.as_strided(size=[b * h, s // 4 - 1, 8, d], stride=stride)
    return torch.einsum("bcxd,bcyd->bcxy", chunks, chunks) + w


def _from_an_offset(x):
    """A view of a tensor that starts inside its storage: torch's default offset is
    the tensor's own, torchlib's is 0."""
    tail = (x + 1).flatten()[5:]
    return tail.as_strided((3, 4), (4, 1)) * 3


def _with_gaps(x):
    """Every other column, then a view over the storage between them: no ONNX
    tensor holds those values."""
    cols = (x + 1)[:, ::2]
    return cols.as_strided((2, 4), (8, 1)) * 3


def _ran(fn, *args):
    """``fn(*args)`` under auto, checked against eager; the regions as they ran."""
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        explanation = dispatch.explain(fn, *args, options=ONNX_ONLY)
        compiled = torch.compile(fn, backend="auto", options=ONNX_ONLY)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)
    return explanation.regions


@torch.no_grad()
def test_overlapping_chunks_of_a_transposed_tensor_run_on_onnxrt_as_in_torch():
    x, w = torch.randn(32, 2, 4, 8), torch.randn(1)
    regions = _ran(_overlapping_chunks, x, w)
    assert [r.route for r in regions] == ["onnxrt"]


@torch.no_grad()
def test_a_view_from_an_offset_into_storage_runs_on_onnxrt_as_in_torch():
    regions = _ran(_from_an_offset, torch.randn(5, 4))
    assert [r.route for r in regions] == ["onnxrt"]


@torch.no_grad()
def test_a_view_of_storage_no_tensor_holds_stays_off_onnxrt():
    regions = _ran(_with_gaps, torch.randn(4, 8))
    strided = [r for r in regions if "as_strided" in " ".join(r.ops)]
    assert [r.route for r in strided] == ["eager"]
    assert "with gaps or overlaps in its storage" in strided[0].rejected["onnxrt"]


class _Chunks(torch.nn.Module):
    def forward(self, x, w):
        return _overlapping_chunks(x, w)


@torch.no_grad()
def test_a_lowered_program_reads_the_windows_as_torch_does_after_a_round_trip(tmp_path):
    args = (torch.randn(32, 2, 4, 8), torch.randn(1))
    program = dispatch.lower(_Chunks(), args)
    assert [r.route for r in program.regions] == ["onnxrt"]
    expected = _overlapping_chunks(*args)
    torch.testing.assert_close(program(*args), expected, rtol=1e-5, atol=1e-5)
    program.save(tmp_path / "chunks.dispatch")
    torch.testing.assert_close(
        dispatch.load(tmp_path / "chunks.dispatch")(*args), expected, rtol=1e-5, atol=1e-5
    )
