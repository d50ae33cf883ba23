"""``log_prob`` and ``sample`` of a neutral spec by a backend's native distribution, inside and
outside a model.

Inside a model run (or ``with backend.activate():``) both run on that backend's native distribution
and return backend arrays, so a density written with ``dist.X(...).log_prob`` can go into
``bdl.factor`` and gradients flow through it. Outside any run there is no backend chosen at fit
time, so one is picked here: the backend that owns a backend array among the value and the
parameters, else the default installed backend (:func:`ppl_bdl.backends.default_name`), in float64.
NumPy in, NumPy out: the result is then a NumPy array, and points outside the support get -inf.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> dist.Normal(0.0, 1.0).log_prob(np.array([0.0, 1.0])).round(4)
array([-0.9189, -1.4189])
>>> dist.Poisson(2.0).log_prob(np.array([1.0, 1.5]))[1]
np.float64(-inf)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ppl_bdl import backends
from ppl_bdl.dsl.effects import active_backend, current_runtime
from ppl_bdl.errors import DistributionError


def _leaves(spec) -> list[Any]:
    """Every parameter value of ``spec``, nested specs (a mixture's components) included."""
    out = []
    for value in spec.params.values():
        if hasattr(value, "params") and hasattr(value, "support"):
            out.extend(_leaves(value))
        else:
            out.append(value)
    return out


def _outside_backend(spec, *values):
    """(backend, owned): the backend for a call outside any run, and whether an array is its own."""
    owner = backends.owner_of(*values, *_leaves(spec))
    if owner is not None:
        return owner, True
    return backends.get(backends.default_name(), "float64"), False


def _in_model(backend, out):
    """``out`` as the backend's ``model_value`` inside a model run (so NumPy values mix with it
    as with the model's other values), as it is elsewhere."""
    runtime = current_runtime()
    return out if runtime is None else backend.model_value(out, runtime.strict_values)


def _log_prob_on(backend, spec, value):
    native = backend.distribution(spec)
    if not backend.is_array(value):
        value = backend.asarray(np.asarray(value))
    return native.log_prob(backend.observed_value(spec, value))


def log_prob(spec, value: Any) -> Any:
    """``spec``'s log density at ``value``; see :meth:`Distribution.log_prob`."""
    spec.raise_if_invalid()
    backend = active_backend()
    if backend is not None:
        return _in_model(backend, _log_prob_on(backend, spec, value))
    backend, owned = _outside_backend(spec, value)
    with backend.scope(), backend.activate(), warnings.catch_warnings():
        # Out-of-support points get -inf below; a native warning about them says nothing more.
        warnings.filterwarnings("ignore", message="Out-of-support values")
        out = _log_prob_on(backend, spec, value)
        if owned:
            return out
        out = np.asarray(backend.to_numpy(out), dtype=float)
    # The native densities skip support checks (the core checks observed data once per fit);
    # a user's own check outside a model gets the mathematically right -inf instead.
    array = np.asarray(value, dtype=float)
    if array.ndim >= spec.support.event_dim:
        inside = spec.support_mask(array) & np.all(
            np.isfinite(array).reshape(array.shape[: array.ndim - spec.support.event_dim] + (-1,)),
            axis=-1,
        )
        out = np.where(inside, out, -np.inf)
    return out[()] if out.ndim == 0 else out


def _sample_shape(sample_shape) -> tuple[int, ...]:
    if isinstance(sample_shape, int | np.integer):
        return (int(sample_shape),)
    try:
        if isinstance(sample_shape, str):
            raise TypeError
        return tuple(int(s) for s in sample_shape)
    except (TypeError, ValueError):
        raise DistributionError(
            f"sample_shape must be an int or a tuple of ints, got {sample_shape!r}."
        ) from None


def _sample_on(backend, spec, key, shape):
    if isinstance(key, int | np.integer):
        key = backend.random.key(int(key))
    native = backend.distribution(spec)
    full = backend.expand(native, shape + tuple(native.batch_shape), 0)
    return backend.random.draw(key, full)


def sample(spec, key: Any, sample_shape=()) -> Any:
    """Draws from ``spec``; see :meth:`Distribution.sample`."""
    spec.raise_if_invalid()
    shape = _sample_shape(sample_shape)
    if isinstance(key, bool) or key is None:
        raise DistributionError(
            f"{spec.name}.sample: key must be an int seed or a backend random key, got {key!r}."
        )
    backend = active_backend()
    if backend is not None:
        return _in_model(backend, _sample_on(backend, spec, key, shape))
    if isinstance(key, int | np.integer):
        backend, _ = _outside_backend(spec)
    else:
        backend = backends.owner_of(key, *_leaves(spec))
        if backend is None:
            raise DistributionError(
                f"{spec.name}.sample: key must be an int seed or a backend random key "
                f"(backend.random.key(seed)), got a {type(key).__name__}."
            )
    with backend.scope(), backend.activate():
        return np.asarray(backend.to_numpy(_sample_on(backend, spec, key, shape)))
