"""The NumPyro backend's distributions: neutral specs to native ``numpyro.distributions``."""

from __future__ import annotations

import numpyro.distributions as nd
from numpyro.distributions import constraints as ndc
from numpyro.distributions.transforms import IdentityTransform
from numpyro.distributions.transforms import biject_to as _biject_to


def _folded_student_t(df, scale=1.0, validate_args=None):
    base = nd.StudentT(df, 0.0, scale, validate_args=validate_args)
    return nd.FoldedDistribution(base, validate_args=validate_args)


def _improper(support="real", validate_args=None):
    support = ndc.real if support == "real" else ndc.positive
    return nd.ImproperUniform(support, (), (), validate_args=validate_args)


_FAMILIES = {
    "Normal": nd.Normal,
    "HalfNormal": nd.HalfNormal,
    "Cauchy": nd.Cauchy,
    "HalfCauchy": nd.HalfCauchy,
    "StudentT": nd.StudentT,
    "HalfStudentT": _folded_student_t,
    "Laplace": nd.Laplace,
    "LogNormal": nd.LogNormal,
    "Gamma": nd.Gamma,
    "InverseGamma": nd.InverseGamma,
    "Beta": nd.Beta,
    "Exponential": nd.Exponential,
    "Uniform": nd.Uniform,
    "ImproperUniform": _improper,
    "Bernoulli": nd.Bernoulli,
    "Binomial": nd.Binomial,
    "Categorical": nd.Categorical,
    "Poisson": nd.Poisson,
    "Dirichlet": nd.Dirichlet,
    "MultivariateNormal": nd.MultivariateNormal,
    "LKJCholesky": nd.LKJCholesky,
}

_IDENTITY_SUPPORTS = (ndc.real, ndc.real_vector)


def native_distribution(spec):
    """The native NumPyro distribution of a neutral spec.

    No NumPyro argument validation (on by default in NumPyro): the core validates a model's
    parameters and observed values once, by site; in the compiled steps the support mask it adds
    to every log-density is pure cost.
    """
    return _FAMILIES[spec.name](**spec.params, validate_args=False)


def expand(native, batch_shape, event_ndims: int):
    batch_shape = tuple(batch_shape)
    if tuple(native.batch_shape) != batch_shape:
        native = native.expand(batch_shape)
    return native.to_event(event_ndims) if event_ndims else native


def biject_to(support):
    """The bijection from R^k onto ``support``, or None for the identity."""
    if support in _IDENTITY_SUPPORTS:
        return None
    transform = _biject_to(support)
    return None if isinstance(transform, IdentityTransform) else transform
