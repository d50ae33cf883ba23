"""``@model``: a plain function becomes a Model; calling it with data binds the data.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def linreg(X, y=None):
...     w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])
>>> bound = linreg(np.ones((5, 2)), np.zeros(5))
>>> native = bound.lower("numpyro")     # a plain NumPyro model, data bound
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DataError, ModelError


def foreign_library(value: Any) -> str | None:
    """The library of an array that is not a NumPy array (e.g. 'torch', 'jax'), else None.

    Read off the value's type, without importing anything: used to keep arrays of an array
    library as they are at bind time and to name the library in errors."""
    if isinstance(value, np.ndarray | np.generic):
        return None
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        return None
    # The most basic class that is not ``object`` names the library (jax's ArrayImpl lives in
    # jaxlib but derives from jax.Array).
    bases = [c for c in type(value).__mro__ if c is not object]
    root = bases[-1].__module__.split(".", 1)[0]
    return None if root in ("numpy", "builtins") else root


class Model:
    """A generative model written in the DSL. Call it with data to get a :class:`BoundModel`."""

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise ModelError(f"@model expects a function, got {type(fn).__name__}.")
        self.fn = fn
        self.name = getattr(fn, "__name__", "model")
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> BoundModel:
        return BoundModel(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<ppl_bdl.Model {self.name}>"


def model(fn: Callable) -> Model:
    """Decorator: turn a function that calls ``sample``/``plate``/... into a :class:`Model`.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def normal_mean(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", len(y)) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> normal_mean
    <ppl_bdl.Model normal_mean>
    """
    return Model(fn)


class BoundModel:
    """A model with its data bound. It does not run until ``fit``, ``predict`` or ``lower`` runs it."""

    def __init__(self, model: Model, args: tuple, kwargs: dict):
        self.model = model
        self.args = tuple(_to_host(a, f"argument {i}") for i, a in enumerate(args))
        self.kwargs = {k: _to_host(v, f"argument {k!r}") for k, v in kwargs.items()}
        self._converted: dict[tuple[str, str], tuple[tuple, dict]] = {}

    @property
    def name(self) -> str:
        return self.model.name

    def data_for(self, backend) -> tuple[tuple, dict]:
        """The bound data as ``backend`` arrays on its device, converted once per backend."""
        key = (backend.name, backend.precision, backend.device)
        if key not in self._converted:
            args = tuple(_to_backend(a, backend, f"argument {i}") for i, a in enumerate(self.args))
            kwargs = {k: _to_backend(v, backend, f"argument {k!r}") for k, v in self.kwargs.items()}
            self._converted[key] = (args, kwargs)
        return self._converted[key]

    def data_arrays(self, backend) -> tuple[list, Any]:
        """The bound data split into its arrays (a list, to pass to compiled functions as
        arguments rather than bake into them as constants) and a template holding the rest;
        :func:`fill_data` puts them back together."""
        args, kwargs = self.data_for(backend)
        arrays: list = []
        template = _split((args, kwargs), backend.is_array, arrays)
        return arrays, template

    def run_with(self, runtime, data: Any = None) -> Any:
        """Run the model function under ``runtime`` (a :class:`~ppl_bdl.runtime.Runtime`), on the
        bound data or on ``data`` (``(args, kwargs)`` of the same structure).

        The model's code gets the data's arrays as the backend's ``model_value`` (arrays that
        mix with NumPy values on either side of an operator; in a validating run, ones that refuse
        to become Python values). A shape error of the array library raised while the model runs,
        or a model value used as a Python value (``if mu > 0:``), comes back as a
        :class:`~ppl_bdl.errors.ModelError` naming the model, the site being computed and the
        line of the model (:mod:`ppl_bdl.model_errors`); the original is its ``__cause__``.
        """
        be = runtime.backend
        data = self.data_for(be) if data is None else data
        args, kwargs = _map_arrays(
            data, be.is_array, lambda a: be.model_value(a, runtime.strict_values)
        )
        runtime.current_site = runtime.last_site = None
        with runtime:
            try:
                return self.model.fn(*args, **kwargs)
            except (TypeError, ValueError, RuntimeError, IndexError) as err:
                from .model_errors import (
                    conversion_error,
                    is_conversion_error,
                    is_shape_error,
                    shape_error,
                )

                if is_conversion_error(err):
                    raise conversion_error(self.model, runtime, err) from err
                if not is_shape_error(err):
                    raise
                raise shape_error(self.model, runtime, err) from err

    def lower(self, backend: str | None = None, precision: str = "float32") -> Callable[[], Any]:
        """Return a plain native model: a no-argument callable that Pyro's or NumPyro's own
        ``MCMC``, ``SVI`` and ``Predictive`` accept.

        Discrete latent sites are marked for parallel enumeration (their shapes read off one
        run of the model here), so the backend's own NUTS sums them out.

        Example
        -------
        >>> import numpy as np, numpyro, jax, ppl_bdl as bdl
        >>> from ppl_bdl import dist
        >>> @bdl.model
        ... def m(y):
        ...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        ...     bdl.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> native = m(np.array([0.5])).lower("numpyro")
        >>> mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(native), num_warmup=10, num_samples=10,
        ...                           progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0))
        """
        from .backends import get as get_backend
        from .lowering import Lowering

        be = get_backend(backend, precision=precision)
        sites, discrete = self._discrete_trace(be)

        def native_model():
            with be.scope():
                return self.run_with(Lowering(be, sites=sites, enumerated=discrete))

        native_model.__name__ = f"{self.name}_{be.name}"
        native_model.__doc__ = f"{self.name} lowered to {be.name} (data bound; no arguments)."
        return native_model

    def _discrete_trace(self, be) -> tuple[dict | None, frozenset]:
        """A trace of the model and its discrete latent sites when it has any (their values
        carry enumeration's dimensions when lowered); (None, empty) otherwise, or when the model
        fails to run: its error then shows where the lowered model is called."""
        from .errors import PPLError
        from .layout import trace_model

        try:
            sites = trace_model(self, be)
        except PPLError:
            return None, frozenset()
        discrete = frozenset(n for n, s in sites.items() if s.kind == "latent" and s.is_discrete)
        return (sites, discrete) if discrete else (None, frozenset())

    def __repr__(self) -> str:
        return f"<ppl_bdl.BoundModel {self.name}>"


def fill_data(template: Any, arrays: list) -> tuple[tuple, dict]:
    """``(args, kwargs)`` from a template of :meth:`BoundModel.data_arrays` and its arrays."""
    return _fill(template, iter(arrays))


class _Slot:
    """Where an array was taken out of the data (see :meth:`BoundModel.data_arrays`)."""


def _split(value: Any, is_array, arrays: list) -> Any:
    if is_array(value):
        arrays.append(value)
        return _Slot
    if isinstance(value, tuple | list):
        return type(value)(_split(v, is_array, arrays) for v in value)
    if isinstance(value, dict):
        return {k: _split(v, is_array, arrays) for k, v in value.items()}
    return value


def _map_arrays(value: Any, is_array, fn) -> Any:
    """``value`` (args and kwargs of a model) with ``fn`` applied to each array in it."""
    if is_array(value):
        return fn(value)
    if isinstance(value, tuple | list):
        return type(value)(_map_arrays(v, is_array, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_arrays(v, is_array, fn) for k, v in value.items()}
    return value


def _fill(template: Any, arrays) -> Any:
    if template is _Slot:
        return next(arrays)
    if isinstance(template, tuple | list):
        return type(template)(_fill(v, arrays) for v in template)
    if isinstance(template, dict):
        return {k: _fill(v, arrays) for k, v in template.items()}
    return template


def _to_host(value: Any, where: str) -> Any:
    """Normalise user data at bind time: pandas and lists become NumPy; backend arrays are kept."""
    if value is None or isinstance(value, str | bool | int | float | np.ndarray | np.generic):
        return value
    if hasattr(value, "to_numpy") and callable(value.to_numpy):  # pandas Series / DataFrame
        return np.asarray(value.to_numpy())
    if foreign_library(value) is not None:  # an array library's array: kept as it is
        return value
    if isinstance(value, list | tuple):
        try:
            return np.asarray(value)
        except ValueError as e:
            raise DataError(f"{where}: a ragged list cannot become an array ({e}).") from None
    if isinstance(value, dict):
        return {k: _to_host(v, f"{where}[{k!r}]") for k, v in value.items()}
    return value


def _to_backend(value: Any, backend, where: str) -> Any:
    if isinstance(value, dict):
        return {k: _to_backend(v, backend, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, np.ndarray) or backend.is_array(value):
        return backend.asarray(value)
    library = foreign_library(value)
    if library is not None:
        raise DataError(
            f"{where} is a {library} array but the model runs on the {backend.name!r} backend. "
            "Bind NumPy arrays (they are converted once to the backend chosen at fit time), or "
            "convert it with np.asarray(...)."
        )
    return value
