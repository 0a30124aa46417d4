"""How the benchmarks size their timed batches."""

import os

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


def test_the_wider_sets_code_patterns_build_and_run_eagerly():
    # Built without transformers or timm: only torch. Each must run on its own
    # inputs, so that a zoo run over the wider set measures it instead of failing.
    import torch

    from benchmarks.zoo.layer_patterns import LAYER_PATTERNS
    from benchmarks.zoo.patterns import PATTERNS
    from benchmarks.zoo.wider import WIDER

    patterns = {**PATTERNS, **LAYER_PATTERNS}
    assert {n for n, m in WIDER.items() if m.source == "pattern"} == set(patterns)
    for name in patterns:
        model, inputs = WIDER[name].build()
        with torch.no_grad():
            out = model.eval()(*inputs)
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if t.is_floating_point()]
        assert leaves and all(bool(t.isfinite().all()) for t in leaves), name


class _FakeCell:
    """A zoo worker that compiles nothing: its per-call time is set by its cache
    folder's name (one per process), and it records the folder it was given."""

    started: list[list[str]] = []
    events: list[tuple[str, str]] = []  # (what happened, the cell's column)
    speed = {"eager#0": 2e-3, "eager#1": 1e-3, "auto#0": 1.5e-3, "auto#1": 3e-3}

    def __init__(self, module, args, ready_prefix, log=None, gated=False) -> None:
        self.args = args
        self.warm = args[-1] in [a[-1] for a in _FakeCell.started]  # a second process on one cache
        _FakeCell.started.append(args)
        self.ready: dict = {}

    def let_compile(self) -> None:
        pass

    def release(self) -> None:
        _FakeCell.events.append(("compile", self.args[1]))
        self.ready = {
            "ok": True,
            "accurate": True,
            "compile_s": 9.0 if self.warm else 1.0,
            "routes": ["eager"],
        }

    def time(self, calls: int) -> float:
        return next(s for k, s in _FakeCell.speed.items() if k.replace("#", "-") in self.args[-1])

    def quit(self) -> None:
        pass

    def close(self) -> float:
        _FakeCell.events.append(("end", self.args[1]))
        # A trial moved the region after the first call (the worker reports the routes at the end).
        warm_up_s = 0.5 if self.warm else 2.0  # a cold start's trial compiled after its first call
        self.final = {
            "peak_rss_mb": 100.0,
            "routes": ["inductor"],
            "warm_up_s": warm_up_s,
            "warm_up_calls": 100,
        }
        return 100.0


def _zoo_args(processes):
    """The zoo runner's arguments for a CPU run, warm starts on, nothing logged."""
    import argparse

    return argparse.Namespace(
        processes=processes,
        device="cpu",
        dtype="float32",
        logs=None,
        compile_together=False,
        seconds=0.0,
        no_warm=False,
    )


def test_each_zoo_column_runs_in_its_own_processes_and_shows_the_fastest(monkeypatch):
    """``--processes 2``: every process has fresh caches of its own, the cell is the
    fastest process's median with every process's kept, and the warm start reuses
    the first process's caches."""
    import benchmarks.zoo.run as zoo_run

    monkeypatch.setattr(zoo_run, "Worker", _FakeCell)
    monkeypatch.setattr(zoo_run, "WARM", ("auto",))
    _FakeCell.started = []
    args = _zoo_args(processes=2)
    row = zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), args)
    eager, auto = row["cells"]["eager"], row["cells"]["auto"]
    assert (eager["per_call_s"], sorted(eager["per_call_runs_s"])) == (1e-3, [1e-3, 2e-3])
    assert (auto["per_call_s"], sorted(auto["per_call_runs_s"])) == (1.5e-3, [1.5e-3, 3e-3])
    caches = [a[-1] for a in _FakeCell.started]
    assert len(set(caches[:4])) == 4  # no process starts on another's caches
    assert caches[4] == next(c for c in caches[:4] if "auto-0" in c)  # the warm start
    assert auto["compile_s"] == 1.0 and auto["warm_compile_s"] == 9.0
    assert (auto["routes"], auto["first_call_routes"], auto["warm_up_s"]) == (["inductor"], ["eager"], 2.0)


