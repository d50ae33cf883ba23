"""Backends: where a DSL model runs. One module per backend, found through entry points.

The core talks to a backend only through the :class:`~ppl_bdl.backend_protocol.Backend` protocol.
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

from ..backend_protocol import Backend
from ..errors import BackendError

__all__ = ["Backend", "available", "default", "get", "libraries", "owner_of", "registered"]

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


#: The libraries (distribution names) behind the built-in backends, for version reports.
_LIBRARIES = ("torch", "pyro-ppl", "jax", "jaxlib", "numpyro", "optax")


def libraries() -> tuple[str, ...]:
    """The Python distributions the built-in backends run on (``ppl-bdl info`` reports them)."""
    return _LIBRARIES


#: The backend used when none is named, in order of preference (the first installed one).
_PREFERRED = ("numpyro", "pyro")


def default() -> str:
    """The backend ``fit`` and friends use when none is named: NumPyro if installed, else the
    first installed backend."""
    installed = available()
    if not installed:
        raise BackendError(
            "no backend is installed: pip install 'ppl_bdl[numpyro]' or 'ppl_bdl[pyro]'."
        )
    return next((name for name in _PREFERRED if name in installed), installed[0])


@cache
def _load(name: str, precision: str, device: str | None) -> Backend:
    module_name, cls_name = registered()[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)(precision=precision, device=device)


def get(
    name: str | Backend | None = None, precision: str = "float32", device: str | None = None
) -> Backend:
    """The backend called ``name`` (None: :func:`default`) at the given precision ("float32" or
    "float64"), with its arrays on ``device`` (None: the backend's default device).

    Raises a :class:`~ppl_bdl.errors.BackendError` that lists the installed backends and names the
    extra to install when ``name`` is unknown or missing, and the available devices when
    ``device`` is not one of them.
    """
    if name is None:
        name = default()
    if not isinstance(name, str):
        if name.precision == precision and device in (None, name.device):
            return name
        return get(name.name, precision, device if device is not None else name.device)
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
    return _load(name, precision, device)


def owner_of(value) -> Backend | None:
    """The installed backend whose arrays ``value`` is one of (only backends already imported
    are asked: an array of a library that was never imported cannot exist), or None."""
    import sys

    for name, target in registered().items():
        module_name = target.split(":")[0]
        if module_name in sys.modules and _installed(name):
            backend = get(name)
            if backend.is_array(value):
                return backend
    return None
