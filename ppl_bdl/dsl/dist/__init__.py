"""Backend-neutral distributions for the DSL.

Every family is a spec: parameters (PyTorch / NumPyro names), their domains, ``batch_shape``,
``event_shape`` and ``support``. ``log_prob(value)`` and ``sample(key, shape)`` work inside a
model (on its backend, for ``bdl.factor``) and outside (NumPy in, NumPy out).

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> prior = dist.Normal(0.0, 1.0)
>>> likelihood = dist.Categorical(logits=[0.0, 1.0, 2.0])
>>> dist.Logistic(0.5, 2.0).log_prob(np.array([0.1, 1.0])).shape
(2,)
"""

from ppl_bdl.dsl.dist import constraints, transforms
from ppl_bdl.dsl.dist.base import (
    Distribution,
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)
from ppl_bdl.dsl.dist.families import (
    LKJ,
    Bernoulli,
    Beta,
    BetaBinomial,
    Binomial,
    Categorical,
    Cauchy,
    Chi2,
    Delta,
    Dirichlet,
    DiscreteUniform,
    Exponential,
    Gamma,
    GammaPoisson,
    GaussianRandomWalk,
    Geometric,
    HalfCauchy,
    HalfNormal,
    HalfStudentT,
    ImproperUniform,
    InverseGamma,
    Laplace,
    LKJCholesky,
    Logistic,
    LogNormal,
    LowRankMultivariateNormal,
    MixtureSameFamily,
    Multinomial,
    MultivariateNormal,
    NegativeBinomial,
    Normal,
    OrderedLogistic,
    Pareto,
    Poisson,
    StudentT,
    TruncatedNormal,
    Uniform,
    VonMises,
    Weibull,
    Wishart,
    ZeroInflatedPoisson,
)
from ppl_bdl.dsl.dist.transformed import TransformedDistribution

__all__ = [
    "Bernoulli",
    "Beta",
    "BetaBinomial",
    "Binomial",
    "Categorical",
    "Cauchy",
    "Chi2",
    "Delta",
    "Dirichlet",
    "DiscreteUniform",
    "Distribution",
    "ExpandedDistribution",
    "Exponential",
    "Gamma",
    "GammaPoisson",
    "GaussianRandomWalk",
    "Geometric",
    "HalfCauchy",
    "HalfNormal",
    "HalfStudentT",
    "ImproperUniform",
    "Independent",
    "InverseGamma",
    "LKJ",
    "LKJCholesky",
    "Laplace",
    "LogNormal",
    "Logistic",
    "LowRankMultivariateNormal",
    "MaskedDistribution",
    "MixtureSameFamily",
    "Multinomial",
    "MultivariateNormal",
    "NegativeBinomial",
    "Normal",
    "OrderedLogistic",
    "Pareto",
    "Poisson",
    "StudentT",
    "TransformedDistribution",
    "TruncatedNormal",
    "Uniform",
    "VonMises",
    "Weibull",
    "Wishart",
    "ZeroInflatedPoisson",
    "constraints",
    "transforms",
]