def test_a_cell_is_warmed_up_before_its_first_timed_batch(monkeypatch):
    """The trials auto runs on its calls (an inductor compile around the 80th, for a
    graph slow for its work, and inductor's rounds after it) are over before the
    timing budget is spent."""
    from benchmarks import warm_up
    from dispatch.graph_trial import LONGEST_TRIAL_CALLS

    calls, syncs = [], []
    warmed = warm_up.warmed_up(lambda: calls.append(1), lambda: syncs.append(1))
    assert len(calls) == warmed["warm_up_calls"] == warm_up.WARM_UP_CALLS
    assert max(150, LONGEST_TRIAL_CALLS) <= warm_up.WARM_UP_CALLS
    assert syncs == [1] and warmed["warm_up_s"] >= 0
    monkeypatch.setattr(warm_up, "WARM_UP_S", 0.0)  # a training step of seconds stops at the cap
    assert warm_up.warmed_up(lambda: calls.append(1))["warm_up_calls"] == 0


def test_a_bench_cell_times_its_batches_after_the_warm_up(monkeypatch, capsys, tmp_path):
    """The bench timed from the first batch: the lowered TransformerEncoderLayer,
    whose ORT thread trial runs half its first 64 calls on one thread (13.8 ms
    against 7.3), read 9.9 ms. Its worker now warms up first, as the zoo's do,
    and says so at the end."""
    import io
    import json

    import torch

    from benchmarks import warm_up, worker

    calls = []

    def make(column, model, inputs):
        return lambda: calls.append(len(calls)) or model(*inputs)

    torch.manual_seed(0)
    monkeypatch.setattr(worker, "build", lambda name: (torch.nn.Linear(8, 8), (torch.randn(4, 8),)))
    monkeypatch.setattr(worker.columns, "make", make)
    monkeypatch.setattr(warm_up, "WARM_UP_CALLS", 5)
    monkeypatch.setattr("sys.stdin", io.StringIO("2\n3\nquit\n"))
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    worker.main("tiny", "eager", str(tmp_path))
    out = capsys.readouterr().out
    final = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH_RSS "))[len("BENCH_RSS ") :])
    assert final["warm_up_calls"] == 5
    # the first call, the one after it, the warm-up, two batches, the check on new values
    assert len(calls) == 2 + 5 + 2 + 3 + 1
    assert final["error_after_timing"] is None


@pytest.mark.parametrize("mode", ["infer", "train"])
@pytest.mark.parametrize("program", ["right", "wrong later", "keeps its first inputs"])
def test_a_zoo_cell_judges_its_accuracy_again_once_warmed_up_and_timed(
    monkeypatch, capsys, tmp_path, mode, program
):
    """auto's trials swap programs up to the 165th call; a program that is right on
    the first call and wrong after, or right only on the inputs it first saw, is
    the cell's failure, as the worker ends."""
    import io
    import json
    import types

    import torch

    from benchmarks import warm_up
    from benchmarks.zoo import worker

    def compiled(column, model):
        calls = []

        def forward(*args):
            calls.append(tuple(t.clone() for t in args))
            if program == "keeps its first inputs":
                return model(*calls[0])
            out = model(*args)
            return out * 1.01 if program == "wrong later" and len(calls) > 2 else out

        return forward

    torch.manual_seed(0)
    tiny = types.SimpleNamespace(build=lambda: (torch.nn.Linear(8, 8), (torch.randn(4, 8),)))
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    monkeypatch.setattr(worker, "EVERY_MODEL", {"tiny": tiny})
    monkeypatch.setattr(worker.columns, "compiled", compiled)
    monkeypatch.setattr(warm_up, "WARM_UP_CALLS", 3)
    monkeypatch.setattr("sys.stdin", io.StringIO("go\n2\nquit\n"))
    monkeypatch.setattr("sys.__stdout__", io.StringIO())
    worker.main("tiny", "eager", mode, "cpu", "float32", str(tmp_path))

    def reported(prefix, text):
        return json.loads(next(x for x in text.splitlines() if x.startswith(prefix))[len(prefix) :])

    ready = reported("ZOO_READY ", capsys.readouterr().out)
    final = reported("BENCH_RSS ", worker.sys.__stdout__.getvalue())
    assert ready["accurate"] is True  # the first call was right either way
    assert final["accurate_after_warm_up"] is (program == "right")


