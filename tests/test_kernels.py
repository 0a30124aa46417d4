"""Every kernel against its torch reference (Triton interpreter on CPU, or CUDA)."""

import pytest
import torch

from tests.conftest import needs_gpu, needs_triton

pytestmark = needs_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, block",
    [((3, 7), None), ((5, 1), None), ((2, 4, 50), 16), ((4, 5000), None), ((1, 129), 32)],
)
def test_softmax(shape, block, dtype):
    from dispatch.kernels.softmax import reference, softmax

    x = randn(*shape, dtype=dtype, scale=10.0)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(softmax(x, block=block), reference(x), rtol=rtol, atol=atol)


def test_softmax_is_stable_and_handles_masked_rows():
    from dispatch.kernels.softmax import softmax

    x = randn(3, 40) * 1e4  # exp would overflow without the max subtraction
    x[1, :20] = float("-inf")
    expected = torch.softmax(x, dim=-1)
    for block in (None, 8):
        got = softmax(x, block=block)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("block", [None, 8])
@pytest.mark.parametrize("position", [0, 7, 39])
def test_a_softmax_row_holding_a_nan_is_nan_as_in_torch(block, position):
    """The blocked pass's running maximum used triton's default ``maximum``, which
    drops a NaN (as a GPU's max instruction does): the rest of the row came back
    as finite probabilities, where torch's row is NaN."""
    from dispatch.kernels.softmax import softmax

    x = randn(3, 40)
    x[1, position] = float("nan")
    got = softmax(x, block=block)
    assert got[1].isnan().all() and not got[[0, 2]].isnan().any()
    torch.testing.assert_close(got, torch.softmax(x, dim=-1), equal_nan=True)


def test_softmax_rejects_other_dims():
    from dispatch.kernels.softmax import softmax

    with pytest.raises(ValueError, match="last dimension"):
        softmax(randn(3, 4), dim=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, normalized, block",
    [((3, 7), (7,), None), ((2, 3, 10), (3, 10), 8), ((6, 1), (1,), None), ((2, 300), (300,), 64)],
)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, normalized, block, dtype, affine):
    from dispatch.kernels.layer_norm import layer_norm, reference

    x = randn(*shape, dtype=dtype, scale=3.0) + 1.5
    weight = randn(*normalized, dtype=dtype) if affine else None
    bias = randn(*normalized, dtype=dtype) if affine else None
    out, mean, rstd = layer_norm(x, normalized, weight, bias, 1e-5, block=block)
    ref_out, ref_mean, ref_rstd = reference(x, normalized, weight, bias, 1e-5)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, ref_out, rtol=rtol * 10, atol=atol * 10)
    assert mean.shape == ref_mean.shape and rstd.shape == ref_rstd.shape
    assert mean.dtype == ref_mean.dtype
    torch.testing.assert_close(mean, ref_mean, rtol=rtol, atol=atol)
    torch.testing.assert_close(rstd, ref_rstd, rtol=rtol * 10, atol=atol * 10)


def test_layer_norm_stats_dtype_follows_aten_on_cuda_for_half():
    from dispatch.kernels.layer_norm import layer_norm

    x = randn(4, 8, dtype=torch.float16)
    _, mean, rstd = layer_norm(x, (8,), None, None, 1e-5, stats_dtype=torch.float32)
    assert mean.dtype == rstd.dtype == torch.float32
    torch.testing.assert_close(mean, x.float().mean(-1, keepdim=True), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block", [((3, 7), None), ((2, 5, 33), 8), ((4, 1), None)])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm(shape, block, dtype, weighted):
    from dispatch.kernels.rms_norm import reference, rms_norm

    x = randn(*shape, dtype=dtype, scale=2.0)
    weight = randn(shape[-1], dtype=dtype) if weighted else None
    rtol, atol = TOL[dtype]
    got = rms_norm(x, weight, 1e-6, block=block)
    torch.testing.assert_close(got, reference(x, weight, 1e-6), rtol=rtol * 10, atol=atol * 10)
    widened = rms_norm(x, weight, 1e-6, out_dtype=torch.float32, block=block)
    assert widened.dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("m, k, n", [(33, 40, 20), (1, 17, 3), (16, 16, 16)])
def test_linear_act(m, k, n, activation, dtype):
    from dispatch.kernels.matmul import linear_act, reference

    a = randn(m, k, dtype=dtype)
    weight = randn(n, k, dtype=dtype)  # as nn.Linear stores it: b is its transpose
    bias = randn(n, dtype=dtype)
    rtol, atol = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}[
        dtype
    ]
    got = linear_act(a, weight.t(), bias, activation)
    torch.testing.assert_close(got, reference(a, weight.t(), bias, activation), rtol=rtol, atol=atol)
    no_bias = linear_act(a, weight.t(), None, activation)
    torch.testing.assert_close(no_bias, reference(a, weight.t(), None, activation), rtol=rtol, atol=atol)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_act_keeps_a_nan_as_torch_does(activation):
    """relu's epilogue used triton's default ``maximum``, which drops a NaN: the
    row of a NaN input came back as zeros where ``torch.relu`` keeps NaN."""
    from dispatch.kernels.matmul import linear_act, reference

    a, weight = randn(8, 16), randn(4, 16)
    a[3, 5] = float("nan")
    got = linear_act(a, weight.t(), None, activation)
    assert got[3].isnan().all() and not got[[0, 1, 2, 4, 5, 6, 7]].isnan().any()
    torch.testing.assert_close(
        got, reference(a, weight.t(), None, activation), equal_nan=True, rtol=1e-4, atol=1e-4
    )


def test_linear_act_checks_its_arguments():
    from dispatch.kernels.matmul import linear_act

    with pytest.raises(ValueError, match="do not chain"):
        linear_act(randn(3, 4), randn(5, 6))
    with pytest.raises(ValueError, match="activation"):
        linear_act(randn(3, 4), randn(4, 2), activation="tanh")


def test_kernels_refuse_cpu_tensors_outside_the_interpreter(monkeypatch):
    from dispatch.kernels.softmax import softmax

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        softmax(torch.randn(2, 3))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_on_cuda_large(dtype):
    from dispatch.kernels.layer_norm import layer_norm
    from dispatch.kernels.layer_norm import reference as ln_ref
    from dispatch.kernels.rms_norm import reference as rms_ref
    from dispatch.kernels.rms_norm import rms_norm
    from dispatch.kernels.softmax import reference as sm_ref
    from dispatch.kernels.softmax import softmax

    x = torch.randn(4096, 8192, device="cuda", dtype=dtype)
    w = torch.randn(8192, device="cuda", dtype=dtype)
    torch.testing.assert_close(softmax(x), sm_ref(x), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(
        layer_norm(x, (8192,), w, w)[0], ln_ref(x, (8192,), w, w)[0], rtol=2e-2, atol=2e-2
    )
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_ref(x, w, 1e-6), rtol=2e-2, atol=2e-2)
