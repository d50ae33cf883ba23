"""Backend-neutral constraints: the domain of a distribution's parameters and of its support.

Each constraint is a name (the backend maps supports to its own constraint objects and bijections)
and a check on concrete NumPy values, used to validate parameters when a distribution is built and
observed values once per fit. Supports that depend on parameters (``Binomial``: 0..total_count,
``Uniform``: [low, high], ...) are built per spec from its concrete parameters with the factories
at the end of this module.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.dsl.dist import constraints as C
>>> C.boolean.check(np.array([0.0, 1.0, 0.5]))
array([ True,  True, False])
>>> support = C.between(0, 5, integer=True)
>>> support.description, support.check(np.array([0, 5, 6, 2.5])).tolist()
('an integer in [0, 5]', [True, True, False, False])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Constraint:
    """A named domain with a NumPy check. ``event_dim`` is how many rightmost dims one point uses.

    ``at`` (optional) describes the domain at one batch index, for supports whose bounds vary
    across a batch (the message then shows the bound that the offending point broke).
    """

    name: str
    check: Callable[[np.ndarray], np.ndarray]
    description: str
    event_dim: int = 0
    discrete: bool = False
    at: Callable[[tuple[int, ...]], str] | None = None
    #: The bounds of a parameterised support (``between``: (low, high); ``at_least``: (low,)).
    args: tuple = ()

    def describe(self, index: tuple[int, ...] | None = None) -> str:
        """The domain in words (at batch ``index`` when its bounds vary)."""
        if index is not None and self.at is not None:
            return self.at(index)
        return self.description


def _is_int(x):
    return np.equal(np.mod(x, 1), 0)


def _simplex(x):
    return np.all(x >= 0, axis=-1) & (np.abs(np.sum(x, axis=-1) - 1) < 1e-4)


def _symmetric(x):
    return np.all(np.abs(x - np.swapaxes(x, -1, -2)) <= 1e-6 * (1 + np.abs(x)), axis=(-1, -2))


def _positive_definite(x):
    x = np.asarray(x, dtype=float)
    ok = _symmetric(x) & np.all(np.isfinite(x), axis=(-1, -2))
    # eigvalsh reads one triangle only, so symmetry is checked above.
    eig = np.linalg.eigvalsh(np.where(np.isfinite(x), x, 0.0))
    return ok & np.all(eig > 0, axis=-1)


def _lower_cholesky(x):
    lower = np.all(np.triu(x, 1) == 0, axis=(-1, -2))
    diag = np.all(np.diagonal(x, axis1=-2, axis2=-1) > 0, axis=-1)
    return lower & diag


def _corr_cholesky(x):
    rows = np.sqrt(np.sum(np.square(x), axis=-1))
    return _lower_cholesky(x) & np.all(np.abs(rows - 1) < 1e-4, axis=-1)


def _corr_matrix(x):
    diag = np.all(np.abs(np.diagonal(x, axis1=-2, axis2=-1) - 1) < 1e-4, axis=-1)
    return _positive_definite(x) & diag


def _ordered(x):
    return np.all(np.diff(x, axis=-1) > 0, axis=-1)


real = Constraint("real", lambda x: np.isfinite(x), "a finite real number")
positive = Constraint("positive", lambda x: x > 0, "a number > 0")
nonnegative = Constraint("nonnegative", lambda x: x >= 0, "a number >= 0")
unit_interval = Constraint(
    "unit_interval", lambda x: (x >= 0) & (x <= 1), "a probability in [0, 1]"
)
open_unit_interval = Constraint(
    "open_unit_interval", lambda x: (x > 0) & (x < 1), "a number in the open interval (0, 1)"
)
#: A probability below 1 (NegativeBinomial's success probability: at 1 the counts are infinite).
unit_interval_open_right = Constraint(
    "unit_interval_open_right", lambda x: (x >= 0) & (x < 1), "a probability in [0, 1)"
)
#: A probability above 0 (Geometric's success probability: at 0 no trial ever succeeds).
unit_interval_open_left = Constraint(
    "unit_interval_open_left", lambda x: (x > 0) & (x <= 1), "a probability in (0, 1]"
)
boolean = Constraint("boolean", lambda x: (x == 0) | (x == 1), "0 or 1", discrete=True)
nonnegative_integer = Constraint(
    "nonnegative_integer", lambda x: (x >= 0) & _is_int(x), "an integer >= 0", discrete=True
)
positive_integer = Constraint(
    "positive_integer", lambda x: (x >= 1) & _is_int(x), "an integer >= 1", discrete=True
)
integer = Constraint("integer", _is_int, "an integer", discrete=True)
simplex = Constraint("simplex", _simplex, "a probability vector (>= 0, summing to 1)", event_dim=1)
real_vector = Constraint(
    "real_vector", lambda x: np.all(np.isfinite(x), axis=-1), "a real vector", 1
)
real_matrix = Constraint(
    "real_matrix", lambda x: np.all(np.isfinite(x), axis=(-1, -2)), "a real matrix", 2
)
ordered_vector = Constraint("ordered_vector", _ordered, "a strictly increasing vector", event_dim=1)
positive_vector = Constraint(
    "positive_vector", lambda x: np.all(x > 0, axis=-1), "a vector of numbers > 0", event_dim=1
)
positive_ordered_vector = Constraint(
    "positive_ordered_vector",
    lambda x: _ordered(x) & np.all(x > 0, axis=-1),
    "a strictly increasing vector of numbers > 0",
    event_dim=1,
)
positive_definite = Constraint(
    "positive_definite", _positive_definite, "a symmetric positive-definite matrix", 2
)
lower_cholesky = Constraint(
    "lower_cholesky", _lower_cholesky, "a lower-triangular matrix with a positive diagonal", 2
)
corr_cholesky = Constraint(
    "corr_cholesky",
    _corr_cholesky,
    "the Cholesky factor of a correlation matrix (lower-triangular, positive diagonal, unit rows)",
    2,
)
corr_matrix = Constraint(
    "corr_matrix",
    _corr_matrix,
    "a correlation matrix (symmetric positive-definite, unit diagonal)",
    2,
)
circular = Constraint(
    "circular", lambda x: (x >= -np.pi) & (x <= np.pi), "an angle in [-pi, pi] (radians)"
)
#: Kind-level supports whose bounds come from the parameters (see the factories below).
interval = Constraint("interval", lambda x: np.isfinite(x), "a number inside [low, high]")
greater_than = Constraint("greater_than", lambda x: ~np.isnan(x), "a number >= a lower bound")
integer_interval = Constraint(
    "integer_interval", _is_int, "an integer inside [0, total_count]", discrete=True
)
multinomial = Constraint(
    "multinomial",
    lambda x: np.all((x >= 0) & _is_int(x), axis=-1),
    "a vector of counts >= 0 summing to total_count",
    event_dim=1,
    discrete=True,
)
point = Constraint("point", lambda x: ~np.isnan(x), "the point v")

#: Constraints a ``param`` may carry.
CONSTRAINT_NAMES = {"real", "positive", "unit_interval", "simplex"}


# -- supports that depend on the parameters ---------------------------------------------------
def _fmt(x) -> str:
    return f"{float(x):g}"


def _varies(*bounds) -> bool:
    return any(np.ndim(b) > 0 and np.unique(np.asarray(b)).size > 1 for b in bounds)


def _value_at(bound, index):
    """``bound`` (a parameter's batch array) at the batch ``index`` of a value, right-aligned."""
    bound = np.asarray(bound)
    if bound.ndim == 0:
        return bound
    index = index[len(index) - bound.ndim :] if bound.ndim <= len(index) else index
    return bound[tuple(i if n > 1 else 0 for i, n in zip(index, bound.shape, strict=False))]


def between(low, high, integer: bool = False) -> Constraint:
    """Numbers (``integer=True``: integers) in the closed interval [low, high]."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    kind = "an integer" if integer else "a number"

    def check(x):
        ok = (x >= low) & (x <= high)
        return ok & _is_int(x) if integer else ok

    def at(index):
        return f"{kind} in [{_fmt(_value_at(low, index))}, {_fmt(_value_at(high, index))}]"

    if _varies(low, high):
        description = f"{kind} in [low, high] (bounds that vary across the batch)"
    else:
        description = f"{kind} in [{_fmt(low.flat[0])}, {_fmt(high.flat[0])}]"
    name = "integer_interval" if integer else "interval"
    return Constraint(name, check, description, discrete=integer, at=at, args=(low, high))


def at_least(low) -> Constraint:
    """Numbers >= ``low``."""
    low = np.asarray(low, dtype=float)
    described = "varies across the batch" if _varies(low) else _fmt(low.flat[0])
    return Constraint(
        "greater_than",
        lambda x: x >= low,
        f"a number >= {described}",
        at=lambda index: f"a number >= {_fmt(_value_at(low, index))}",
        args=(low,),
    )


def at_most(high) -> Constraint:
    """Numbers <= ``high``."""
    high = np.asarray(high, dtype=float)
    described = "varies across the batch" if _varies(high) else _fmt(high.flat[0])
    return Constraint(
        "less_than",
        lambda x: x <= high,
        f"a number <= {described}",
        at=lambda index: f"a number <= {_fmt(_value_at(high, index))}",
    )


def counts_summing_to(total_count) -> Constraint:
    """Vectors of non-negative integer counts that sum to ``total_count`` (Multinomial)."""
    total = np.asarray(total_count, dtype=float)

    def check(x):
        counts_ok = np.all((x >= 0) & _is_int(x), axis=-1)
        return counts_ok & (np.sum(x, axis=-1) == total)

    described = "total_count" if _varies(total) else _fmt(total.flat[0])
    return Constraint(
        "multinomial",
        check,
        f"a vector of integer counts >= 0 summing to {described}",
        event_dim=1,
        discrete=True,
        at=lambda index: (
            f"a vector of integer counts >= 0 summing to {_fmt(_value_at(total, index))}"
        ),
    )


def equal_to(v, event_dim: int = 0) -> Constraint:
    """The single point ``v`` (Delta): any other value has log density -inf."""
    v = np.asarray(v, dtype=float)
    axes = tuple(range(-event_dim, 0))

    def check(x):
        same = x == v
        return np.all(same, axis=axes) if event_dim else same

    shown = _fmt(v) if v.ndim == 0 else "v"
    return Constraint("point", check, f"exactly the point {shown}", event_dim=event_dim)


def independent(base: Constraint, reinterpreted_batch_ndims: int) -> Constraint:
    """``base`` on each entry of the ``reinterpreted_batch_ndims`` rightmost dims (``to_event``)."""
    n = reinterpreted_batch_ndims
    if n == 0:
        return base
    axes = tuple(range(-n, 0))
    return Constraint(
        base.name,
        lambda x: np.all(base.check(x), axis=axes),
        f"{base.description} (in every entry of the last {n} dim(s) of an event)",
        event_dim=base.event_dim + n,
        discrete=base.discrete,
    )


# -- the unconstrained parameterisation of ``param`` -----------------------------------------
def param_to_unconstrained(kind: str, value: np.ndarray) -> np.ndarray:
    """The unconstrained (optimised) value of a ``param`` with constraint ``kind`` (NumPy)."""
    value = np.asarray(value, dtype=float)
    if kind in ("positive", "simplex"):
        return np.log(value)
    if kind == "unit_interval":
        return np.log(value) - np.log1p(-value)
    return value


def param_to_constrained(kind: str, value, m):
    """The inverse of :func:`param_to_unconstrained`, with ``m`` a backend's math namespace."""
    if kind == "positive":
        return m.exp(value)
    if kind == "unit_interval":
        return m.sigmoid(value)
    if kind == "simplex":
        return m.softmax(value, axis=-1)
    return value