def test_a_zoo_cell_wrong_after_its_warm_up_fails_with_the_reason(monkeypatch):
    import benchmarks.zoo.run as zoo_run

    class WrongLater(_FakeCell):
        def close(self) -> float:
            peak = super().close()
            if self.args[1] == "auto":
                self.final["accurate_after_warm_up"] = False
            return peak

    monkeypatch.setattr(zoo_run, "Worker", WrongLater)
    monkeypatch.setattr(zoo_run, "WARM", ())
    _FakeCell.started = []
    row = zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), _zoo_args(processes=1))
    eager, auto = row["cells"]["eager"], row["cells"]["auto"]
    assert eager["ok"] and eager["error"] is None
    assert not auto["ok"] and auto["accurate"] is True and auto["accurate_after_warm_up"] is False
    assert auto["error"] == "after the warm-up: differs from float32 eager beyond the dashboard's tolerance"


@pytest.mark.parametrize("failure", ["compile", "after the warm-up", "died"])
def test_a_zoo_cell_whose_warm_start_fails_fails_with_the_reason(monkeypatch, failure):
    """A second process on the same caches (a fresh-process round trip of every
    cache auto keeps) is judged as the first was: on its first call, and again
    after its warm-up on new input values. Its failure used to leave only a
    missing warm time behind, the cell passing."""
    import benchmarks.zoo.run as zoo_run

    class WrongWhenWarm(_FakeCell):
        def release(self) -> None:
            super().release()
            if self.warm and failure == "compile":
                self.ready = {"ok": False, "error": "RuntimeError: a stale entry"}

        def time(self, calls: int) -> float:
            if self.warm and failure == "died":
                raise RuntimeError("worker died while timing")
            return super().time(calls)

        def close(self) -> float:
            peak = super().close()
            if self.warm and failure == "after the warm-up":
                self.final["accurate_after_warm_up"] = False
            return peak

    monkeypatch.setattr(zoo_run, "Worker", WrongWhenWarm)
    monkeypatch.setattr(zoo_run, "WARM", ("auto",))
    _FakeCell.started = []
    row = zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), _zoo_args(processes=1))
    eager, auto = row["cells"]["eager"], row["cells"]["auto"]
    assert eager["ok"] and eager["error"] is None
    assert not auto["ok"] and auto["accurate"] is True and auto["warm_compile_s"] is None
    why = {
        "compile": "warm start: RuntimeError: a stale entry",
        "after the warm-up": "warm start, after the warm-up: differs from float32 eager beyond the"
        " dashboard's tolerance",
        "died": "warm start: worker died while timing",
    }
    assert auto["error"] == why[failure]


def test_a_zoo_warm_start_is_warmed_up_and_judged_again(monkeypatch):
    """The warm process runs its warm-up (a trial there may settle elsewhere than
    the cold one did) before it ends, so its second check has run."""
    import benchmarks.zoo.run as zoo_run

    timed = []

    class Counted(_FakeCell):
        def time(self, calls: int) -> float:
            timed.append((self.warm, calls))
            return super().time(calls)

    monkeypatch.setattr(zoo_run, "Worker", Counted)
    monkeypatch.setattr(zoo_run, "WARM", ("auto",))
    _FakeCell.started = []
    row = zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), _zoo_args(processes=1))
    assert [calls for warm, calls in timed if warm] == [1]
    assert row["cells"]["auto"]["ok"] and row["cells"]["auto"]["warm_compile_s"] == 9.0


def test_a_zoo_cell_counts_what_each_process_compiled_after_its_first_call(monkeypatch):
    """auto's trial compiles inductor tens of calls in: the warm-up's time beyond
    its calls at the per-call median is kept, for the cold and the warm process."""
    import benchmarks.zoo.run as zoo_run

    monkeypatch.setattr(zoo_run, "Worker", _FakeCell)
    monkeypatch.setattr(zoo_run, "WARM", ("auto",))
    _FakeCell.started = []
    row = zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), _zoo_args(processes=1))
    auto, eager = row["cells"]["auto"], row["cells"]["eager"]
    assert auto["later_compile_s"] == pytest.approx(2.0 - 100 * 1.5e-3)
    assert auto["warm_later_compile_s"] == pytest.approx(0.5 - 100 * 1.5e-3)
    assert eager["later_compile_s"] == pytest.approx(2.0 - 100 * 2e-3)
    assert eager["warm_later_compile_s"] is None  # no warm start
    # A warm-up no slower than its calls compiled nothing; an unknown one is not guessed.
    assert zoo_run.later_compile_s({"warm_up_s": 0.1, "warm_up_calls": 100}, 2e-3) == 0.0
    assert zoo_run.later_compile_s({"warm_up_s": 0.1}, 2e-3) is None


