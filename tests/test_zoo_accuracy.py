"""The benchmarks' accuracy judge: the dashboard's rule, against eager in the cell's dtype."""

import copy

import torch

from benchmarks.accuracy import accurate, fp64_truth


def _runs(dtype):
    """fp64 truth, eager in ``dtype``, and fp32 eager, of one small random MLP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    with torch.no_grad():
        fp64 = model.double()(x.double())
        low = model.to(dtype)(x.to(dtype))
        fp32 = model.float()(x)
    return fp64, low, fp32


def test_bfloat16_eager_passes_against_itself_with_an_fp64_truth():
    fp64, bf16, fp32 = _runs(torch.bfloat16)
    assert accurate(bf16, fp64, bf16.clone(), torch.bfloat16)
    # Judged against fp32 eager (the zoo's first rule), bf16 eager itself failed.
    assert not accurate(fp32, fp64, bf16, torch.bfloat16)


def test_a_bfloat16_result_far_worse_than_bfloat16_eager_fails():
    fp64, bf16, _ = _runs(torch.bfloat16)
    noisy = bf16 + 0.05 * bf16.abs().max() * torch.randn(
        bf16.shape, generator=torch.Generator().manual_seed(1)
    ).to(torch.bfloat16)
    assert not accurate(bf16, fp64, noisy, torch.bfloat16)


def test_float32_is_judged_against_float32_eager():
    fp64, _, fp32 = _runs(torch.float32)
    assert accurate(fp32, fp64, fp32.clone(), torch.float32)
    assert not accurate(fp32, fp64, fp32 + 1e-2 * fp32.abs().max(), torch.float32)


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values, self.dtype = keys, values, keys.dtype


class _Cache:
    """Holds its tensors on objects pytree does not open, as transformers' DynamicCache does."""

    def __init__(self, *layers: _Layer) -> None:
        self.layers = list(layers)


def test_a_wrong_kv_cache_fails_as_a_wrong_hidden_state_does():
    torch.manual_seed(0)
    hidden, k, v = torch.randn(2, 8), torch.randn(2, 4), torch.randn(2, 4)
    ref = {"last_hidden_state": hidden, "past_key_values": _Cache(_Layer(k, v))}
    fp64 = {"last_hidden_state": hidden.double(), "past_key_values": _Cache(_Layer(k.double(), v.double()))}
    right = {"last_hidden_state": hidden.clone(), "past_key_values": _Cache(_Layer(k.clone(), v.clone()))}
    wrong = {"last_hidden_state": hidden.clone(), "past_key_values": _Cache(_Layer(k.clone(), v + 1))}
    assert accurate(ref, fp64, right, torch.float32)
    assert not accurate(ref, fp64, wrong, torch.float32)


def test_the_bench_fails_a_peer_that_computes_an_fp32_model_in_bfloat16():
    # OpenVINO's default on CPUs with AVX512_BF16: mlp_1024 came back 2e-3 off
    # against fp32 eager's 2e-7, and was the bench's best peer.
    import copy

    from benchmarks.models import build
    from benchmarks.worker import accuracy_error

    model, (x,) = build("mlp_1024")
    with torch.no_grad():
        fp64 = copy.deepcopy(model).double()(x.double())
        fp32 = model(x)
        bf16 = copy.deepcopy(model).bfloat16()(x.bfloat16()).float()
    error = accuracy_error(bf16, fp32, fp64)
    assert error is not None and error.startswith("accuracy: max error")
    assert accuracy_error(fp32.clone(), fp32, fp64) is None


def test_a_model_with_no_float64_run_is_judged_by_cosine_similarity():
    """transformers' mixture-of-experts layers call ``torch._grouped_mm``, which has
    no float64 kernel: the zoo's fp64 truth raised and failed every column, eager
    included. The dashboard's fallback is cosine similarity with eager."""
    _, _, fp32 = _runs(torch.float32)

    def no_double():
        raise RuntimeError("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double")

    truth = fp64_truth(no_double)
    assert truth is None
    assert accurate(fp32, truth, fp32 + 1e-6, torch.float32)
    assert not accurate(fp32, truth, torch.flip(fp32, [0]), torch.float32)


