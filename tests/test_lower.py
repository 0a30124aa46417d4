"""dispatch.lower, LoweredProgram.save and dispatch.load: round trips (in fresh
processes too), custom ops, dynamic batch, damaged files and wrong inputs."""

from __future__ import annotations

import json
import re
import textwrap
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

import dispatch
from dispatch.errors import (
    InputSpecError,
    LoweringError,
    ProgramFileError,
    RouteFailedError,
    RouteUnavailableError,
)
from dispatch.routes import registry
from dispatch.stitch import FallbackWarning
from tests.conftest import run_python
from tests.models import ScoresHead, scaled_tanh


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


class TwoHeads(torch.nn.Module):
    """Keyword input, a dict of outputs, and a data-dependent op (eager) beside ORT's work."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 6)
        self.scale = torch.nn.Parameter(torch.tensor([0.5, 2.0, 1.0, 3.0, -1.0, 0.25]))
        self.gain = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.body(x) + bias)
        picked = h[h > 0.1] * self.gain  # data-dependent shape: runs eager, with its weight
        return {"h": h * self.scale, "picked": picked}


class WithCustomOp(torch.nn.Module):
    """Linear -> a user custom op (tests/models.py) -> Linear: ONNX Runtime runs the
    Linears, eager the op; a process loads it only after importing tests.models."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(scaled_tanh(self.a(x), 2.0))


def _manifest(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("manifest.json"))


def _edited_copy(
    path: Path, target: Path, wanted: Callable[[str], bool], edit: Callable[[Any], None]
) -> Path:
    """A copy of the program file at ``path`` in which ``edit`` changed each JSON
    member whose name ``wanted`` accepts (the zip's checksums made anew)."""
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(target, "w") as out:
        for info in source.infolist():
            content = source.read(info)
            if wanted(info.filename):
                data = json.loads(content)
                edit(data)
                content = json.dumps(data).encode()
            out.writestr(info, content)
    return target


@torch.no_grad()
def test_round_trip_equals_auto_and_stores_no_weight_that_onnx_runtime_baked(tmp_path):
    model = MLP().eval()
    x = torch.randn(5, 8)
    program = dispatch.lower(model, (x,))
    assert isinstance(program, torch.nn.Module)
    assert [r.route for r in program.regions] == ["onnxrt"]
    auto = torch.compile(model, backend="auto")(x)
    torch.testing.assert_close(program(x), auto)
    path = tmp_path / "mlp.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    torch.testing.assert_close(loaded(x), model(x))
    manifest = _manifest(path)
    assert manifest["weights"] == []  # every weight is an initializer of the ONNX payload
    (region,) = manifest["regions"]
    assert region["route"] == "onnxrt" and region["payload_bytes"] > 16 * 8 * 4
    assert {s["op"] for s in region["sources"]} >= {"aten.linear.default", "aten.relu.default"}
    assert {s["module"] for s in region["sources"]} >= {"net.0", "net.1", "net.2"}


@torch.no_grad()
def test_eager_regions_keep_their_weights_once_as_raw_tensors(tmp_path):
    model = MLP().eval()
    x = torch.randn(2, 8)
    program = dispatch.lower(model, (x,), routes=["eager"])
    path = tmp_path / "eager.dispatch"
    program.save(path)
    manifest = _manifest(path)
    params = dict(model.named_parameters())
    assert len(manifest["weights"]) == len(params)
    with zipfile.ZipFile(path) as archive:
        stored = sum(archive.getinfo(w["file"]).file_size for w in manifest["weights"])
    assert stored == sum(p.numel() * p.element_size() for p in params.values())
    torch.testing.assert_close(dispatch.load(path)(x), model(x))


@torch.no_grad()
def test_keywords_dicts_and_a_data_dependent_region_round_trip(tmp_path):
    model = TwoHeads().eval()
    x, bias = torch.randn(4, 6), torch.randn(6)
    program = dispatch.lower(model, (x,), {"bias": bias})
    routes = {r.route for r in program.regions}
    assert routes == {"onnxrt", "eager"}
    path = tmp_path / "heads.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    expected = model(x, bias=bias)
    for got in (program(x, bias=bias), loaded(x, bias=bias)):
        assert set(got) == {"h", "picked"}
        torch.testing.assert_close(got["h"], expected["h"])
        torch.testing.assert_close(got["picked"], expected["picked"])
    assert [w["name"] for w in _manifest(path)["weights"]] == [
        "p_gain"
    ]  # the eager region's; ORT baked the rest


