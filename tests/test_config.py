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
    "options, says",
    [
        ({"routes": "onnxrt"}, "options['routes'] must be a non-empty list"),
        ({"routes": []}, "options['routes'] must be a non-empty list"),
        ({"routes": ["onnxrt", "fast"]}, "unknown route 'fast'"),
        ({"strict": "yes"}, "options['strict'] must be True or False"),
        ({"min_region_size": 0}, "options['min_region_size'] must be an int >= 1"),
        ({"min_region_size": True}, "options['min_region_size'] must be an int >= 1"),
        ({"cache_dir": 3}, "options['cache_dir'] must be a path"),
        ({"unknown_key": 1}, "unknown option(s) ['unknown_key']"),
    ],
)
def test_bad_options(options, says):
    with pytest.raises(ConfigError) as info:
        Config.resolve(options, env={})
    assert says in str(info.value)


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