def _zoo_cell(per_call_s, compile_s=0.1, warm_compile_s=None, ok=True, later=None, warm_later=None):
    return {
        "ok": ok,
        "error": None if ok else "failed",
        "per_call_s": per_call_s,
        "compile_s": compile_s,
        "later_compile_s": later,
        "warm_compile_s": warm_compile_s,
        "warm_later_compile_s": warm_later,
        "peak_mb": None,
        "routes": ["onnxrt"],
    }


def test_the_zoo_report_states_auto_against_its_targets():
    """Rows over 1.05x the best other column (direct ONNX Runtime counted and not),
    and geomean ratios over the rows where both sides passed."""
    from benchmarks.zoo.run import markdown, targets

    def row(model, **cells):
        return {"model": model, "mode": "infer", "cells": cells}

    rows = [
        row(
            "a",
            eager=_zoo_cell(2e-3),
            inductor=_zoo_cell(1e-3, compile_s=8.0, later=0.0),
            onnxrt_direct=_zoo_cell(0.5e-3),
            # Its trial compiled inductor for 6 s after its first call.
            auto=_zoo_cell(1.04e-3, compile_s=2.0, warm_compile_s=0.5, later=6.0, warm_later=0.0),
        ),
        row(
            "b",
            eager=_zoo_cell(1e-3),
            inductor=_zoo_cell(1e-3, compile_s=8.0),
            onnxrt_direct=_zoo_cell(None, ok=False),
            auto=_zoo_cell(1.2e-3, compile_s=4.0),
        ),
        row("c", eager=_zoo_cell(1e-3), auto=_zoo_cell(None, ok=False)),  # auto failed: not counted
    ]
    t = targets(rows, "infer")
    assert t["rows"] == 2
    assert t["over_best_other"] == ["a", "b"]
    assert t["over_best_other_than_direct_ort"] == ["b"]  # a: 1.04 ms against inductor's 1.00
    # (2/1.04 over 2/1, and 1/1.2 over 1/1), geomean
    assert t["speedup_over_inductors"] == pytest.approx(((2 / 1.04 / 2) * (1 / 1.2)) ** 0.5)
    assert t["cold_compile_over_inductors"] == pytest.approx((2 / 8 * 4 / 8) ** 0.5)
    assert t["warm_over_cold"] == pytest.approx(0.25)  # only a had a warm start
    # With what each compiled after its first call: only a knows it.
    assert t["cold_compile_with_later_over_inductors"] == pytest.approx(8 / 8)
    assert t["warm_over_cold_with_later"] == pytest.approx(0.5 / 8)
    report = markdown(
        {
            "device": "cpu",
            "dtype": "float32",
            "time": "t",
            "machine": {},
            "columns": {"infer": ("eager", "inductor", "auto", "onnxrt_direct")},
            "rows": rows[:2],
            "summary": {"infer": {}},
        }
    )
    assert "| rows within 1.05x the best other column | 0 of 2 (over: a, b) |" in report
    assert "| ... the best other than direct ONNX Runtime | 1 of 2 (over: b) |" in report
    assert "| warm compile over its own cold (geomean) | 0.25x |" in report
    later = "with what each compiled after its first call (geomean)"
    assert f"| cold compile over inductor's, {later} | 1.00x |" in report
    assert f"| warm compile over its own cold, {later} | 0.06x |" in report


def test_a_zoo_warm_start_compiles_after_the_one_before_it_ended(monkeypatch):
    """A process that is ending (inductor's compile pool shutting down) takes cores
    from a warm start compiling beside it."""
    import benchmarks.zoo.run as zoo_run

    monkeypatch.setattr(zoo_run, "Worker", _FakeCell)
    monkeypatch.setattr(zoo_run, "WARM", ("eager", "auto"))
    _FakeCell.started, _FakeCell.events = [], []
    args = _zoo_args(processes=1)
    zoo_run.run_model("inplace_input", "infer", ("eager", "auto"), args)
    cold = [("compile", "eager"), ("compile", "auto"), ("end", "eager"), ("end", "auto")]
    warm = [("compile", "eager"), ("end", "eager"), ("compile", "auto"), ("end", "auto")]
    assert _FakeCell.events == cold + warm


