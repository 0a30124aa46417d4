"""The work estimate that sizes a runtime's thread pool for a region."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dispatch.work import estimated_flops


def _aten(fn, *shapes, mode="real"):
    return make_fx(fn, tracing_mode=mode)(*(torch.randn(*s) for s in shapes))


def test_matmuls_count_their_multiply_adds_and_other_ops_their_elements():
    gm = _aten(lambda x, w, b: torch.relu(torch.addmm(b, x, w)), (32, 64), (64, 16), (16,))
    assert estimated_flops(gm) == 2 * 32 * 64 * 16 + 32 * 16
    gm = _aten(lambda a, b: torch.bmm(a, b), (4, 8, 5), (4, 5, 3))
    assert estimated_flops(gm) == 2 * 4 * 8 * 5 * 3


def test_a_convolution_counts_its_kernel_per_output_element():
    gm = _aten(
        lambda x, w: torch.nn.functional.conv2d(x, w, padding=1, groups=2), (2, 8, 10, 10), (6, 4, 3, 3)
    )
    assert estimated_flops(gm) == 2 * (2 * 6 * 10 * 10) * (4 * 3 * 3)


def test_a_symbolic_size_is_not_read():
    gm = _aten(lambda x, w: x @ w, (32, 64), (64, 16), mode="symbolic")
    assert estimated_flops(gm) is None