class _Doubles(torch.nn.Module):
    """Doubles its input in place, then computes on it."""

    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x):
        x.mul_(2)
        return self.l(x) + 1


def test_accuracy_judged_again_catches_a_program_that_goes_wrong_after_its_first_call():
    """A trial swaps programs after the first call; the check at a cell's end runs
    what is running then, against eager on the input as it is now."""
    from benchmarks.accuracy import inference_accurate_now

    torch.manual_seed(0)
    model, inputs = _Doubles(), (torch.randn(4, 8),)
    eager = copy.deepcopy(model)
    with torch.no_grad():
        for _ in range(3):  # the input has been doubled in place three times by now
            model(*inputs)
        assert inference_accurate_now(lambda: model(*inputs), eager, inputs, torch.float32)
        assert not inference_accurate_now(lambda: model(*inputs) * 1.01, eager, inputs, torch.float32)


class _Embeds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.l = torch.nn.Embedding(6, 8), torch.nn.Linear(8, 8)

    def forward(self, x, ids):
        return self.l(x) + self.embed(ids)


def test_accuracy_judged_again_runs_on_new_input_values():
    """A program that kept its first output (or an input's values) is right on the
    inputs it was traced with and wrong on the next request's."""
    from benchmarks.accuracy import inference_accurate_now

    torch.manual_seed(0)
    model = _Embeds()
    x, ids = torch.randn(2, 3, 8), torch.arange(6).reshape(2, 3)
    with torch.no_grad():
        first = model(x, ids)
        assert not inference_accurate_now(lambda: first, model, (x, ids), torch.float32)
        assert inference_accurate_now(lambda: model(x, ids), model, (x, ids), torch.float32)
    assert ids.tolist() == [[1, 2, 0], [4, 5, 3]]  # rolled twice: the same values, other places


def test_error_spread_tells_a_lost_precision_from_another_rounding(monkeypatch):
    """A column computing in bfloat16 fails the rule on most inputs with its error
    far above eager's; one that only sums in another order sits near eager's."""
    from benchmarks.zoo import error_spread
    from benchmarks.zoo.models import ZooModel

    def build():
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        return model, (torch.randn(32, 64),)

    def compiled(column, model):
        if column == "bf16":
            low = copy.deepcopy(model).bfloat16()
            return lambda x: low(x.bfloat16()).float()
        transposed = [(layer, layer.weight.t().contiguous()) for layer in model if hasattr(layer, "weight")]

        def reordered(x):  # x @ W^T through another kernel: the same sums, other rounding
            first, second = transposed
            hidden = torch.nn.functional.gelu(torch.mm(x, first[1]) + first[0].bias)
            return torch.mm(hidden, second[1]) + second[0].bias

        return reordered

    monkeypatch.setattr(error_spread, "EVERY_MODEL", {"mlp": ZooModel("mlp", "test", build)})
    monkeypatch.setattr(error_spread.columns, "compiled", compiled)
    monkeypatch.setattr(error_spread, "WARM_UP_CALLS", 1)
    report = error_spread.spread("mlp", ["reordered", "bf16"], inputs_count=6)
    assert report["bf16"]["failures"] == 6 and report["bf16"]["median_over_eager"] > 100
    assert report["reordered"]["failures"] == 0 and report["reordered"]["median_over_eager"] < 3
    assert report["eager"]["median_rmse"] < 1e-6


class _CountsIds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)

    def forward(self, ids):
        ids.add_(1)  # a step counter kept in an integer input
        return self.embed(ids)


def test_the_fp64_truth_leaves_an_integer_input_as_it_was():
    """The fp64 run goes first; a model that updates an integer input in place must
    not hand eager and the column other inputs than the truth saw."""
    from benchmarks.accuracy import fp64_inference

    ids = torch.tensor([[0, 1, 2]])
    with torch.no_grad():
        truth = fp64_inference(_CountsIds(), (ids,))
    assert ids.tolist() == [[0, 1, 2]]
    assert truth.dtype == torch.float64
