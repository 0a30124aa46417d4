"""Failing routes: every region falls back alone, warns once, and stays correct."""

import warnings

import pytest
import torch

import dispatch
from dispatch.routes import registry
from dispatch.stitch import FallbackWarning
from tests.demo_route import DemoRoute
from tests.models import MLP, CustomOpMLP


def pointwise(x, y):
    return (torch.relu(x) + y) * 2, torch.relu(y) * 3


INPUTS = (torch.randn(4, 4), torch.randn(4, 4))


def test_demo_route_runs_its_regions(demo):
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})
    with torch.no_grad():
        for g, e in zip(compiled(*INPUTS), pointwise(*INPUTS)):
            torch.testing.assert_close(g, e)
    assert demo.calls == 1 and demo.compiles == 1


@pytest.mark.parametrize("demo", ["compile-error"], indirect=True)
def test_compile_failure_falls_back_with_one_warning(demo):
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})
    with pytest.warns(FallbackWarning, match="demo compiler exploded") as record:
        out = compiled(*INPUTS)
    assert len([w for w in record if issubclass(w.category, FallbackWarning)]) == 1
    for g, e in zip(out, pointwise(*INPUTS)):
        torch.testing.assert_close(g, e)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled(*INPUTS)  # no second warning, no second compile attempt
    assert demo.compiles == 1


@pytest.mark.parametrize("demo", ["run-error"], indirect=True)
def test_run_failure_falls_back_for_good(demo):
    options = {"routes": ["demo", "eager"]}
    compiled = torch.compile(pointwise, backend="auto", options=options)
    with pytest.warns(FallbackWarning, match="failed to run"):
        out = compiled(*INPUTS)
    for g, e in zip(out, pointwise(*INPUTS)):
        torch.testing.assert_close(g, e)
    calls = demo.calls
    compiled(*INPUTS)
    assert demo.calls == calls  # the region no longer tries the failed route
    explanation = dispatch.explain(pointwise, *INPUTS, options=options)
    assert all(r.route == "eager" for r in explanation.regions)
    assert any(
        "run failed: RuntimeError: demo kernel crashed" in r.rejected.get("demo", "")
        for r in explanation.regions
    )


@pytest.mark.parametrize("demo", ["compile-error"], indirect=True)
def test_forced_strict_failure_is_raised(demo, monkeypatch):
    monkeypatch.setenv("DISPATCH_ROUTE", "demo")
    monkeypatch.setenv("DISPATCH_STRICT", "1")
    compiled = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="auto")
    with pytest.raises(dispatch.RouteFailedError) as info:
        compiled(torch.randn(3))
    message = str(info.value)
    assert "'demo'" in message and "cpu" in message and "aten.relu.default" in message
    assert "DISPATCH_STRICT" in message


@pytest.mark.parametrize("demo", ["wrong"], indirect=True)
def test_verify_catches_wrong_numbers(demo, monkeypatch):
    monkeypatch.setenv("DISPATCH_VERIFY", "1")
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})
    with pytest.warns(FallbackWarning, match="differs from eager"):
        out = compiled(*INPUTS)
    for g, e in zip(out, pointwise(*INPUTS)):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("demo", ["wrong"], indirect=True)
def test_without_verify_wrong_route_is_not_second_guessed(demo):
    # Documents what verify is for: without it, a wrong route's numbers go through.
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})
    out = compiled(*INPUTS)
    assert not torch.allclose(out[0], pointwise(*INPUTS)[0])


ONNX_AND_EAGER = {"routes": ["onnxrt", "eager"]}


def test_onnxrt_export_failure_falls_back_per_region(monkeypatch):
    import dispatch.routes.onnxrt as onnxrt

    exports = []

    def flaky_export(gm, example_inputs, *rest, **options):
        exports.append(gm)
        if len(exports) == 1:
            raise RuntimeError("simulated exporter bug")
        return real_export(gm, example_inputs, *rest, **options)

    real_export = onnxrt.export_region
    monkeypatch.setattr(onnxrt, "export_region", flaky_export)
    model = CustomOpMLP().eval()
    x = torch.randn(4, 16)
    with torch.no_grad(), pytest.warns(FallbackWarning, match="simulated exporter bug"):
        # onnxrt and eager only: inductor would be timed against the cut graph
        explanation = dispatch.explain(model, x, options=ONNX_AND_EAGER)
    routes = sorted(r.route for r in explanation.regions)
    assert routes == ["eager", "eager", "onnxrt"]  # only the failed region moved
    with torch.no_grad():
        compiled = torch.compile(model, backend="auto", options=ONNX_AND_EAGER)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_fallback_quotes_the_error_it_was_raised_from_without_terminal_colours(monkeypatch):
    # torch.onnx.export raises "Failed to convert the exported program" (with
    # colour codes) from the error that names the op; the user needs the latter.
    import dispatch.routes.onnxrt as onnxrt

    def failing_export(*args, **options):
        try:
            raise LookupError("No ONNX function found for prims.made_up\nFailure message: none")
        except LookupError as cause:
            raise RuntimeError("Failed to convert. \x1b[96mThis is step 3/3\x1b[0m of exporting") from cause

    monkeypatch.setattr(onnxrt, "export_region", failing_export)
    with torch.no_grad(), pytest.warns(FallbackWarning) as caught:
        explanation = dispatch.explain(MLP().eval(), torch.randn(4, 16), options=ONNX_AND_EAGER)
    quoted = "LookupError: No ONNX function found for prims.made_up (raised as RuntimeError)"
    (message,) = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert quoted in message and "\x1b" not in message
    (region,) = explanation.regions
    assert region.route == "eager" and quoted in region.rejected["onnxrt"]