def test_a_zoo_cell_collects_its_set_ups_garbage_before_the_timed_compile(monkeypatch):
    # The set-up's garbage used to be walked by the first full collection inside
    # the timed compile: 0.19 s of auto's 0.34 s warm start on python_loop.
    import gc
    import io
    import weakref

    from benchmarks.zoo import worker

    class Cycle:
        pass

    monkeypatch.setattr("sys.stdin", io.StringIO("go\n"))
    monkeypatch.setattr("sys.__stdout__", io.StringIO())
    enabled = gc.isenabled()
    gc.disable()  # only an explicit collection frees a cycle now
    try:
        garbage = Cycle()
        garbage.itself = garbage
        alive = weakref.ref(garbage)
        del garbage
        worker._loaded()
        assert alive() is None
    finally:
        if enabled:
            gc.enable()


def test_in_turn_rotates_the_columns_each_round_on_fresh_caches_and_reports_a_failing_one(
    monkeypatch, tmp_path
):
    """A lent GPU's side-by-side timing: one column's failure is that column's row, the
    rest are timed; no column always runs right after another; each compiles on caches
    of its own, so none loads an earlier one's compile from disk."""
    import os

    import torch

    from benchmarks.zoo import in_turn

    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    monkeypatch.setattr(in_turn, "ROUNDS", 3)
    monkeypatch.setattr(in_turn, "CALLS", 2)
    monkeypatch.setattr(in_turn, "WARM_UP_CALLS", 1)
    order, caches = [], []

    def inference(column, model, inputs):
        if column == "broken":
            raise ValueError("no such column")
        caches.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        calls = []

        def call():  # b is right on its first call only, as a bad trial or replay would be
            order.append(column)
            calls.append(1)
            return model(*inputs) * (1.01 if column == "b" and len(calls) > 1 else 1)

        return call

    monkeypatch.setattr(in_turn.columns, "inference", inference)
    row = in_turn.model_row("graph_break", "cpu", torch.float32, ("a", "broken", "b"), profiled=1)

    assert row["columns"]["broken"] == {"error": "ValueError: no such column"}
    assert all(row["columns"][c]["accurate"] and row["columns"][c]["us"] > 0 for c in "ab")
    assert row["columns"]["a"]["accurate_after_timing"] is True
    assert row["columns"]["b"]["accurate_after_timing"] is False
    assert len(set(caches)) == 2 and str(tmp_path) not in caches
    timed = order[4:16]  # after each column's first call and warm-up
    assert timed == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert order[16:18] == ["a", "b"]  # each judged again
    assert order[18:] == ["a", "b"] and set(row["profiles"]) == {"a", "b"}
    assert "aten::mean" in row["profiles"]["a"]  # the model's own ops, as the profiler saw them


def test_copy_cost_times_only_variants_that_copy_and_reports_one_that_cannot(monkeypatch):
    """The lent GPU's split of the output copy: every way of copying is checked to
    hand back equal tensors in memory of their own before it is timed; one that
    cannot copy the tensors at hand (one flat buffer, over mixed dtypes) is that
    variant's error, and the others are still timed."""
    import torch

    from benchmarks.zoo import copy_cost

    monkeypatch.setattr(copy_cost, "CALLS", 2)
    monkeypatch.setattr(copy_cost, "ROUNDS", 1)
    strided = torch.randn(6, 4).t()  # a copy keeps its values, whatever the strides
    same = [torch.randn(3, 5), strided, torch.arange(7.0)]
    for label, copy in copy_cost.VARIANTS.items():
        copies = copy(same)
        assert all(torch.equal(c, t) for c, t in zip(copies, same)), label
        assert not {c.data_ptr() for c in copies} & {t.data_ptr() for t in same}, label

    def aliasing(tensors):
        return list(tensors)  # no copy at all: must not be timed as one

    monkeypatch.setitem(copy_cost.VARIANTS, "no copy", aliasing)
    mixed = [torch.randn(3, 5), torch.randn(2, dtype=torch.float64)]
    monkeypatch.setattr(copy_cost, "copied_tensors", lambda name, device, dtype: mixed)
    row = copy_cost.model_row("dict_list_outputs", "cpu", torch.float32)

    assert row["bytes"] == 15 * 4 + 2 * 8
    assert row["variants"]["one flat buffer"] == {"error": "ValueError: tensors of more than one dtype"}
    assert row["variants"]["no copy"] == {"error": "AssertionError: a copy shares memory with its tensor"}
    timed = {k: v for k, v in row["variants"].items() if "error" not in v}
    assert set(timed) == {"auto (copied)", "clone each", "empty_like + _foreach_copy_"}
    assert all(v["host_us"] > 0 and v["whole_us"] > 0 for v in timed.values())


