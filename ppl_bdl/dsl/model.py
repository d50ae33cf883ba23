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

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.bound_data import map_arrays, split_arrays, to_backend, to_host
from ppl_bdl.dsl.effects import Handler
from ppl_bdl.dsl.model_errors import (
    conversion_error,
    is_conversion_error,
    is_shape_error,
    shape_error,
)
from ppl_bdl.errors import ModelError
from ppl_bdl.trace.lowering import lower_model


class Model:
    """A generative model written in the DSL. Call it with data to get a :class:`BoundModel`."""

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise ModelError(f"@model expects a function, got {type(fn).__name__}.")
        self.fn = fn
        self.name = getattr(fn, "__name__", "model")
        #: Compiled programs that run this model (prediction, prior draws), by what they do, the
        #: backend and the data's structure: another fit or prediction reuses them.
        self.compiled: dict[tuple, Any] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> BoundModel:
        return BoundModel(self, args, kwargs)

    def __getstate__(self) -> dict:
        """What a pickle of the model holds (sent to another process: a Ray worker): its
        function and name; the compiled programs are rebuilt where it runs."""
        return {**self.__dict__, "compiled": {}}

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
        self.args = tuple(to_host(a, f"argument {i}") for i, a in enumerate(args))
        self.kwargs = {k: to_host(v, f"argument {k!r}") for k, v in kwargs.items()}
        self._converted: dict[tuple[str, str], tuple[tuple, dict]] = {}

    @property
    def name(self) -> str:
        return self.model.name

    def __getstate__(self) -> dict:
        """What a pickle of the bound model holds: the model and the data on the host; the
        data's backend arrays are converted again where it runs."""
        return {**self.__dict__, "_converted": {}}

    def data_for(self, backend) -> tuple[tuple, dict]:
        """The bound data as ``backend`` arrays on its device, converted once per backend."""
        key = (backend.name, backend.precision, backend.device)
        if key not in self._converted:
            args = tuple(to_backend(a, backend, f"argument {i}") for i, a in enumerate(self.args))
            kwargs = {k: to_backend(v, backend, f"argument {k!r}") for k, v in self.kwargs.items()}
            self._converted[key] = (args, kwargs)
        return self._converted[key]

    def data_arrays(self, backend) -> tuple[list, Any]:
        """The bound data split into its arrays (a list, to pass to compiled functions as
        arguments rather than bake into them as constants) and a template holding the rest;
        :func:`~ppl_bdl.dsl.bound_data.fill_data` puts them back together."""
        args, kwargs = self.data_for(backend)
        arrays: list = []
        template = split_arrays((args, kwargs), backend.is_array, arrays)
        return arrays, template

    def run_with(self, runtime, data: Any = None, handlers: Sequence[Handler] = ()) -> Any:
        """Run the model function under ``runtime`` (a :class:`~ppl_bdl.dsl.effects.Runtime`), on the
        bound data or on ``data`` (``(args, kwargs)`` of the same structure), with ``handlers``
        entered above the runtime for the run (such as
        :class:`~ppl_bdl.dsl.nn.dropout.ActiveDropout`).

        The model's code gets the data's arrays as the backend's ``model_value`` (arrays that
        mix with NumPy values on either side of an operator; in a validating run, ones that refuse
        to become Python values). A shape error of the array library raised while the model runs,
        or a model value used as a Python value (``if mu > 0:``), comes back as a
        :class:`~ppl_bdl.errors.ModelError` naming the model, the site being computed and the
        line of the model (:mod:`ppl_bdl.dsl.model_errors`); the original is its ``__cause__``.
        """
        backend = runtime.backend
        data = self.data_for(backend) if data is None else data
        args, kwargs = map_arrays(
            data, backend.is_array, lambda a: backend.model_value(a, runtime.strict_values)
        )
        runtime.current_site = runtime.last_site = None
        with runtime, contextlib.ExitStack() as stack:
            for handler in handlers:
                stack.enter_context(handler)
            try:
                return self.model.fn(*args, **kwargs)
            except (TypeError, ValueError, RuntimeError, IndexError) as err:
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
        return lower_model(self, get_backend(backend, precision=precision))

    def __repr__(self) -> str:
        return f"<ppl_bdl.BoundModel {self.name}>"


def unbound_message(obj: Any) -> str:
    """What to say when ``obj`` was passed where a bound model (``my_model(data...)``) belongs."""
    if isinstance(obj, Model):
        return (
            f"{obj.name} is a model without data: bind its data first, e.g. "
            f"fit({obj.name}(X, y), ...), then pass the bound model."
        )
    return f"expected a bound model (my_model(data...)), got {type(obj).__name__}."