def test_forced_unavailable_route_strict_raises(monkeypatch):
    from dispatch.routes.base import Availability

    class Missing(DemoRoute):
        def available(self):
            return Availability(False, None, "demo-runtime is not installed")

    registry.replace(Missing())
    try:
        from dispatch import planner

        planner.availability.cache_clear()
        with pytest.raises(dispatch.RouteUnavailableError, match="demo-runtime is not installed"):
            dispatch.plan(
                torch.fx.symbolic_trace(MLP().eval().requires_grad_(False)),
                [torch.randn(2, 16)],
                routes=["demo"],
                strict=True,
            )
    finally:
        registry.remove("demo")
        planner.availability.cache_clear()


def test_errors_of_the_eager_reference_reach_the_user_unchanged():
    @torch.library.custom_op("dispatch_tests::picky", mutates_args=())
    def picky(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 1e6:
            raise ValueError("picky refuses large inputs")
        return x.clone()

    @picky.register_fake
    def _(x):
        return torch.empty_like(x)

    compiled = torch.compile(lambda x: picky(x.relu()) * 2, backend="auto")
    with torch.no_grad():
        compiled(torch.ones(3))
        with pytest.raises(ValueError, match="picky refuses"):
            compiled(torch.full((3,), 1e7))
        torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 2.0))


class _Embedded(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)

    def forward(self, ids, divisor):
        return self.embedding(ids) * 2 + 1, (ids * 3) // divisor


@pytest.mark.parametrize(
    ("ids", "divisor", "error", "match"),
    [
        ([1, 12, 3], [1, 2, 3], IndexError, "index out of range"),
        ([1, 2, 3], [1, 0, 3], RuntimeError, "ZeroDivision"),
    ],
)
@torch.no_grad()
def test_a_call_torch_refuses_too_raises_torchs_error_and_keeps_the_route(ids, divisor, error, match):
    """An id out of range or a division by zero is the caller's error: ORT fails
    the run, torch raises, and the region stays on ORT. Dropping it there ran
    every later call of the region eagerly, with a warning that blamed the route."""
    pytest.importorskip("onnxruntime")
    from dispatch.record import recorder

    model, good = _Embedded().eval(), (torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]))
    with recorder.recording() as records, warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled = torch.compile(model, backend="auto")
        compiled(*good)
        with pytest.raises(error, match=match):
            compiled(torch.tensor(ids), torch.tensor(divisor))
        for g, e in zip(compiled(*good), model(*good)):
            torch.testing.assert_close(g, e)
    assert [r.route for record in records for r in record.regions] == ["onnxrt"]


@pytest.mark.parametrize("demo", ["run-error"], indirect=True)
def test_the_plan_stays_as_made_and_the_run_is_recorded_beside_it(demo):
    import dataclasses

    from dispatch.record import recorder

    with recorder.recording() as records, pytest.warns(FallbackWarning):
        torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})(*INPUTS)
    (record,) = records
    planned, ran = record.plan.regions, record.regions
    assert [r.route for r in planned] == ["demo"] and "demo" not in planned[0].rejected
    assert [r.route for r in ran] == ["eager"] and "run failed" in ran[0].rejected["demo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned[0].route = "eager"  # type: ignore[misc]


@pytest.mark.parametrize("demo", ["run-error"], indirect=True)
def test_explain_shows_the_planned_route_beside_the_one_that_ran(demo):
    with pytest.warns(FallbackWarning):
        explanation = dispatch.explain(pointwise, *INPUTS, options={"routes": ["demo", "eager"]})
    (region,) = explanation.regions
    assert region.name.startswith("demo_") and region.route == "eager" and region.planned_route == "demo"
    assert "eager (planned demo)" in str(explanation)
    assert explanation.to_dict()["regions"][0]["planned_route"] == "demo"


@pytest.fixture
def stitched_calls(monkeypatch):
    """Each call of a stitched program (``StitchedGraph``), from now on."""
    from dispatch.stitch import StitchedGraph

    calls = []
    real = StitchedGraph.__call__

    def counting(self, *args):
        calls.append(self)
        return real(self, *args)

    monkeypatch.setattr(StitchedGraph, "__call__", counting)
    return calls


@pytest.mark.parametrize("demo", ["compile-error"], indirect=True)
def test_a_graph_whose_regions_all_fell_back_runs_as_dynamo_traced_it(demo, stitched_calls):
    """Once every region has fallen back to eager (here the only one, on its
    first call), the stitched program steps aside: the Dynamo graph runs itself,
    at the floor's cost."""
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "eager"]})
    with torch.no_grad():
        with pytest.warns(FallbackWarning):
            compiled(*INPUTS)
        assert len(stitched_calls) == 1
        for _ in range(3):
            for g, e in zip(compiled(*INPUTS), pointwise(*INPUTS)):
                torch.testing.assert_close(g, e)
    assert len(stitched_calls) == 1


@pytest.mark.parametrize("demo", ["run-error"], indirect=True)
def test_a_graph_with_a_region_that_ran_keeps_its_stitched_program(demo, stitched_calls):
    compiled = torch.compile(pointwise, backend="auto", options={"routes": ["demo", "onnxrt", "eager"]})
    pytest.importorskip("onnxruntime")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        for _ in range(3):
            compiled(*INPUTS)
    assert len(stitched_calls) == 3  # the demo region fell back to onnxrt, not to eager
