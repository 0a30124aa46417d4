import pytest
import torch

import dispatch
from dispatch.config import Config
from dispatch.errors import ConfigError


def test_defaults():
    config = Config.resolve({}, env={})
    assert config.routes is None and not config.strict and config.min_region_size == 2


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"DISPATCH_ROUTE": "tensorrt"}, "'tensorrt'"),
        ({"DISPATCH_DISABLE": "onnxrt,bogus"}, "'bogus'"),
        ({"DISPATCH_AUTOTUNE": "yes please"}, "'yes please'"),
        ({"DISPATCH_STRICT": "2"}, "'2'"),
        ({"DISPATCH_VERIFY": "maybe"}, "'maybe'"),
        ({"DISPATCH_LOG": "loud"}, "'loud'"),
    ],
)
def test_bad_environment_names_value_and_valid_ones(env, fragment):
    with pytest.raises(ConfigError) as info:
        Config.resolve({}, env=env)
    message = str(info.value)
    assert fragment in message
    assert any(valid in message for valid in ("eager", "0 or 1", "warning"))


def test_config_error_is_value_error_and_dispatch_error():
    with pytest.raises(ValueError):
        Config.resolve({"bogus": 1}, env={})
    assert issubclass(ConfigError, dispatch.DispatchError)
    assert issubclass(dispatch.DispatchError, RuntimeError)


@pytest.mark.parametrize(
    "options",
    [
        {"routes": "onnxrt"},
        {"routes": []},
        {"routes": ["onnxrt", "fast"]},
        {"strict": "yes"},
        {"min_region_size": 0},
        {"min_region_size": True},
        {"cache_dir": 3},
        {"unknown_key": 1},
    ],
)
def test_bad_options(options):
    with pytest.raises(ConfigError) as info:
        Config.resolve(options, env={})
    assert "routes" in str(info.value) or "must" in str(info.value)


def test_environment_overrides_options():
    config = Config.resolve(
        {"routes": ["onnxrt"], "strict": False}, env={"DISPATCH_ROUTE": "inductor", "DISPATCH_STRICT": "1"}
    )
    assert config.routes == ("inductor",)
    assert config.strict
    relaxed = Config.resolve({}, env={"DISPATCH_ROUTE": "inductor"})
    assert relaxed.routes == ("inductor", "eager")


def test_disable_everything_allowed_is_an_error():
    with pytest.raises(ConfigError, match="disabled"):
        Config.resolve({"routes": ["onnxrt"], "strict": True}, env={"DISPATCH_DISABLE": "onnxrt"})


def test_bad_option_through_torch_compile_raises_config_error():
    model = torch.nn.Linear(4, 4)
    compiled = torch.compile(model, backend="auto", options={"routes": ["warp-drive"]})
    with pytest.raises(ConfigError, match="warp-drive") as info:
        compiled(torch.randn(2, 4))
    assert "onnxrt" in str(info.value)
