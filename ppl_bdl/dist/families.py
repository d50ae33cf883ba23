"""Every distribution family of the DSL, by name (kept for ``from ppl_bdl.dist.families import``).

The families live in :mod:`~ppl_bdl.dist.continuous`, :mod:`~ppl_bdl.dist.discrete`,
:mod:`~ppl_bdl.dist.multivariate` and :mod:`~ppl_bdl.dist.special`.

Example
-------
>>> from ppl_bdl.dist.families import FAMILIES
>>> FAMILIES["Normal"](0.0, 1.0)
Normal(loc=0, scale=1)
"""

from __future__ import annotations

from .continuous import (
    Beta,
    Cauchy,
    Chi2,
    Exponential,
    Gamma,
    HalfCauchy,
    HalfNormal,
    HalfStudentT,
    InverseGamma,
    Laplace,
    Logistic,
    LogNormal,
    Normal,
    Pareto,
    StudentT,
    TruncatedNormal,
    Uniform,
    VonMises,
    Weibull,
)
from .discrete import (
    Bernoulli,
    BetaBinomial,
    Binomial,
    Categorical,
    DiscreteUniform,
    GammaPoisson,
    Geometric,
    NegativeBinomial,
    OrderedLogistic,
    Poisson,
    ZeroInflatedPoisson,
)
from .multivariate import (
    LKJ,
    Dirichlet,
    LKJCholesky,
    LowRankMultivariateNormal,
    Multinomial,
    MultivariateNormal,
    Wishart,
)
from .special import Delta, GaussianRandomWalk, ImproperUniform, MixtureSameFamily

#: Family name -> class, for every family of the DSL.
FAMILIES = {
    cls.__name__: cls
    for cls in (
        Normal, HalfNormal, Cauchy, HalfCauchy, StudentT, HalfStudentT, Laplace, Logistic,
        LogNormal, Gamma, InverseGamma, Chi2, Exponential, Weibull, Pareto, Beta, Uniform,
        TruncatedNormal, VonMises, Bernoulli, Binomial, Categorical, Poisson, NegativeBinomial,
        GammaPoisson, ZeroInflatedPoisson, BetaBinomial, Geometric, DiscreteUniform,
        OrderedLogistic, Dirichlet, MultivariateNormal, LowRankMultivariateNormal, Multinomial,
        LKJCholesky, LKJ, Wishart, ImproperUniform, Delta, GaussianRandomWalk, MixtureSameFamily,
    )
}  # fmt: skip

__all__ = sorted(FAMILIES) + ["FAMILIES"]
