"""The distribution families of the DSL, as backend-neutral specs.

Parameter names follow PyTorch / NumPyro. Each backend maps a family to its native class.

Example
-------
>>> from ppl_bdl import dist
>>> dist.Normal(0.0, 1.0)
Normal(loc=0, scale=1)
>>> dist.Normal(0.0, -1.0)
Traceback (most recent call last):
...
ppl_bdl.errors.DistributionError: Normal: parameter 'scale' must be a number > 0, got -1.0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import constraints as C
from .base import Distribution, _concrete

Array = Any


class Normal(Distribution):
    """Gaussian N(loc, scale²)."""

    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class HalfNormal(Distribution):
    """|N(0, scale²)| on the positive reals."""

    arg_constraints = {"scale": C.positive}
    support = C.positive

    def __init__(self, scale: Array = 1.0):
        super().__init__(scale=scale)


class Cauchy(Distribution):
    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class HalfCauchy(Distribution):
    arg_constraints = {"scale": C.positive}
    support = C.positive

    def __init__(self, scale: Array = 1.0):
        super().__init__(scale=scale)


class StudentT(Distribution):
    arg_constraints = {"df": C.positive, "loc": C.real, "scale": C.positive}

    def __init__(self, df: Array, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(df=df, loc=loc, scale=scale)


class HalfStudentT(Distribution):
    """|StudentT(df, 0, scale)| on the positive reals (Stan's ``student_t`` with ``<lower=0>``)."""

    arg_constraints = {"df": C.positive, "scale": C.positive}
    support = C.positive

    def __init__(self, df: Array, scale: Array = 1.0):
        super().__init__(df=df, scale=scale)


class Laplace(Distribution):
    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class LogNormal(Distribution):
    arg_constraints = {"loc": C.real, "scale": C.positive}
    support = C.positive

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class Gamma(Distribution):
    """Gamma with shape ``concentration`` and ``rate`` (mean concentration / rate)."""

    arg_constraints = {"concentration": C.positive, "rate": C.positive}
    support = C.positive

    def __init__(self, concentration: Array, rate: Array = 1.0):
        super().__init__(concentration=concentration, rate=rate)


class InverseGamma(Distribution):
    arg_constraints = {"concentration": C.positive, "rate": C.positive}
    support = C.positive

    def __init__(self, concentration: Array, rate: Array = 1.0):
        super().__init__(concentration=concentration, rate=rate)


class Beta(Distribution):
    arg_constraints = {"concentration1": C.positive, "concentration0": C.positive}
    support = C.unit_interval

    def __init__(self, concentration1: Array, concentration0: Array):
        super().__init__(concentration1=concentration1, concentration0=concentration0)


class Exponential(Distribution):
    arg_constraints = {"rate": C.positive}
    support = C.positive

    def __init__(self, rate: Array = 1.0):
        super().__init__(rate=rate)


class Uniform(Distribution):
    """Uniform on [low, high]; its support depends on the parameters."""

    arg_constraints = {"low": C.real, "high": C.real}
    support = C.interval

    def __init__(self, low: Array = 0.0, high: Array = 1.0):
        super().__init__(low=low, high=high)

    def _check_relations(self) -> str | None:
        low, high = _concrete(self.params["low"]), _concrete(self.params["high"])
        if low is not None and high is not None and np.any(low >= high):
            return (
                f"needs low < high, got low={self.params['low']!r}, high={self.params['high']!r}."
            )
        return None


class ImproperUniform(Distribution):
    """A flat (improper) prior on ``support`` ("real" or "positive"); give the shape at ``sample``.

    Its log density is 0: use it for flat priors, and never for prior predictive draws.
    """

    def __init__(self, support: str = "real"):
        if support not in ("real", "positive"):
            from ..errors import DistributionError

            raise DistributionError(
                f"ImproperUniform: support must be 'real' or 'positive', got {support!r}."
            )
        super().__init__()
        self.support = C.real if support == "real" else C.positive
        self.params = {"support": support}


class Bernoulli(Distribution):
    """Bernoulli with ``probs`` or ``logits`` (exactly one)."""

    arg_constraints = {"probs": C.unit_interval, "logits": C.real}
    support = C.boolean
    exclusive = ("probs", "logits")

    def __init__(self, probs: Array = None, logits: Array = None):
        super().__init__(probs=probs, logits=logits)


class Binomial(Distribution):
    arg_constraints = {
        "total_count": C.nonnegative_integer,
        "probs": C.unit_interval,
        "logits": C.real,
    }
    support = C.integer_interval
    exclusive = ("probs", "logits")

    def __init__(self, total_count: Array = 1, probs: Array = None, logits: Array = None):
        super().__init__(total_count=total_count, probs=probs, logits=logits)


class Categorical(Distribution):
    """Categorical over the last axis of ``probs`` or ``logits`` (exactly one)."""

    arg_constraints = {"probs": C.simplex, "logits": C.real_vector}
    arg_event_dims = {"probs": 1, "logits": 1}
    support = C.integer_interval
    exclusive = ("probs", "logits")

    def __init__(self, probs: Array = None, logits: Array = None):
        super().__init__(probs=probs, logits=logits)


class Poisson(Distribution):
    arg_constraints = {"rate": C.positive}
    support = C.nonnegative_integer

    def __init__(self, rate: Array):
        super().__init__(rate=rate)


class Dirichlet(Distribution):
    arg_constraints = {"concentration": C.positive}
    arg_event_dims = {"concentration": 1}
    support = C.simplex

    def __init__(self, concentration: Array):
        super().__init__(concentration=concentration)


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


class LKJCholesky(Distribution):
    """LKJ prior on the Cholesky factor of a ``dimension`` × ``dimension`` correlation matrix."""

    arg_constraints = {"concentration": C.positive}
    support = C.corr_cholesky

    def __init__(self, dimension: int, concentration: Array = 1.0):
        if not isinstance(dimension, int) or dimension < 2:
            from ..errors import DistributionError

            raise DistributionError(
                f"LKJCholesky: dimension must be an int >= 2, got {dimension!r}."
            )
        super().__init__(concentration=concentration)
        self.params["dimension"] = dimension
