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

_FAMILIES = {"torch": "pyro", "jax": "numpyro", "jaxlib": "numpyro"}


def array_family(x: Any) -> str | None:
    """'torch' or 'jax' for a backend array, None for anything else (no import needed)."""
    root = type(x).__module__.split(".", 1)[0]
    return "jax" if root == "jaxlib" else root if root in ("torch", "jax") else None


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
        """The bound data as ``backend`` arrays, converted once per backend and precision."""
        key = (backend.name, backend.precision)
        if key not in self._converted:
            args = tuple(_to_backend(a, backend, f"argument {i}") for i, a in enumerate(self.args))
            kwargs = {k: _to_backend(v, backend, f"argument {k!r}") for k, v in self.kwargs.items()}
            self._converted[key] = (args, kwargs)
        return self._converted[key]

    def run_with(self, runtime) -> Any:
        """Run the model function under ``runtime`` (a :class:`~ppl_bdl.runtime.Runtime`).

        A shape error of the array library raised while the model runs comes back as a
        :class:`~ppl_bdl.errors.ModelError` naming the model, the site being computed and the
        line of the model (:mod:`ppl_bdl.model_errors`); the original is its ``__cause__``.
        """
        args, kwargs = self.data_for(runtime.backend)
        runtime.current_site = runtime.last_site = None
        with runtime:
            try:
                return self.model.fn(*args, **kwargs)
            except (TypeError, ValueError, RuntimeError, IndexError) as err:
                from .model_errors import is_shape_error, shape_error

                if not is_shape_error(err):
                    raise
                raise shape_error(self.model, runtime, err) from err

    def lower(self, backend: str = "numpyro", precision: str = "float32") -> Callable[[], Any]:
        """Return a plain native model: a no-argument callable that Pyro's or NumPyro's own
        ``MCMC``, ``SVI`` and ``Predictive`` accept.

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

        def native_model():
            with be.precision_scope():
                return self.run_with(Lowering(be))

        native_model.__name__ = f"{self.name}_{be.name}"
        native_model.__doc__ = f"{self.name} lowered to {be.name} (data bound; no arguments)."
        return native_model

    def __repr__(self) -> str:
        return f"<ppl_bdl.BoundModel {self.name}>"


def _to_host(value: Any, where: str) -> Any:
    """Normalise user data at bind time: pandas and lists become NumPy; backend arrays are kept."""
    if value is None or isinstance(value, str | bool | int | float | np.ndarray | np.generic):
        return value
    if array_family(value) is not None:
        return value
    if hasattr(value, "to_numpy") and callable(value.to_numpy):  # pandas Series / DataFrame
        return np.asarray(value.to_numpy())
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
    family = array_family(value)
    if family is not None and _FAMILIES[family] != backend.name:
        raise DataError(
            f"{where} is a {family} array but the model runs on the {backend.name!r} backend. Bind "
            "NumPy arrays (they are converted once to the backend chosen at fit time), or convert it "
            "with np.asarray(...)."
        )
    if isinstance(value, np.ndarray) or family is not None:
        return backend.asarray(value)
    return value
