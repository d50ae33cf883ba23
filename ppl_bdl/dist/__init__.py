"""Backend-neutral distributions for the DSL.

Example
-------
>>> from ppl_bdl import dist
>>> prior = dist.Normal(0.0, 1.0)
>>> likelihood = dist.Categorical(logits=[0.0, 1.0, 2.0])
"""

from . import constraints
from .base import Distribution
from .families import (
    Bernoulli,
    Beta,
    Binomial,
    Categorical,
    Cauchy,
    Dirichlet,
    Exponential,
    Gamma,
    HalfCauchy,
    HalfNormal,
    HalfStudentT,
    ImproperUniform,
    InverseGamma,
    Laplace,
    LKJCholesky,
    LogNormal,
    MultivariateNormal,
    Normal,
    Poisson,
    StudentT,
    Uniform,
)

__all__ = [
    "Bernoulli",
    "Beta",
    "Binomial",
    "Categorical",
    "Cauchy",
    "Dirichlet",
    "Distribution",
    "Exponential",
    "Gamma",
    "HalfCauchy",
    "HalfNormal",
    "HalfStudentT",
    "ImproperUniform",
    "InverseGamma",
    "LKJCholesky",
    "Laplace",
    "LogNormal",
    "MultivariateNormal",
    "Normal",
    "Poisson",
    "StudentT",
    "Uniform",
    "constraints",
]
