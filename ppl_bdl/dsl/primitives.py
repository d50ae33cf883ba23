"""The DSL's primitives: ``sample``, ``plate``, ``param``, ``deterministic``, ``factor``.

They only build a :class:`~ppl_bdl.dsl.effects.Message` and send it down the effect stack; what
happens then (a native Pyro/NumPyro call, or a value and its log density from the core's own
interpreter) is up to the runtime at the bottom of the stack.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def coin(flips):
...     p = bdl.sample("p", dist.Beta(1.0, 1.0))
...     with bdl.plate("flips", len(flips)) as idx:
...         bdl.sample("y", dist.Bernoulli(probs=p), obs=flips[idx])
>>> bound = coin(np.array([1.0, 0.0, 1.0]))
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from ppl_bdl.dsl.dist.base import Distribution
from ppl_bdl.dsl.dist.constraints import CONSTRAINT_NAMES
from ppl_bdl.dsl.effects import (
    Message,
    PlateFrame,
    PlateHandler,
    apply_stack,
    current_plates,
    current_runtime,
)
from ppl_bdl.errors import ModelError


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ModelError(f"{kind} site name must be a non-empty string, got {name!r}.")


def sample(
    name: str, fn: Distribution, obs: Any = None, shape: tuple[int, ...] | int | None = None
):
    """Draw (or observe) a random variable named ``name`` from the distribution ``fn``.

    Parameters
    ----------
    name : str
        Unique site name; it names the variable in the posterior and in ArviZ.
    fn : ppl_bdl.dsl.dist.Distribution
        A backend-neutral distribution, e.g. ``dist.Normal(0.0, 1.0)``.
    obs : array, optional
        Observed value. Observed sites make up the likelihood.
    shape : tuple of int, optional
        The shape of one draw per plate element. Outside any plate it makes a single event of that
        shape (``sample("w", dist.Normal(0, 1), shape=(3,))`` is one 3-vector); inside a plate the
        plate's dimension is a batch dimension on the left of ``shape``. Without ``shape``, a site
        outside plates takes the distribution's batch shape as its event shape.

    Returns
    -------
    The value of the site, as a backend array.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def prior_only():
    ...     return bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    >>> prior_only().lower("numpyro") is not None
    True
    """
    _check_name("sample", name)
    if not isinstance(fn, Distribution):
        raise ModelError(
            f"sample({name!r}): expected a ppl_bdl.dsl.dist distribution, got {type(fn).__name__}. "
            "Build distributions with ppl_bdl.dsl.dist (e.g. dist.Normal(0.0, 1.0)); native Pyro/NumPyro "
            "distributions are not accepted in the DSL."
        )
    if isinstance(shape, int):
        shape = (shape,)
    if shape is not None:
        shape = tuple(int(s) for s in shape)
    fn.raise_if_invalid(name)
    msg = Message("sample", name, fn=fn, obs=obs, shape=shape)
    return apply_stack(msg).value


def param(name: str, init: Any, constraint: str | None = None):
    """A learnable (non-random) parameter with initial value ``init``.

    ``constraint`` is one of ``None`` / ``"real"``, ``"positive"``, ``"unit_interval"``,
    ``"simplex"``. In a guide, params are the variational parameters. In a model, they are held at
    their initial value by MCMC and optimised as point estimates by VI.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> @bdl.model
    ... def m():
    ...     s = bdl.param("s", 1.0, constraint="positive")
    """
    _check_name("param", name)
    if constraint is not None and constraint not in CONSTRAINT_NAMES:
        raise ModelError(
            f"param({name!r}): unknown constraint {constraint!r}; expected one of "
            f"{sorted(CONSTRAINT_NAMES)}."
        )
    msg = Message("param", name, fn=init, kwargs={"constraint": constraint or "real"})
    return apply_stack(msg).value


def deterministic(name: str, value: Any):
    """Record a function of the latent variables under ``name`` (it appears in the posterior).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m():
    ...     z = bdl.sample("z", dist.Normal(0.0, 1.0))
    ...     bdl.deterministic("z2", z * 2.0)
    """
    _check_name("deterministic", name)
    msg = Message("deterministic", name, value=value)
    return apply_stack(msg).value


def factor(name: str, log_weight: Any) -> None:
    """Add ``log_weight`` to the model's log density (an extra, unnormalised term).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist, math as bm
    >>> @bdl.model
    ... def banana():
    ...     x = bdl.sample("x", dist.ImproperUniform(), shape=(2,))
    ...     bdl.factor("target", -0.5 * (x[0] ** 2 + (x[1] - x[0] ** 2) ** 2))
    """
    _check_name("factor", name)
    msg = Message("factor", name, value=log_weight)
    apply_stack(msg)


@contextmanager
def plate(name: str, size: int):
    """Declare ``size`` conditionally independent elements; yields the index array of the batch.

    For full-batch methods the indices are ``0..size-1``. With ``batch_size=B`` at fit time the plate
    yields ``B`` indices of a shuffled epoch and the log-likelihood of the sites inside is scaled by
    ``size / B`` (Eq. 2.19 of "Bayesian Computation in Deep Learning"), so index your data with them: ``y[idx]``.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    """
    _check_name("plate", name)
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ModelError(f"plate({name!r}): size must be a positive int, got {size!r}.")
    runtime = current_runtime()
    if runtime is None:
        raise ModelError(f"plate({name!r}) was used outside a model run.")
    frames = current_plates()
    if any(f.name == name for f in frames):
        raise ModelError(f"plate({name!r}) is nested inside a plate of the same name.")
    frame = PlateFrame(name=name, size=int(size), dim=-1 - len(frames))
    with runtime.plate(frame) as indices, PlateHandler(frame):
        yield indices