def test_generate_compares_each_column_with_eager_tokens(monkeypatch):
    """The decoding benchmark: a column that decodes other tokens than eager is
    reported so; each row carries its first (compiling) and later times."""
    import torch

    from benchmarks.zoo import generate

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)

        def forward(self, ids):
            return self.head(self.embed(ids).cumsum(1))

        def generate(self, ids, max_new_tokens, **_):
            for _ in range(max_new_tokens):
                ids = torch.cat([ids, self.forward(ids)[:, -1:].argmax(-1)], 1)
            return ids

    def shifted(gm, example_inputs):  # a backend with wrong numbers: the next token moves
        return lambda *args: tuple(t.roll(1, -1) for t in gm(*args))

    monkeypatch.setattr(generate, "_decoder", lambda name, device, dtype: (Decoder(), torch.tensor([[1, 2]])))
    registry = torch._dynamo.backends.registry
    monkeypatch.setitem(registry._BACKENDS, "shifted", None)
    monkeypatch.setitem(registry._COMPILER_FNS, "shifted", shifted)
    right = generate.one_column("toy", "eager", "cpu", torch.float32, tokens=3, rounds=3)
    wrong = generate.one_column("toy", "shifted", "cpu", torch.float32, tokens=3, rounds=3)
    assert right["same_tokens"] and not wrong["same_tokens"]
    assert right["first_s"] >= 0 and right["median_ms"] > 0 and right["per_token_us"] > 0


def test_generate_decodes_an_encoder_decoder_with_its_seq2seq_head():
    """T5's config names no decoder start token and the zoo wraps it to call it by
    keyword: the decoding benchmark still builds its seq2seq model and decodes."""
    pytest.importorskip("transformers")
    import torch

    from benchmarks.zoo import generate

    model, prompt = generate._decoder("hf_t5", "cpu", torch.float32)
    assert model.config.is_encoder_decoder and type(model).__name__ == "T5ForConditionalGeneration"
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (prompt.shape[0], 4)  # the start token, then three


