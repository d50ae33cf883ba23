"""Backends: where a DSL model runs. One module per backend, found through entry points.

The core talks to a backend only through the :class:`~ppl_bdl.backend_protocol.Backend` protocol.
Backends are discovered through the entry-point group ``ppl_bdl.backends``, so a third-party
package can add one without touching the core.

Example
-------
>>> import ppl_bdl as bdl
>>> sorted(bdl.backends.available())
['numpyro', 'pyro']
>>> backend = bdl.backends.get("numpyro")
"""

from __future__ import annotations

import importlib.util
from functools import cache, lru_cache
from importlib.metadata import entry_points

from ppl_bdl.backend_protocol import Backend
from ppl_bdl.errors import BackendError

__all__ = [
    "Backend",
    "available",
    "default",
    "default_name",
    "get",
    "libraries",
    "owner_of",
    "registered",
]

#: Built-in backends and the third-party packages each needs (checked without importing them).
_BUILTIN = {
    "pyro": ("ppl_bdl.backends.pyro.backend:PyroBackend", ("torch", "pyro")),
    "numpyro": ("ppl_bdl.backends.numpyro.backend:NumPyroBackend", ("jax", "numpyro")),
}
#: Which installed backend runs ``dist.X(...).log_prob`` / ``.sample`` outside any model, first
#: found first (any backend gives the same numbers; JAX imports faster than torch).
_DEFAULT_ORDER = ("numpyro", "pyro")
#: Backends loaded so far, by (name, precision): ``owner_of`` asks them first.
_LOADED: dict[tuple[str, str, str | None], Backend] = {}


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
def _load(name: str, precision: str, device, shard: str | None) -> Backend:
    module_name, cls_name = registered()[name].split(":")
    module = importlib.import_module(module_name)
    # ``shard`` only when asked: a backend that runs on one device need not take it.
    extra = {} if shard is None else {"shard": shard}
    backend = getattr(module, cls_name)(precision=precision, device=device, **extra)
    _LOADED[name, precision, device if isinstance(device, str | None) else ",".join(device)] = (
        backend
    )
    return backend


#: What ``shard=`` may name (the built-in backends' :data:`~ppl_bdl.backends.base.SHARD_MODES`).
_SHARD_MODES = ("chains", "data")


def get(
    name: str | Backend | None = None,
    precision: str = "float32",
    device=None,
    shard: str | None = None,
) -> Backend:
    """The backend called ``name`` (None: :func:`default`) at the given precision ("float32" or
    "float64"), with its arrays on ``device`` (None: the backend's default device; a list of
    devices, or a kind with a star such as ``"cuda:*"``, spreads a fit's work over them, split as
    ``shard`` says: "chains", the default, or "data", each step's minibatch).

    Raises a :class:`~ppl_bdl.errors.BackendError` that lists the installed backends and names the
    extra to install when ``name`` is unknown or missing, and the available devices when
    ``device`` is not one of them.
    """
    if shard is not None and shard not in _SHARD_MODES:
        raise BackendError(
            f"shard must be 'chains' (chains split over the devices) or 'data' (each step's "
            f"minibatch split over them), got {shard!r}."
        )
    if isinstance(device, list | tuple):
        device = tuple(device)  # hashable: backends are cached per device
    if name is None:
        name = default()
    if not isinstance(name, str):
        if (
            name.precision == precision
            and device in (None, name.device)
            and shard in (None, name.shard_mode)
        ):
            return name
        device = device if device is not None else name.device
        return get(name.name, precision, device, shard if shard is not None else name.shard_mode)
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
    # "chains" is every backend's default: one cached backend for it, named or not.
    return _load(name, precision, device, None if shard == "chains" else shard)


def default_name() -> str:
    """The backend that evaluates distributions outside any model (the first installed one).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.backends.default_name() in bdl.backends.available()
    True
    """
    return default()


def _claimant(value) -> str | None:
    """The name of the backend whose arrays (or random keys) ``value`` is, or None."""
    for (name, _, _), backend in list(_LOADED.items()):
        if backend.is_array(value):
            return name
    root = type(value).__module__.partition(".")[0]
    for name, (_, needs) in _BUILTIN.items():
        # jax arrays live in 'jaxlib'; torch tensors and generators in 'torch'
        if any(root.startswith(package) for package in needs) and _installed(name):
            return name
    return None


def owner_of(*values) -> Backend | None:
    """The backend that owns the first backend array (or random key) among ``values``, or None.

    Its precision follows the arrays: float32 when one of them is a float32 array, else float64.
    NumPy arrays and Python numbers belong to no backend.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> bdl.backends.owner_of(np.zeros(3), 1.0) is None
    True
    >>> backend = bdl.backends.get("pyro")
    >>> bdl.backends.owner_of(backend.asarray([1.0])).name
    'pyro'
    """
    owner = None
    precision = "float64"
    for value in values:
        name = _claimant(value)
        if name is None:
            continue
        owner = owner or name
        if str(getattr(value, "dtype", "")).rpartition(".")[2] in (
            "float32",
            "float16",
            "bfloat16",
        ):
            precision = "float32"
    return None if owner is None else get(owner, precision)
