"""Every distribution family of the DSL, by name (kept for ``from ppl_bdl.dsl.dist.families import``).

The families live in :mod:`~ppl_bdl.dsl.dist.continuous`, :mod:`~ppl_bdl.dsl.dist.discrete`,
:mod:`~ppl_bdl.dsl.dist.multivariate` and :mod:`~ppl_bdl.dsl.dist.special`.

Example
-------
>>> from ppl_bdl.dsl.dist.families import FAMILIES
>>> FAMILIES["Normal"](0.0, 1.0)
Normal(loc=0, scale=1)
"""

from __future__ import annotations

from ppl_bdl.dsl.dist.continuous import (
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
from ppl_bdl.dsl.dist.discrete import (
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
from ppl_bdl.dsl.dist.multivariate import (
    LKJ,
    Dirichlet,
    LKJCholesky,
    LowRankMultivariateNormal,
    Multinomial,
    MultivariateNormal,
    Wishart,
)
from ppl_bdl.dsl.dist.special import Delta, GaussianRandomWalk, ImproperUniform, MixtureSameFamily

#: Family name -> class, for every family of the DSL.
FAMILIES = {
    cls.__name__: cls
    for cls in (
        Normal,
        HalfNormal,
        Cauchy,
        HalfCauchy,
        StudentT,
        HalfStudentT,
        Laplace,
        Logistic,
        LogNormal,
        Gamma,
        InverseGamma,
        Chi2,
        Exponential,
        Weibull,
        Pareto,
        Beta,
        Uniform,
        TruncatedNormal,
        VonMises,
        Bernoulli,
        Binomial,
        Categorical,
        Poisson,
        NegativeBinomial,
        GammaPoisson,
        ZeroInflatedPoisson,
        BetaBinomial,
        Geometric,
        DiscreteUniform,
        OrderedLogistic,
        Dirichlet,
        MultivariateNormal,
        LowRankMultivariateNormal,
        Multinomial,
        LKJCholesky,
        LKJ,
        Wishart,
        ImproperUniform,
        Delta,
        GaussianRandomWalk,
        MixtureSameFamily,
    )
}

__all__ = sorted(FAMILIES) + ["FAMILIES"]
