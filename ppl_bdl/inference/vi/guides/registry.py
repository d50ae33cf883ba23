"""The guide registry: ``available()``, ``get(name)``, ``@register(name)``.

A registered guide is a factory ``factory(layout, backend, **settings) -> Guide``.

Example
-------
>>> import ppl_bdl as bdl
>>> isinstance(bdl.guides.available(), list)
True
"""

from __future__ import annotations

from collections.abc import Callable

from ppl_bdl.errors import ConfigError, one_of

_REGISTRY: dict[str, Callable] = {}


def register(name: str, overwrite: bool = False):
    """Decorator: register a guide factory under ``name`` (``fit(method="vi", guide=name)``)."""

    def decorator(factory):
        if name in _REGISTRY and not overwrite:
            raise ConfigError(f"a guide named {name!r} is already registered; pass overwrite=True.")
        _REGISTRY[name] = factory
        return factory

    return decorator


def available() -> list[str]:
    """The guide names ``fit(method="vi", guide=...)`` accepts, built-in and registered."""
    return sorted(_REGISTRY)


def get(name: str) -> Callable:
    """The guide factory registered as ``name``; a ``ConfigError`` lists the names otherwise."""
    if name not in _REGISTRY:
        raise one_of("guide", name, list(_REGISTRY))
    return _REGISTRY[name]
