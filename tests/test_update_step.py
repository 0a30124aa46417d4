"""Update steps (an optimizer's ``step()``, a weight average) compile whole on
inductor on CPU: ONNX Runtime returned each updated tensor to be copied back
(timm's ResNet-18 with SGD and momentum: 26.3 ms a step under auto, against
16.9 eagerly and 10.0 under inductor)."""

import copy

import torch
from torch._functorch.aot_autograd import aot_module_simplified

import dispatch
from dispatch.update_step import is_update_step


def judged(fn, *args):
    """``is_update_step`` of Dynamo's graph of ``fn`` and of the aten graph
    AOTAutograd makes of it, each as the backend sees it."""
    answers = []

    def backend(gm, example_inputs):
        answers.append(is_update_step(gm))

        def inner(aten, inputs):
            answers.append(is_update_step(aten))
            return aten.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=inner)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return answers


def with_gradients(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


def test_an_optimizer_step_is_an_update_step_before_and_after_aotautograd():
    model = with_gradients()
    for optimizer in (
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False),
    ):
        assert judged(optimizer.step) == [True, True], type(optimizer).__name__


def test_a_weight_average_is_an_update_step():
    average = [torch.zeros(4, 4) for _ in range(3)]
    weights = [torch.randn(4, 4) for _ in range(3)]
    assert judged(lambda: torch._foreach_lerp_(average, weights, 0.1)) == [True, True]


def test_what_multiplies_matrices_or_writes_no_input_is_not():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert judged(lambda x, w: x.add_(x @ w), x, w) == [False, False]  # a matmul
    assert judged(lambda x: torch.nn.functional.linear(x, torch.ones(4, 4)), x) == [False, False]
    assert judged(lambda x: (x * 2).add_(1), x) == [False, False]  # writes its own intermediate
    assert judged(lambda x: x.sin() + 1, x) == [False, False]


def test_optimizer_step_compiles_on_inductor_and_updates_as_eager_does():
    model, reference = with_gradients(), with_gradients()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    expected = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    explanation = dispatch.explain(optimizer.step)  # the first step
    computing = [r for r in explanation.regions if r.node_count]
    assert computing and {r.route for r in computing} == {"inductor"}
    assert "CPU update step" in computing[0].rejected["onnxrt"]
    step = torch.compile(optimizer.step, backend="auto")
    step()
    step()
    for _ in range(3):
        expected.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    for state, state_expected in zip(optimizer.state.values(), expected.state.values(), strict=True):
        torch.testing.assert_close(state["exp_avg_sq"], state_expected["exp_avg_sq"])


def test_in_place_update_with_a_matmul_keeps_the_inference_rule():
    def accumulate(total, x, w):
        total.add_(x @ w)
        return total * 2

    total, x, w = torch.zeros(8, 8), torch.randn(8, 8), torch.randn(8, 8)
    explanation = dispatch.explain(accumulate, copy.deepcopy(total), x, w)
    assert "onnxrt" in {r.route for r in explanation.regions}
    assert "inductor" not in {r.route for r in explanation.regions}
