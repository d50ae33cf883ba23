"""Multivariate families: vectors (simplex, Gaussian, counts) and matrices (correlation, Wishart).

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> d = dist.LowRankMultivariateNormal(np.zeros(3), np.ones((3, 1)), np.ones(3))
>>> d.batch_shape, d.event_shape
((), (3,))
>>> dist.Wishart(4.0, scale_matrix=np.eye(2)).event_shape
(2, 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution, _concrete, _shape
from ppl_bdl.errors import DistributionError

Array = Any


class Dirichlet(Distribution):
    """Dirichlet over the simplex of the last axis of ``concentration``."""

    arg_constraints = {"concentration": C.positive}
    arg_event_dims = {"concentration": 1}
    support = C.simplex

    def __init__(self, concentration: Array):
        super().__init__(concentration=concentration)

    @property
    def event_shape(self) -> tuple[int, ...]:
        return _shape(self.params["concentration"])[-1:]


class MultivariateNormal(Distribution):
    """N(loc, Σ) with exactly one of covariance_matrix, precision_matrix or scale_tril."""

    arg_constraints = {
        "loc": C.real_vector,
        "covariance_matrix": C.positive_definite,
        "precision_matrix": C.positive_definite,
        "scale_tril": C.lower_cholesky,
    }
    arg_event_dims = {"loc": 1, "covariance_matrix": 2, "precision_matrix": 2, "scale_tril": 2}
    support = C.real_vector
    exclusive = ("covariance_matrix", "precision_matrix", "scale_tril")

    def __init__(
        self,
        loc: Array = 0.0,
        covariance_matrix: Array = None,
        precision_matrix: Array = None,
        scale_tril: Array = None,
    ):
        super().__init__(
            loc=loc,
            covariance_matrix=covariance_matrix,
            precision_matrix=precision_matrix,
            scale_tril=scale_tril,
        )

    @property
    def event_shape(self) -> tuple[int, ...]:
        return _shape(self.params["loc"])[-1:]


class LowRankMultivariateNormal(Distribution):
    """N(loc, W Wᵀ + diag(D)) with ``cov_factor`` W (n × k) and ``cov_diag`` D (n, positive)."""

    arg_constraints = {
        "loc": C.real_vector,
        "cov_factor": C.real_matrix,
        "cov_diag": C.positive_vector,
    }
    arg_event_dims = {"loc": 1, "cov_factor": 2, "cov_diag": 1}
    support = C.real_vector

    def __init__(self, loc: Array, cov_factor: Array, cov_diag: Array):
        super().__init__(loc=loc, cov_factor=cov_factor, cov_diag=cov_diag)

    def _check_relations(self) -> str | None:
        n = {
            "loc": _shape(self.params["loc"])[-1],
            "cov_factor rows": _shape(self.params["cov_factor"])[-2],
            "cov_diag": _shape(self.params["cov_diag"])[-1],
        }
        if len(set(n.values())) != 1:
            return f"the event sizes disagree: {n}; all must be the dimension n."
        return None

    @property
    def event_shape(self) -> tuple[int, ...]:
        return _shape(self.params["loc"])[-1:]


class Multinomial(Distribution):
    """Counts of ``total_count`` draws over the categories of ``probs`` or ``logits``."""

    arg_constraints = {
        "total_count": C.nonnegative_integer,
        "probs": C.simplex,
        "logits": C.real_vector,
    }
    arg_event_dims = {"probs": 1, "logits": 1}
    support = C.multinomial
    exclusive = ("probs", "logits")

    def __init__(self, total_count: Array = 1, probs: Array = None, logits: Array = None):
        super().__init__(total_count=total_count, probs=probs, logits=logits)

    @property
    def event_shape(self) -> tuple[int, ...]:
        return _shape(self.params.get("probs", self.params.get("logits")))[-1:]

    def support_for(self, to_numpy=None) -> C.Constraint:
        bounds = self._numpy_params(to_numpy, "total_count")
        return self.support if bounds is None else C.counts_summing_to(bounds[0])


def _dimension(family: str, dimension: Any) -> int:
    if isinstance(dimension, bool) or not isinstance(dimension, int | np.integer) or dimension < 2:
        raise DistributionError(f"{family}: dimension must be an int >= 2, got {dimension!r}.")
    return int(dimension)


class _LKJFamily(Distribution):
    arg_constraints = {"concentration": C.positive}

    def __init__(self, dimension: int, concentration: Array = 1.0):
        dimension = _dimension(self.name, dimension)
        super().__init__(concentration=concentration)
        self.params["dimension"] = dimension

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.params["dimension"],) * 2


class LKJCholesky(_LKJFamily):
    """LKJ prior on the Cholesky factor of a ``dimension`` × ``dimension`` correlation matrix."""

    support = C.corr_cholesky


class LKJ(_LKJFamily):
    """LKJ prior on ``dimension`` × ``dimension`` correlation matrices: density ∝ det(R)^(η-1).

    Lewandowski, Kurowicka & Joe (2009), "Generating random correlation matrices based on vines
    and extended onion method", J. Multivariate Anal. 100, section 3.2.
    """

    support = C.corr_matrix


class Wishart(Distribution):
    """Wishart with ``df`` degrees of freedom and one of scale_matrix, precision_matrix, scale_tril.

    Mean ``df * scale_matrix``; ``df`` must exceed dimension - 1.
    """

    arg_constraints = {
        "df": C.positive,
        "scale_matrix": C.positive_definite,
        "precision_matrix": C.positive_definite,
        "scale_tril": C.lower_cholesky,
    }
    arg_event_dims = {"scale_matrix": 2, "precision_matrix": 2, "scale_tril": 2}
    support = C.positive_definite
    exclusive = ("scale_matrix", "precision_matrix", "scale_tril")

    def __init__(
        self,
        df: Array,
        scale_matrix: Array = None,
        precision_matrix: Array = None,
        scale_tril: Array = None,
    ):
        super().__init__(
            df=df,
            scale_matrix=scale_matrix,
            precision_matrix=precision_matrix,
            scale_tril=scale_tril,
        )

    def _matrix(self) -> Any:
        return next(self.params[k] for k in self.exclusive if k in self.params)

    def _check_relations(self) -> str | None:
        shape = _shape(self._matrix())
        if shape[-1] != shape[-2]:
            return f"the matrix must be square, got shape {shape}."
        df = _concrete(self.params["df"])
        if df is not None and np.any(df <= shape[-1] - 1):
            return f"df must exceed dimension - 1 = {shape[-1] - 1}, got {df.tolist()!r}."
        return None

    @property
    def event_shape(self) -> tuple[int, ...]:
        return _shape(self._matrix())[-2:]
