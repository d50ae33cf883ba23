"""Backend-neutral constraints: the domain of a distribution's parameters and of its support.

Each constraint is a name (the backend maps it to its own constraint object and bijection) and a
check on concrete NumPy values, used to validate parameters when a distribution is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Constraint:
    """A named domain with a NumPy check. ``event_dim`` is how many rightmost dims one point uses."""

    name: str
    check: Callable[[np.ndarray], np.ndarray]
    description: str
    event_dim: int = 0
    discrete: bool = False


def _is_int(x):
    return np.equal(np.mod(x, 1), 0)


def _simplex(x):
    return np.all(x >= 0, axis=-1) & (np.abs(np.sum(x, axis=-1) - 1) < 1e-4)


def _positive_definite(x):
    sym = np.allclose(x, np.swapaxes(x, -1, -2), atol=1e-6)
    try:
        np.linalg.cholesky(x)
        return np.full(x.shape[:-2], sym)
    except np.linalg.LinAlgError:
        return np.zeros(x.shape[:-2], bool)


def _lower_cholesky(x):
    lower = np.all(np.triu(x, 1) == 0, axis=(-1, -2))
    diag = np.all(np.diagonal(x, axis1=-2, axis2=-1) > 0, axis=-1)
    return lower & diag


real = Constraint("real", lambda x: np.isfinite(x), "a finite real number")
positive = Constraint("positive", lambda x: x > 0, "a number > 0")
nonnegative = Constraint("nonnegative", lambda x: x >= 0, "a number >= 0")
unit_interval = Constraint(
    "unit_interval", lambda x: (x >= 0) & (x <= 1), "a probability in [0, 1]"
)
boolean = Constraint("boolean", lambda x: (x == 0) | (x == 1), "0 or 1", discrete=True)
nonnegative_integer = Constraint(
    "nonnegative_integer", lambda x: (x >= 0) & _is_int(x), "an integer >= 0", discrete=True
)
positive_integer = Constraint(
    "positive_integer", lambda x: (x >= 1) & _is_int(x), "an integer >= 1"
)
integer = Constraint("integer", _is_int, "an integer", discrete=True)
simplex = Constraint("simplex", _simplex, "a probability vector (>= 0, summing to 1)", event_dim=1)
real_vector = Constraint(
    "real_vector", lambda x: np.all(np.isfinite(x), axis=-1), "a real vector", 1
)
positive_definite = Constraint(
    "positive_definite", _positive_definite, "a symmetric positive-definite matrix", 2
)
lower_cholesky = Constraint(
    "lower_cholesky", _lower_cholesky, "a lower-triangular matrix with a positive diagonal", 2
)
corr_cholesky = Constraint(
    "corr_cholesky", _lower_cholesky, "the Cholesky factor of a correlation matrix", 2
)
interval = Constraint("interval", lambda x: np.isfinite(x), "a number inside [low, high]")
integer_interval = Constraint(
    "integer_interval", _is_int, "an integer inside [0, total_count]", discrete=True
)

#: Constraints a ``param`` may carry.
CONSTRAINT_NAMES = {"real", "positive", "unit_interval", "simplex"}


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
