"""Discrete univariate families: labels, binary outcomes and counts.

Their values are integers; observed values may be stored with any numeric dtype (bool, int or
float holding whole numbers): each backend converts them to what its native family needs.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> dist.NegativeBinomial(3.0, probs=0.4).log_prob(np.array([0, 2])).round(4)
array([-1.5325, -1.5733])
>>> dist.Binomial(5, probs=0.5).support_violation(np.array([2, 7]))
'holds 7 at index (1,), outside the support of Binomial: an integer in [0, 5]'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution, _concrete, _shape

Array = Any


class Bernoulli(Distribution):
    """Bernoulli with ``probs`` or ``logits`` (exactly one); values 0 or 1."""

    arg_constraints = {"probs": C.unit_interval, "logits": C.real}
    support = C.boolean
    exclusive = ("probs", "logits")

    def __init__(self, probs: Array = None, logits: Array = None):
        super().__init__(probs=probs, logits=logits)


def _up_to_total_count(spec: Distribution, to_numpy) -> C.Constraint:
    bounds = spec._numpy_params(to_numpy, "total_count")
    return spec.support if bounds is None else C.between(0, bounds[0], integer=True)


class Binomial(Distribution):
    """Successes in ``total_count`` trials of probability ``probs`` (or ``logits``)."""

    arg_constraints = {
        "total_count": C.nonnegative_integer,
        "probs": C.unit_interval,
        "logits": C.real,
    }
    support = C.integer_interval
    exclusive = ("probs", "logits")

    def __init__(self, total_count: Array = 1, probs: Array = None, logits: Array = None):
        super().__init__(total_count=total_count, probs=probs, logits=logits)

    def support_for(self, to_numpy=None) -> C.Constraint:
        return _up_to_total_count(self, to_numpy)


class Categorical(Distribution):
    """Categorical over the last axis of ``probs`` or ``logits`` (exactly one): labels 0..K-1."""

    arg_constraints = {"probs": C.simplex, "logits": C.real_vector}
    arg_event_dims = {"probs": 1, "logits": 1}
    support = C.integer_interval
    exclusive = ("probs", "logits")

    def __init__(self, probs: Array = None, logits: Array = None):
        super().__init__(probs=probs, logits=logits)

    @property
    def num_categories(self) -> int:
        given = self.params.get("probs", self.params.get("logits"))
        return int(_shape(given)[-1])

    def support_for(self, to_numpy=None) -> C.Constraint:
        return C.between(0, self.num_categories - 1, integer=True)


class Poisson(Distribution):
    """Poisson counts with mean ``rate``."""

    arg_constraints = {"rate": C.positive}
    support = C.nonnegative_integer

    def __init__(self, rate: Array):
        super().__init__(rate=rate)


class NegativeBinomial(Distribution):
    """Successes before the ``total_count``-th failure, success probability ``probs`` (or ``logits``).

    PyTorch's / NumPyro's parameterisation: mean ``total_count * probs / (1 - probs)``. In SciPy's
    ``nbinom(n, p)`` that is ``n = total_count``, ``p = 1 - probs``. For the mean-dispersion form,
    use :class:`GammaPoisson`.
    """

    arg_constraints = {
        "total_count": C.positive,
        "probs": C.unit_interval_open_right,
        "logits": C.real,
    }
    support = C.nonnegative_integer
    exclusive = ("probs", "logits")

    def __init__(self, total_count: Array, probs: Array = None, logits: Array = None):
        super().__init__(total_count=total_count, probs=probs, logits=logits)


class GammaPoisson(Distribution):
    """Poisson with a Gamma(concentration, rate)-distributed rate (a negative binomial).

    Mean ``concentration / rate``, variance ``mean * (1 + 1 / rate)``.
    """

    arg_constraints = {"concentration": C.positive, "rate": C.positive}
    support = C.nonnegative_integer

    def __init__(self, concentration: Array, rate: Array = 1.0):
        super().__init__(concentration=concentration, rate=rate)


class ZeroInflatedPoisson(Distribution):
    """0 with probability ``gate``, else Poisson(``rate``)."""

    arg_constraints = {"gate": C.unit_interval, "rate": C.positive}
    support = C.nonnegative_integer

    def __init__(self, gate: Array, rate: Array = 1.0):
        super().__init__(gate=gate, rate=rate)


class BetaBinomial(Distribution):
    """Binomial(total_count, p) with p ~ Beta(concentration1, concentration0)."""

    arg_constraints = {
        "concentration1": C.positive,
        "concentration0": C.positive,
        "total_count": C.nonnegative_integer,
    }
    support = C.integer_interval

    def __init__(self, concentration1: Array, concentration0: Array, total_count: Array = 1):
        super().__init__(
            concentration1=concentration1, concentration0=concentration0, total_count=total_count
        )

    def support_for(self, to_numpy=None) -> C.Constraint:
        return _up_to_total_count(self, to_numpy)


class Geometric(Distribution):
    """Failures before the first success, success probability ``probs`` (or ``logits``).

    Values 0, 1, 2, ...; SciPy's ``geom`` counts trials instead (its k is ours plus one).
    """

    arg_constraints = {"probs": C.unit_interval_open_left, "logits": C.real}
    support = C.nonnegative_integer
    exclusive = ("probs", "logits")

    def __init__(self, probs: Array = None, logits: Array = None):
        super().__init__(probs=probs, logits=logits)


class DiscreteUniform(Distribution):
    """Integers low, low + 1, ..., high (both included), equally likely."""

    arg_constraints = {"low": C.integer, "high": C.integer}
    support = C.integer_interval

    def __init__(self, low: Array = 0, high: Array = 1):
        super().__init__(low=low, high=high)

    def _check_relations(self) -> str | None:
        low, high = _concrete(self.params["low"]), _concrete(self.params["high"])
        if low is not None and high is not None and np.any(low > high):
            return f"needs low <= high, got low={low.tolist()!r}, high={high.tolist()!r}."
        return None

    def support_for(self, to_numpy=None) -> C.Constraint:
        bounds = self._numpy_params(to_numpy, "low", "high")
        return self.support if bounds is None else C.between(*bounds, integer=True)


class OrderedLogistic(Distribution):
    """Ordinal labels 0..K from a real ``predictor`` and K increasing ``cutpoints``.

    P(y <= k) = sigmoid(cutpoints[k] - predictor) (the ordered logit model).
    """

    arg_constraints = {"predictor": C.real, "cutpoints": C.ordered_vector}
    arg_event_dims = {"cutpoints": 1}
    support = C.integer_interval

    def __init__(self, predictor: Array, cutpoints: Array):
        super().__init__(predictor=predictor, cutpoints=cutpoints)

    def support_for(self, to_numpy=None) -> C.Constraint:
        return C.between(0, _shape(self.params["cutpoints"])[-1], integer=True)