def test_a_child_process_gets_no_dispatch_setting_of_the_user(monkeypatch):
    """A forced route in the user's shell would change what auto's column measures."""
    from benchmarks.process import child_env

    monkeypatch.setenv("DISPATCH_ROUTE", "eager")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = child_env(DISPATCH_CACHE_DIR="/tmp/x")
    assert "DISPATCH_ROUTE" not in env and "PYTHONDONTWRITEBYTECODE" not in env
    assert env["DISPATCH_CACHE_DIR"] == "/tmp/x" and env["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize("program", ["right", "wrong later", "keeps its first output"])
def test_a_bench_column_is_judged_again_after_its_timed_calls(monkeypatch, capsys, tmp_path, program):
    """``nox -s bench``: a column right on its first call and wrong later (a trial's
    program), or right only on the inputs it first saw, reports it as it ends, and
    the report fails that column."""
    import io
    import json

    import torch

    from benchmarks import worker

    def make(column, model, inputs):
        calls = []

        def call():
            calls.append(model(*inputs))
            if program == "keeps its first output":
                return calls[0]
            return calls[-1] * (1.01 if program == "wrong later" and len(calls) > 2 else 1)

        return call

    torch.manual_seed(0)
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    monkeypatch.setattr(worker, "build", lambda name: (torch.nn.Linear(8, 8), (torch.randn(4, 8),)))
    monkeypatch.setattr(worker.columns, "make", make)
    monkeypatch.setattr("sys.stdin", io.StringIO("2\nquit\n"))
    worker.main("tiny", "auto", str(tmp_path))

    lines = capsys.readouterr().out.splitlines()
    ready = json.loads(next(x for x in lines if x.startswith("BENCH_READY "))[len("BENCH_READY ") :])
    final = json.loads(next(x for x in lines if x.startswith("BENCH_RSS "))[len("BENCH_RSS ") :])
    assert ready["ok"] is True
    assert (final["error_after_timing"] is None) is (program == "right")
    if program != "right":
        assert final["error_after_timing"].startswith("accuracy: max error")


def test_the_bench_report_fails_a_column_wrong_after_timing(monkeypatch):
    import benchmarks.run as bench_run
    from benchmarks.columns import COLUMNS

    class Column:
        def __init__(self, model, column, cache_dir):
            self.column = column
            self.ready = {"ok": True, "compile_s": 1.0, "routes": []}
            self.final = {}

        def time(self, calls):
            return 1e-3

        def close(self):
            wrong = "accuracy: max error 1e-01 against fp64" if self.column == "auto" else None
            self.final = {"peak_rss_mb": 100.0, "error_after_timing": wrong}
            return 100.0

    monkeypatch.setattr(bench_run, "_Worker", Column)
    monkeypatch.setattr(bench_run, "peak_gemm_flops", lambda: (None, None))
    result = bench_run.run(["tiny_mlp"], seconds=0.0)
    cols = result["rows"][0]["columns"]
    assert set(cols) == set(COLUMNS)
    assert not cols["auto"]["ok"]
    assert cols["auto"]["error"] == "after timing: accuracy: max error 1e-01 against fp64"
    assert cols["eager"]["ok"] and cols["eager"]["error"] is None


@pytest.mark.parametrize("failure", ["compile", "after timing"])
def test_the_bench_report_fails_a_column_whose_warm_start_fails(monkeypatch, failure):
    """A later process on the same caches fails the column where its first call, or
    a call after it on new input values, is wrong: it used to leave only a missing
    warm time."""
    import benchmarks.run as bench_run

    started: dict[str, int] = {}
    timed: list[tuple[str, int]] = []

    class Column:
        def __init__(self, model, column, cache_dir):
            self.column, self.final = column, {}
            self.warm = started.get(cache_dir, 0)  # how many processes this cache saw before
            started[cache_dir] = self.warm + 1
            wrong = self.warm and column == "auto" and failure == "compile"
            self.ready = (
                {"ok": False, "error": "accuracy: max error 1e-01 against fp64"}
                if wrong
                else {"ok": True, "compile_s": 1.0 if not self.warm else 0.1, "routes": []}
            )

        def time(self, calls):
            timed.append((self.column, self.warm))
            return 1e-3

        def close(self):
            wrong = self.warm and self.column == "auto" and failure == "after timing"
            self.final = {
                "peak_rss_mb": 100.0,
                "error_after_timing": "accuracy: max error 2e-01" if wrong else None,
            }
            return 100.0

    monkeypatch.setattr(bench_run, "_Worker", Column)
    monkeypatch.setattr(bench_run, "peak_gemm_flops", lambda: (None, None))
    cols = bench_run.run(["tiny_mlp"], seconds=0.0)["rows"][0]["columns"]
    assert not cols["auto"]["ok"] and cols["auto"]["warm_compile_s"] is None
    why = {
        "compile": "warm start: accuracy: max error 1e-01 against fp64",
        "after timing": "warm start, after timing: accuracy: max error 2e-01",
    }
    assert cols["auto"]["error"] == why[failure]
    assert cols["inductor"]["ok"] and cols["inductor"]["warm_compile_s"] == pytest.approx(0.1)
    assert ("inductor", 1) in timed  # each warm start runs a call before it is judged again


def test_a_bench_column_whose_second_check_cannot_run_reports_why(monkeypatch, capsys, tmp_path):
    """An error while judging again (eager on the new values included) is the
    column's reported error, and the worker still ends with its BENCH_RSS line."""
    import io
    import json

    import torch

    from benchmarks import worker

    references = worker._references
    calls = []

    def failing_later(model, inputs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("eager cannot run these values")
        return references(model, inputs)

    for variable in ("TORCHINDUCTOR_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    monkeypatch.setattr(worker, "build", lambda name: (torch.nn.Linear(8, 8), (torch.randn(4, 8),)))
    monkeypatch.setattr(worker.columns, "make", lambda column, model, inputs: lambda: model(*inputs))
    monkeypatch.setattr(worker, "_references", failing_later)
    monkeypatch.setattr("sys.stdin", io.StringIO("2\nquit\n"))
    worker.main("tiny", "auto", str(tmp_path))

    lines = capsys.readouterr().out.splitlines()
    final = json.loads(next(x for x in lines if x.startswith("BENCH_RSS "))[len("BENCH_RSS ") :])
    assert "eager cannot run these values" in final["error_after_timing"]


def test_the_shapes_check_also_hands_an_image_model_its_images_channels_last():
    import torch

    from benchmarks.zoo.shapes import _shape, other_inputs

    images = other_inputs((torch.randn(2, 3, 64, 64),))
    last = images[-1][0]
    assert last.shape == (3, 3, 64, 64) and not last.is_contiguous()
    assert last.is_contiguous(memory_format=torch.channels_last)
    assert _shape(images[-1]) == "3x3x64x64 channels-last"
    assert all(t.is_contiguous() for shape in images[:-1] for t in shape)
    tokens = other_inputs((torch.randint(0, 10, (2, 64)),))
    assert all(t.is_contiguous() for shape in tokens for t in shape)
    assert len(tokens) == len(images) - 1


def test_a_workers_timing_loop_warms_up_once_and_answers_each_request(monkeypatch):
    import io

    from benchmarks import warm_up

    calls, syncs = [], []
    monkeypatch.setattr(warm_up, "WARM_UP_CALLS", 4)
    monkeypatch.setattr("sys.stdin", io.StringIO("3\n2\nquit\n5\n"))
    out = io.StringIO()
    times = warm_up.serve_timing_requests(lambda: calls.append(1), lambda: syncs.append(1), out)
    answers = out.getvalue().splitlines()
    assert len(answers) == 2 and all(a.startswith("BENCH_TIME ") for a in answers)
    assert len(calls) == 4 + 3 + 2  # the warm-up, then each request; nothing after quit
    assert times["warm_up_calls"] == 4 and len(syncs) == 1 + 2 * 2


def test_a_benchmark_child_never_sees_the_users_dispatch_settings(monkeypatch, tmp_path):
    # A forced route in the user's shell would change what auto's column (or the
    # lowered round trip) measures.
    from benchmarks.process import marked_report

    (tmp_path / "env_probe.py").write_text(
        "import json, os\nprint('ENV ' + json.dumps(sorted(k for k in os.environ if k.startswith('DISPATCH_'))))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("DISPATCH_ROUTE", "eager")
    report, error = marked_report("env_probe", [], "ENV ", timeout=60)
    assert report == [], error
    report, _ = marked_report("env_probe", [], "ENV ", timeout=60, env={**os.environ})
    assert "DISPATCH_ROUTE" in report  # an explicit environment is passed as given


def test_a_zoo_cells_log_shows_where_the_trials_left_auto_s_regions(monkeypatch, tmp_path, capsys):
    # Read only after the first call, the log never said why a trial ended where
    # it did (hf_roberta as traced in one zoo run, 1.35x inductor's time).
    import io
    import types

    import torch

    from benchmarks import warm_up
    from benchmarks.zoo import worker
    from dispatch.graph_trial import IN_PLACE, LONGEST_TRIAL_CALLS

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    tiny = types.SimpleNamespace(build=lambda: (model, (torch.randn(8, 16),)))
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "DISPATCH_CACHE_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))  # restored after the test
    monkeypatch.setattr(worker, "EVERY_MODEL", {"tiny": tiny})
    monkeypatch.setattr(warm_up, "WARM_UP_CALLS", LONGEST_TRIAL_CALLS + 2)
    monkeypatch.setattr("sys.stdin", io.StringIO("go\n2\nquit\n"))
    monkeypatch.setattr("sys.__stdout__", io.StringIO())
    torch._dynamo.reset()
    worker.main("tiny", "auto", "infer", "cpu", "float32", str(tmp_path))
    log = capsys.readouterr().err
    first, _, after = log.partition(f"After {LONGEST_TRIAL_CALLS + 2} calls of warm-up and the timed calls:")
    assert "onnxrt_cpu_0" in first and IN_PLACE not in first  # the table after the first call
    assert f"onnxrt_cpu_0 [inference]: {IN_PLACE} as routed " in after, after
