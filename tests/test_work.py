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


def test_torch_level_linear_and_conv_count_like_their_aten_forms():
    """torch.export and the ONNX-friendly decompositions keep ``linear`` and
    ``conv2d``: counted as one flop per element, a 1024-wide MLP looked too small
    for ORT's thread pool and ran on one thread (1.8x slower, lowered bench)."""
    from torch.export import export

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 16)
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x, img):
            return self.lin(x), self.conv(img)

    program = export(Both(), (torch.randn(32, 64), torch.randn(2, 3, 10, 10))).run_decompositions({})
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert {torch.ops.aten.linear.default, torch.ops.aten.conv2d.default} <= targets
    assert estimated_flops(program.graph_module) == 2 * 32 * 16 * 64 + 2 * (2 * 8 * 10 * 10) * (3 * 3 * 3)
