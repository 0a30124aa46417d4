"""Options of the ``auto`` backend, from ``options=`` and the environment.

``Config.resolve(options)`` validates both once; environment variables override
options so that a route can be forced without touching code::

    DISPATCH_ROUTE=onnxrt DISPATCH_STRICT=1 python train.py
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError

OPTION_KEYS = ("routes", "strict", "autotune", "verify", "min_region_size", "cache_dir", "reduce_overhead")
LOG_LEVELS = ("warning", "info", "debug")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

ENV_ROUTE = "DISPATCH_ROUTE"
ENV_DISABLE = "DISPATCH_DISABLE"
ENV_STRICT = "DISPATCH_STRICT"
ENV_AUTOTUNE = "DISPATCH_AUTOTUNE"
ENV_VERIFY = "DISPATCH_VERIFY"
ENV_REDUCE_OVERHEAD = "DISPATCH_REDUCE_OVERHEAD"
ENV_CACHE_DIR = "DISPATCH_CACHE_DIR"
ENV_LOG = "DISPATCH_LOG"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dispatch"


@dataclass(frozen=True)
class Config:
    """Validated settings for one compilation.

    ``routes`` is None when the planner's own rules choose the order; otherwise
    it is the user's priority list. ``forced`` names the route that
    ``DISPATCH_ROUTE`` (or a one-route ``routes`` list) forces.
    ``reduce_overhead`` opts into torch's ``mode="reduce-overhead"`` contract:
    outputs of a captured CUDA graph are valid until the next call (no copy out).
    """

    routes: tuple[str, ...] | None = None
    disabled: frozenset[str] = frozenset()
    strict: bool = False
    autotune: bool = False
    verify: bool = False
    reduce_overhead: bool = False
    min_region_size: int = 2
    cache_dir: Path = field(default_factory=default_cache_dir)
    log_level: str = "warning"
    #: where each setting that is not a default came from: "DISPATCH_ROUTE=triton",
    #: "options['strict']", ...; errors name it, and the fix that applies to it.
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, key: str) -> str | None:
        return dict(self.sources).get(key)

    @property
    def forced(self) -> str | None:
        if self.routes and len([r for r in self.routes if r != "eager"]) == 1:
            return next(r for r in self.routes if r != "eager")
        return None

    def allows(self, route: str) -> bool:
        if route in self.disabled:
            return False
        return self.routes is None or route in self.routes

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Config:
        """Validate ``options`` then apply the ``DISPATCH_*`` environment on top."""
        env = os.environ if env is None else env
        config = cls()._with_options(dict(options or {}))
        return config._with_env(env)

    def _with_options(self, options: dict[str, Any]) -> Config:
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {unknown} for backend 'auto'; valid keys: {list(OPTION_KEYS)}"
            )
        changes: dict[str, Any] = {}
        if "routes" in options:
            routes = options["routes"]
            if isinstance(routes, str) or not isinstance(routes, (list, tuple)) or not routes:
                raise ConfigError(
                    f"options['routes'] must be a non-empty list of route names from "
                    f"{route_names()}, got {routes!r}"
                )
            changes["routes"] = tuple(_route_name(r, "options['routes']") for r in routes)
        for key in options:
            changes.setdefault("sources", {})[key] = f"options[{key!r}]"
        for key in ("strict", "autotune", "verify", "reduce_overhead"):
            if key in options:
                if not isinstance(options[key], bool):
                    raise ConfigError(f"options[{key!r}] must be True or False, got {options[key]!r}")
                changes[key] = options[key]
        if "min_region_size" in options:
            size = options["min_region_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(
                    f"options['min_region_size'] must be an int >= 1 (compute ops per region), got {size!r}"
                )
            changes["min_region_size"] = size
        if "cache_dir" in options:
            if not isinstance(options["cache_dir"], (str, os.PathLike)):
                raise ConfigError(f"options['cache_dir'] must be a path, got {options['cache_dir']!r}")
            changes["cache_dir"] = Path(options["cache_dir"])
        changes["sources"] = tuple(changes.get("sources", {}).items())
        return replace(self, **changes)

    def _with_env(self, env: Mapping[str, str]) -> Config:
        changes: dict[str, Any] = {}
        sources = dict(self.sources)
        if env.get(ENV_ROUTE):
            route = _route_name(env[ENV_ROUTE].strip(), ENV_ROUTE)
            changes["routes"] = (route,) if route == "eager" else (route, "eager")
            sources["routes"] = f"{ENV_ROUTE}={route}"
        if env.get(ENV_DISABLE):
            names = [n.strip() for n in env[ENV_DISABLE].split(",") if n.strip()]
            changes["disabled"] = frozenset(_route_name(n, ENV_DISABLE) for n in names)
            sources["disabled"] = f"{ENV_DISABLE}={env[ENV_DISABLE]}"
        for var, key in (
            (ENV_STRICT, "strict"),
            (ENV_AUTOTUNE, "autotune"),
            (ENV_VERIFY, "verify"),
            (ENV_REDUCE_OVERHEAD, "reduce_overhead"),
        ):
            if var in env:
                changes[key] = _flag(env[var], var)
                sources[key] = f"{var}={env[var]}"
        if env.get(ENV_CACHE_DIR):
            changes["cache_dir"] = Path(env[ENV_CACHE_DIR])
        if env.get(ENV_LOG):
            level = env[ENV_LOG].strip().lower()
            if level not in LOG_LEVELS:
                raise ConfigError(f"{ENV_LOG}={env[ENV_LOG]!r} is not valid; use one of {list(LOG_LEVELS)}")
            changes["log_level"] = level
        changes["sources"] = tuple(sources.items())
        config = replace(self, **changes)
        if config.strict and config.routes and "eager" in config.routes and env.get(ENV_ROUTE):
            # A forced route under strict must not quietly fall back to eager.
            config = replace(config, routes=tuple(r for r in config.routes if r != "eager") or ("eager",))
        if config.routes is not None and not [r for r in config.routes if r not in config.disabled]:
            raise ConfigError(
                f"every allowed route {list(config.routes)} is disabled by {ENV_DISABLE}="
                f"{','.join(sorted(config.disabled))}; allow at least one of {route_names()}"
            )
        return config


def route_names() -> list[str]:
    from .routes import registry

    return registry.names()


def _route_name(name: Any, where: str) -> str:
    if name not in route_names():
        raise ConfigError(f"{where}: unknown route {name!r}; valid routes: {route_names()}")
    return name


def _flag(value: str, var: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{var}={value!r} is not valid; use 0 or 1")
