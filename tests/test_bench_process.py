"""How the benchmarks size their timed batches."""

import pytest

from benchmarks.process import _calls_per_batch


class _Worker:
    """A worker whose calls take ``per_call_s`` each, but whose first call
    takes ``first_s`` (a recompile when a data-dependent branch flips)."""

    def __init__(self, per_call_s: float, first_s: float) -> None:
        self.per_call_s, self.first_s, self.calls = per_call_s, first_s, 0

    def time(self, calls: int) -> float:
        total = calls * self.per_call_s
        if self.calls == 0:
            total += self.first_s - self.per_call_s
        self.calls += calls
        return total / calls


def test_a_one_off_slow_call_does_not_size_the_batch():
    # Sized from the slow call alone, the batch held one call, and every timed
    # call came after a pause: the graph-break model read 2.3x slower than it runs.
    assert _calls_per_batch(_Worker(per_call_s=1e-3, first_s=2.0), batch_s=0.1) == 100


def test_a_slow_model_gets_batches_of_one_call():
    assert _calls_per_batch(_Worker(per_call_s=0.2, first_s=0.2), batch_s=0.1) == 1


def test_the_zoo_names_its_wider_set_and_refuses_unknown_models():
    from benchmarks.zoo.models import ZOO
    from benchmarks.zoo.wider import WIDER, model_names

    assert model_names("hf_bert,wider") == ["hf_bert", *WIDER]
    assert not set(WIDER) & set(ZOO)
    with pytest.raises(ValueError, match="hf_nonexistent"):
        model_names("hf_bert,hf_nonexistent")
