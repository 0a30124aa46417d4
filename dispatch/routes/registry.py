"""The one registry of routes.

    from dispatch.routes import registry

    @registry.register
    class MyRoute(Route):
        name = "mine"
        ...

Routes register themselves when ``dispatch.routes`` is imported; nothing heavy
is imported then. ``registry.get(name)`` returns the shared instance.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import ConfigError
from .base import Route


class RouteRegistry:
    """Name -> route instance, in registration order."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def register(self, cls: type[Route]) -> type[Route]:
        """Class decorator: instantiate ``cls`` and register it under ``cls.name``."""
        if not cls.name:
            raise ValueError(f"route class {cls.__name__} has no name")
        if cls.name in self._routes:
            raise ValueError(f"route {cls.name!r} is already registered")
        self._routes[cls.name] = cls()
        return cls

    def replace(self, route: Route) -> Route | None:
        """Swap in ``route`` under its name; returns the one it replaced (for tests)."""
        old = self._routes.get(route.name)
        self._routes[route.name] = route
        return old

    def remove(self, name: str) -> Route:
        """Unregister ``name`` (for tests and plug-ins that undo themselves)."""
        return self._routes.pop(name)

    def get(self, name: str) -> Route:
        try:
            return self._routes[name]
        except KeyError:
            raise ConfigError(f"unknown route {name!r}; valid routes: {self.names()}") from None

    def names(self) -> list[str]:
        return list(self._routes)

    def __iter__(self) -> Iterator[Route]:
        return iter(list(self._routes.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._routes


registry = RouteRegistry()