@torch.no_grad()
def test_dynamic_batch_runs_every_size_in_range_and_refuses_others(tmp_path):
    model = MLP().eval()
    batch = Dim("batch", min=1, max=64)
    program = dispatch.lower(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    path = tmp_path / "dynamic.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    for n in (1, 3, 17, 64):
        x = torch.randn(n, 8)
        torch.testing.assert_close(loaded(x), model(x))
    with pytest.raises(
        InputSpecError, match=r"input x: expected a float32 tensor of shape \[s\w+, 8\].*\.\.64"
    ):
        loaded(torch.randn(65, 8))


@torch.no_grad()
def test_a_transposed_input_lowers_and_its_layout_does_not_matter(tmp_path):
    # Decomposing the export of a non-contiguous input left unbounded size symbols
    # in its range constraints, and lower() failed on their upper bound, int_oo.
    model = MLP().eval()
    x = torch.randn(8, 5).t()
    program = dispatch.lower(model, (x,))
    assert program.signature.inputs.ranges == {}  # every shape static
    path = tmp_path / "transposed.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    for given in (x, x.contiguous()):
        torch.testing.assert_close(loaded(given), model(given))


def test_outputs_carry_no_gradient_even_from_eager_regions():
    # Before, an eager region passed gradients on while an ORT region did not:
    # backward through a mixed program silently dropped the ORT part's share.
    class Mixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x > 0).sum() + torch.tanh(x) * 2

    x = torch.randn(3, 4)
    with torch.no_grad():
        program = dispatch.lower(Mixed(), (x,), routes=["eager"])
    out = program(x.clone().requires_grad_())
    assert torch.is_grad_enabled() and not out.requires_grad
    torch.testing.assert_close(out, Mixed()(x))


