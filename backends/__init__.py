"""Backends: where a DSL model runs. One module per backend, found through entry points.

The core talks to a backend only through the :class:`~ppl_bdl.backends.base.Backend` interface.
Backends are discovered through the entry-point group ``ppl_bdl.backends``, so a third-party
package can add one without touching the core.

Example
-------
>>> import ppl_bdl as bdl
>>> sorted(bdl.backends.available())
['numpyro', 'pyro']
>>> be = bdl.backends.get("numpyro")
"""

from __future__ import annotations

import importlib.util
from functools import cache, lru_cache
from importlib.metadata import entry_points

from ..errors import BackendError
from .base import Backend

__all__ = ["Backend", "available", "get", "registered"]

#: Built-in backends and the third-party packages each needs (checked without importing them).
_BUILTIN = {
    "pyro": ("ppl_bdl.backends.pyro:PyroBackend", ("torch", "pyro")),
    "numpyro": ("ppl_bdl.backends.numpyro:NumPyroBackend", ("jax", "numpyro")),
}


@lru_cache(maxsize=1)
def registered() -> dict[str, str]:
    """Backend name -> 'module:Class', from the entry-point group plus the built-ins."""
    found = {name: target for name, (target, _) in _BUILTIN.items()}
    for ep in entry_points(group="ppl_bdl.backends"):
        found[ep.name] = ep.value
    return found


def _installed(name: str) -> bool:
    needs = _BUILTIN.get(name, (None, ()))[1]
    return all(importlib.util.find_spec(mod) is not None for mod in needs)


def available() -> list[str]:
    """Names of the backends whose libraries are installed."""
    return sorted(name for name in registered() if _installed(name))


@cache
def _load(name: str, precision: str) -> Backend:
    module_name, cls_name = registered()[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)(precision=precision)


def get(name: str | Backend, precision: str = "float32") -> Backend:
    """The backend called ``name`` at the given precision ("float32" or "float64").

    Raises a :class:`~ppl_bdl.errors.BackendError` that lists the installed backends and names the
    extra to install when ``name`` is unknown or missing.
    """
    if isinstance(name, Backend):
        return name if name.precision == precision else get(name.name, precision)
    if precision not in ("float32", "float64"):
        raise BackendError(f"precision must be 'float32' or 'float64', got {precision!r}.")
    if name not in registered():
        raise BackendError(
            f"unknown backend {name!r}; installed: {available() or 'none'}. Known backends: "
            f"{sorted(registered())}."
        )
    if not _installed(name):
        raise BackendError(
            f"backend {name!r} is not installed (installed: {available() or 'none'}). Install it "
            f"with: pip install 'ppl_bdl[{name}]'."
        )
    return _load(name, precision)
