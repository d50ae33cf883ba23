"""Continuous univariate families: on the real line, the positive reals, or an interval.

Parameter names follow PyTorch / NumPyro; each backend maps a family to its native class.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> dist.Normal(0.0, 1.0)
Normal(loc=0, scale=1)
>>> dist.Normal(0.0, -1.0)
Traceback (most recent call last):
...
ppl_bdl.errors.DistributionError: Normal: parameter 'scale' must be a number > 0, got -1.
>>> dist.TruncatedNormal(0.0, 1.0, low=0.0).log_prob(np.array([-0.5, 0.5])).round(4)
array([   -inf, -0.3508])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution, _concrete

Array = Any


class Normal(Distribution):
    """Gaussian N(loc, scale²) on the real line."""

    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class HalfNormal(Distribution):
    """``|N(0, scale²)|`` on the positive reals."""

    arg_constraints = {"scale": C.positive}
    support = C.positive

    def __init__(self, scale: Array = 1.0):
        super().__init__(scale=scale)


class Cauchy(Distribution):
    """Cauchy with location ``loc`` and scale ``scale``."""

    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class HalfCauchy(Distribution):
    """``|Cauchy(0, scale)|`` on the positive reals."""

    arg_constraints = {"scale": C.positive}
    support = C.positive

    def __init__(self, scale: Array = 1.0):
        super().__init__(scale=scale)


class StudentT(Distribution):
    """Student's t with ``df`` degrees of freedom, location ``loc`` and scale ``scale``."""

    arg_constraints = {"df": C.positive, "loc": C.real, "scale": C.positive}

    def __init__(self, df: Array, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(df=df, loc=loc, scale=scale)


class HalfStudentT(Distribution):
    """``|StudentT(df, 0, scale)|`` on the positive reals (Stan's ``student_t`` with ``<lower=0>``)."""

    arg_constraints = {"df": C.positive, "scale": C.positive}
    support = C.positive

    def __init__(self, df: Array, scale: Array = 1.0):
        super().__init__(df=df, scale=scale)


class Laplace(Distribution):
    """Laplace (double exponential) with location ``loc`` and scale ``scale``."""

    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class Logistic(Distribution):
    """Logistic with location ``loc`` and scale ``scale`` (CDF sigmoid((x - loc) / scale))."""

    arg_constraints = {"loc": C.real, "scale": C.positive}

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0):
        super().__init__(loc=loc, scale=scale)


class LogNormal(Distribution):
    """exp(N(loc, scale²)) on the positive reals."""

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
    """1 / Gamma(concentration, rate) on the positive reals."""

    arg_constraints = {"concentration": C.positive, "rate": C.positive}
    support = C.positive

    def __init__(self, concentration: Array, rate: Array = 1.0):
        super().__init__(concentration=concentration, rate=rate)


class Chi2(Distribution):
    """Chi-squared with ``df`` degrees of freedom (Gamma(df / 2, 1 / 2))."""

    arg_constraints = {"df": C.positive}
    support = C.positive

    def __init__(self, df: Array):
        super().__init__(df=df)


class Exponential(Distribution):
    """Exponential with ``rate`` (mean 1 / rate)."""

    arg_constraints = {"rate": C.positive}
    support = C.positive

    def __init__(self, rate: Array = 1.0):
        super().__init__(rate=rate)


class Weibull(Distribution):
    """Weibull with ``scale`` and shape ``concentration``: CDF 1 - exp(-(x / scale)^concentration)."""

    arg_constraints = {"scale": C.positive, "concentration": C.positive}
    support = C.positive

    def __init__(self, scale: Array, concentration: Array):
        super().__init__(scale=scale, concentration=concentration)


class Pareto(Distribution):
    """Pareto (type I) with minimum ``scale`` and tail index ``alpha``; support x >= scale."""

    arg_constraints = {"scale": C.positive, "alpha": C.positive}
    support = C.greater_than

    def __init__(self, scale: Array, alpha: Array):
        super().__init__(scale=scale, alpha=alpha)

    def support_for(self, to_numpy=None) -> C.Constraint:
        bounds = self._numpy_params(to_numpy, "scale")
        return self.support if bounds is None else C.at_least(bounds[0])


class Beta(Distribution):
    """Beta on the open interval (0, 1), with ``concentration1`` (α) and ``concentration0`` (β).

    0 and 1 are outside its support: the density there is 0 or infinite, so an observation of
    exactly 0 or 1 is a data error.
    """

    arg_constraints = {"concentration1": C.positive, "concentration0": C.positive}
    support = C.open_unit_interval

    def __init__(self, concentration1: Array, concentration0: Array):
        super().__init__(concentration1=concentration1, concentration0=concentration0)


def _less(low: Any, high: Any) -> str | None:
    low, high = _concrete(low), _concrete(high)
    if low is not None and high is not None and np.any(low >= high):
        return f"needs low < high, got low={low.tolist()!r}, high={high.tolist()!r}."
    return None


class Uniform(Distribution):
    """Uniform on [low, high]; its support depends on the parameters."""

    arg_constraints = {"low": C.real, "high": C.real}
    support = C.interval

    def __init__(self, low: Array = 0.0, high: Array = 1.0):
        super().__init__(low=low, high=high)

    def _check_relations(self) -> str | None:
        return _less(self.params["low"], self.params["high"])

    def support_for(self, to_numpy=None) -> C.Constraint:
        bounds = self._numpy_params(to_numpy, "low", "high")
        return self.support if bounds is None else C.between(*bounds)


class TruncatedNormal(Distribution):
    """N(loc, scale²) restricted to [low, high]; give ``low``, ``high`` or both.

    ``loc`` and ``scale`` are those of the untruncated normal (as in NumPyro), not the mean and
    standard deviation of the truncated one.
    """

    arg_constraints = {"loc": C.real, "scale": C.positive, "low": C.real, "high": C.real}
    support = C.interval

    def __init__(self, loc: Array = 0.0, scale: Array = 1.0, low: Array = None, high: Array = None):
        super().__init__(loc=loc, scale=scale, low=low, high=high)

    def _check_relations(self) -> str | None:
        if "low" not in self.params and "high" not in self.params:
            return "give low, high or both (without bounds, use Normal)."
        if "low" in self.params and "high" in self.params:
            return _less(self.params["low"], self.params["high"])
        return None

    def support_for(self, to_numpy=None) -> C.Constraint:
        keys = [k for k in ("low", "high") if k in self.params]
        bounds = self._numpy_params(to_numpy, *keys)
        if bounds is None:
            return self.support
        if len(keys) == 2:
            return C.between(*bounds)
        return C.at_least(bounds[0]) if keys == ["low"] else C.at_most(bounds[0])


class VonMises(Distribution):
    """Von Mises (circular normal) with mean angle ``loc`` and ``concentration`` κ.

    Its support is the circle, written as angles in [-pi, pi]: wrap other angles first, e.g.
    ``(x + np.pi) % (2 * np.pi) - np.pi``.
    """

    arg_constraints = {"loc": C.real, "concentration": C.positive}
    support = C.circular

    def __init__(self, loc: Array, concentration: Array):
        super().__init__(loc=loc, concentration=concentration)