@torch.no_grad()
def test_wrong_inputs_name_the_input_and_what_was_expected():
    program = dispatch.lower(MLP().eval(), (torch.randn(3, 8),))
    with pytest.raises(InputSpecError, match=r"takes 1 inputs \(x\), got 2"):
        program(torch.randn(3, 8), torch.randn(3, 8))
    with pytest.raises(
        InputSpecError,
        match=r"input x: expected a float32 tensor of shape \[3, 8\] on cpu, got a float32 tensor of shape \[3, 9\]",
    ):
        program(torch.randn(3, 9))
    with pytest.raises(InputSpecError, match="got a float64 tensor"):
        program(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(InputSpecError, match="on cpu, got a float32 tensor of shape \\[3, 8\\] on meta"):
        program(torch.empty(3, 8, device="meta"))
    with pytest.raises(InputSpecError, match="unexpected keyword arguments \\['y'\\]"):
        program(torch.randn(3, 8), y=1)


def test_a_program_that_updates_state_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    with pytest.raises(LoweringError, match=r"updates .*running_mean.*model\.eval\(\)"):
        dispatch.lower(model, (torch.randn(8, 4),))


def test_an_export_failure_says_what_to_use_instead():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent Python control flow: no single graph
                return x + 1
            return x - 1

    with pytest.raises(LoweringError, match=r"torch.export could not export Branchy.*backend='auto'"):
        dispatch.lower(Branchy(), (torch.randn(3),))


@torch.no_grad()
def test_a_route_that_fails_to_lower_falls_back_for_that_region_alone(monkeypatch):
    onnxrt = registry.get("onnxrt")

    def broken(region, specs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(onnxrt, "preprocess", broken)
    model = MLP().eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = dispatch.lower(model, (x,))
    fallbacks = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallbacks) == 1 and "exporter exploded" in str(fallbacks[0].message)
    (region,) = program.regions
    assert region.route == "eager" and "exporter exploded" in region.rejected["onnxrt"]
    torch.testing.assert_close(program(x), model(x))
    with pytest.raises(RouteFailedError, match="onnxrt"):
        dispatch.lower(model, (x,), routes=["onnxrt"], strict=True)


@torch.no_grad()
def test_an_onnx_translation_that_computes_something_else_is_caught_when_lowering(monkeypatch):
    # Under torch.compile each onnxrt region's first call is checked against torch;
    # a lowered program ran whatever the translation computed.
    import dispatch.routes.onnxrt as onnxrt_route

    real = onnxrt_route.threaded_session

    def off_by_a_half(*args, **kwargs):
        run = real(*args, **kwargs)
        return lambda *a: tuple(t + 0.5 for t in run(*a))

    monkeypatch.setattr(onnxrt_route, "threaded_session", off_by_a_half)
    model, x = MLP().eval(), torch.randn(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = dispatch.lower(model, (x,))
    (region,) = program.regions
    assert region.route == "eager" and "differs from torch's" in region.rejected["onnxrt"]
    assert any(issubclass(w.category, FallbackWarning) for w in caught)
    torch.testing.assert_close(program(x), model(x))


@torch.no_grad()
def test_damaged_files_and_other_formats_raise_program_file_errors(tmp_path):
    path = tmp_path / "mlp.dispatch"
    dispatch.lower(MLP().eval(), (torch.randn(2, 8),)).save(path)
    data = path.read_bytes()

    truncated = tmp_path / "truncated.dispatch"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProgramFileError, match="truncated or altered"):
        dispatch.load(truncated)

    altered = tmp_path / "altered.dispatch"
    at = data.index(b"call_function")  # inside a stored graph
    altered.write_bytes(data[:at] + b"X" + data[at + 1 :])
    with pytest.raises(ProgramFileError, match="truncated or altered"):
        dispatch.load(altered)

    future = _edited_copy(
        path,
        tmp_path / "future.dispatch",
        lambda name: name == "manifest.json",
        lambda m: m.update(format=99),
    )
    with pytest.raises(ProgramFileError, match=r"has format 99 .*reads format 1"):
        dispatch.load(future)


@torch.no_grad()
def test_random_damage_raises_program_file_error_or_changes_nothing(tmp_path):
    """Bit flips, truncations and zeroed runs anywhere in a file: each load either
    raises ProgramFileError or gives the right answer, never another error."""
    import random

    model, x = TwoHeads().eval(), torch.randn(4, 6)
    bias = torch.randn(6)
    expected = model(x, bias=bias)
    path = tmp_path / "heads.dispatch"
    dispatch.lower(model, (x,), {"bias": bias}, routes=["eager"]).save(path)
    data = path.read_bytes()
    rng = random.Random(0)
    damaged = tmp_path / "damaged.dispatch"
    refused = 0
    for _ in range(60):
        copy = bytearray(data)
        at = rng.randrange(len(copy))
        kind = rng.choice(["flip", "truncate", "zero"])
        if kind == "flip":
            copy[at] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del copy[at:]
        else:
            copy[at : at + 16] = bytes(len(copy[at : at + 16]))
        damaged.write_bytes(copy)
        try:
            got = dispatch.load(damaged)(x, bias=bias)
        except ProgramFileError:
            refused += 1
            continue
        torch.testing.assert_close(got["h"], expected["h"])
        torch.testing.assert_close(got["picked"], expected["picked"])
    assert refused >= 50  # most damage is caught by the zip's CRCs and structure

    not_zip = tmp_path / "notes.txt"
    not_zip.write_text("hello")
    with pytest.raises(ProgramFileError):
        dispatch.load(not_zip)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@torch.no_grad()
def test_a_program_for_a_device_this_machine_lacks_names_the_device(tmp_path):
    # As a program lowered on a GPU machine reads on a CPU-only one: before, moving
    # its weights raised torch's bare AssertionError "Torch not compiled with CUDA".
    path = tmp_path / "eager.dispatch"
    dispatch.lower(MLP().eval(), (torch.randn(2, 8),), routes=["eager"]).save(path)

    def to_cuda(manifest: dict) -> None:
        for weight in manifest["weights"]:
            weight["device"] = "cuda:0"
        for region in manifest["regions"]:
            region["devices"] = ["cuda"]

    on_cuda = _edited_copy(path, tmp_path / "cuda.dispatch", lambda name: name == "manifest.json", to_cuda)
    with pytest.raises(RouteUnavailableError, match=r"lowered for device cuda \(region eager_cpu_0\)"):
        dispatch.load(on_cuda)


@torch.no_grad()
def test_a_stored_graph_cannot_name_python_code(tmp_path):
    path = tmp_path / "eager.dispatch"
    dispatch.lower(MLP().eval(), (torch.randn(2, 8),), routes=["eager"]).save(path)

    def to_eval(graph: dict) -> None:
        for node in graph["nodes"]:
            if node["op"] == "call_function":
                node["target"] = "builtins.eval"

    def region_graph(name: str) -> bool:
        return name.startswith("regions/") and name.endswith(".graph.json")

    evil = _edited_copy(path, tmp_path / "evil.dispatch", region_graph, to_eval)
    with pytest.raises(ProgramFileError, match=r"builtins\.eval"):
        dispatch.load(evil)


@torch.no_grad()
def test_a_missing_runtime_names_the_region_and_the_install_command(tmp_path, monkeypatch):
    from dispatch.routes.base import Availability, install_hint

    path = tmp_path / "mlp.dispatch"
    dispatch.lower(MLP().eval(), (torch.randn(2, 8),)).save(path)
    onnxrt = registry.get("onnxrt")
    monkeypatch.setattr(
        onnxrt, "available", lambda: Availability(False, None, f"not installed; {install_hint('onnx')}")
    )
    with pytest.raises(
        RouteUnavailableError,
        match=r"region onnxrt_cpu_0 .* runs on onnxrt.*pip install 'torch-auto-dispatch\[onnx\]'",
    ):
        dispatch.load(path)


def test_a_fresh_process_loads_without_tracing_and_without_unused_runtimes(tmp_path):
    path = tmp_path / "eager.dispatch"
    model = MLP().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        dispatch.lower(model, (x,), routes=["eager"]).save(path)
        expected = model(x)
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    result = run_python(
        f"""
        import sys, torch
        def refuse(*a, **k):
            raise AssertionError("loading traced")
        torch.export.export = refuse
        import torch._functorch.aot_autograd as aot
        aot.aot_module_simplified = refuse
        import dispatch
        program = dispatch.load({str(path)!r})
        io = torch.load({str(tmp_path / "io.pt")!r})
        torch.testing.assert_close(program(io["x"]), io["expected"])
        from torch._dynamo.utils import counters
        assert not counters["stats"], dict(counters["stats"])
        print("onnxruntime" in sys.modules, "onnxscript" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_custom_ops_load_where_their_library_is_imported(tmp_path):
    path = tmp_path / "custom.dispatch"
    model = WithCustomOp().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        program = dispatch.lower(model, (x,))
        expected = model(x)
    assert "dispatch_tests.scaled_tanh.default" in {op for r in program.regions for op in r.ops}
    program.save(path)
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    load = f"""
        import torch, dispatch
        program = dispatch.load({str(path)!r})
        io = torch.load({str(tmp_path / "io.pt")!r})
        torch.testing.assert_close(program(io["x"]), io["expected"])
        print("ok")
        """
    without = run_python(load)
    assert without.returncode != 0
    assert "ProgramFileError" in without.stderr
    assert "dispatch_tests::scaled_tanh.default" in without.stderr
    assert "import the library that defines it before loading" in without.stderr
    with_library = run_python("import tests.models\n" + textwrap.dedent(load))
    assert with_library.returncode == 0, with_library.stderr
    assert with_library.stdout.strip() == "ok"


def test_output_types_load_where_their_library_is_imported(tmp_path):
    path = tmp_path / "scores.dispatch"
    model = ScoresHead().eval()
    x = torch.randn(2, 6)
    with torch.no_grad():
        dispatch.lower(model, (x,)).save(path)
        expected = model(x)
    torch.save({"x": x, "logits": expected.logits, "probs": expected.probs}, tmp_path / "io.pt")
    load = f"""
        import torch, dispatch
        program = dispatch.load({str(path)!r})
        io = torch.load({str(tmp_path / "io.pt")!r})
        out = program(io["x"])
        print(type(out).__name__)
        torch.testing.assert_close(out.logits, io["logits"])
        torch.testing.assert_close(out.probs, io["probs"])
        """
    without = run_python(load)
    assert without.returncode != 0
    assert "ProgramFileError" in without.stderr
    assert "the type tests.models.Scores" in without.stderr
    # The advice, followed to the letter, loads the program: importing the
    # library's top level alone need not define the type (transformers defers
    # its output classes' module).
    advised = re.search(r"Instead: (import [\w.]+) \(the module that defines it\)", without.stderr)
    assert advised is not None, without.stderr
    with_library = run_python(advised.group(1) + "\n" + textwrap.dedent(load))
    assert with_library.returncode == 0, with_library.stderr
    assert with_library.stdout.strip() == "Scores"


@torch.no_grad()
def test_inspect_prints_regions_routes_sizes_versions_and_sources(tmp_path):
    path = tmp_path / "heads.dispatch"
    dispatch.lower(TwoHeads().eval(), (torch.randn(4, 6),), {"bias": torch.randn(6)}).save(path)
    result = run_python(f"import sys, dispatch.__main__ as m; sys.exit(m.main(['inspect', {str(path)!r}]))")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"torch {torch.__version__}" in out
    assert "x: float32 [4, 6] on cpu" in out and "bias: float32 [6] on cpu" in out
    assert "onnxrt on cpu" in out and "eager on cpu" in out
    assert "aten.linear.default" in out  # ONNX-bound graphs keep torch-level linear
    assert "test_lower.py:" in out  # the ops of TwoHeads.forward point at its lines
    assert "weights: 1 tensors, 4 bytes" in out


@pytest.mark.slow
@torch.no_grad()
def test_inductor_regions_round_trip_as_aot_inductor_packages(tmp_path, monkeypatch):
    """AOTInductor compiles C++ for about a minute cold on CPU: ``nox -s slow``."""
    model = MLP().eval()
    program = dispatch.lower(
        model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch", max=32)},), routes=["inductor"]
    )
    assert [r.route for r in program.regions] == ["inductor"]
    path = tmp_path / "inductor.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    for n in (2, 9):
        x = torch.randn(n, 8)
        torch.testing.assert_close(loaded(x), model(x))
    # A package is C++ built against one torch: another torch refuses it by name.
    built_by = torch.__version__
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    with pytest.raises(
        ProgramFileError, match=rf"built by torch {re.escape(str(built_by))}.*has torch 2\.99\.0"
    ):
        dispatch.load(path)


@torch.no_grad()
def test_triton_regions_round_trip_as_named_kernels(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = torch.nn.Sequential(torch.nn.LayerNorm(24), torch.nn.Softmax(dim=-1)).eval()
    x = torch.randn(3, 24)
    program = dispatch.lower(model, (x,), routes=["triton"])
    assert {r.route for r in program.regions} == {"triton"}
    path = tmp_path / "triton.dispatch"
    program.save(path)
    handles = {h for r in _manifest(path)["regions"] for h in r["debug_handle_map"]}
    assert {h.split(":")[1] for h in handles} == {"layer_norm", "softmax"}
    torch.testing.assert_close(dispatch.load(path)(x), model(x))


class OneHeadAttention(torch.nn.Module):
    """Attention of 3-D tensors, as hand-written single-head attention calls it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True) * 2


def test_attention_of_three_dimensions_lowers_to_onnxrt(tmp_path):
    """torchlib translates 4-D attention only: the region fell back to eager."""
    pytest.importorskip("onnxruntime")
    model, x = OneHeadAttention(), torch.randn(2, 9, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        program = dispatch.lower(model, (x,), dynamic_shapes={"x": {1: Dim("seq", min=2, max=64)}})
    assert [r.route for r in program.regions] == ["onnxrt"]
    path = tmp_path / "attention.dispatch"
    program.save(path)
    loaded = dispatch.load(path)
    for seq in (9, 13, 4):
        x = torch.randn(2, seq, 24)
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-5)
