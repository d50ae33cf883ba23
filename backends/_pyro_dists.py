"""The Pyro backend's distributions: neutral specs to native ``pyro.distributions``."""

from __future__ import annotations

import pyro.distributions as pd
import torch
from torch.distributions import biject_to as _biject_to
from torch.distributions import constraints as tc
from torch.distributions.transforms import identity_transform

from ._torch_math import _t

Tensor = torch.Tensor


def _folded_student_t(df, scale=1.0):
    return pd.FoldedDistribution(
        pd.StudentT(df, 0.0, scale, validate_args=False), validate_args=False
    )


def _improper(support="real"):
    return pd.ImproperUniform(
        tc.real if support == "real" else tc.positive, torch.Size(), torch.Size()
    )


def _lkj(dimension, concentration=1.0):
    return pd.LKJCholesky(dimension, _t(concentration), validate_args=False)


_FAMILIES = {
    "Normal": pd.Normal,
    "HalfNormal": pd.HalfNormal,
    "Cauchy": pd.Cauchy,
    "HalfCauchy": pd.HalfCauchy,
    "StudentT": pd.StudentT,
    "HalfStudentT": _folded_student_t,
    "Laplace": pd.Laplace,
    "LogNormal": pd.LogNormal,
    "Gamma": pd.Gamma,
    "InverseGamma": pd.InverseGamma,
    "Beta": pd.Beta,
    "Exponential": pd.Exponential,
    "Uniform": pd.Uniform,
    "ImproperUniform": _improper,
    "Bernoulli": pd.Bernoulli,
    "Binomial": pd.Binomial,
    "Categorical": pd.Categorical,
    "Poisson": pd.Poisson,
    "Dirichlet": pd.Dirichlet,
    "MultivariateNormal": pd.MultivariateNormal,
    "LKJCholesky": _lkj,
}
_NO_VALIDATE_ARG = {"HalfStudentT", "ImproperUniform", "LKJCholesky"}
_TENSOR_PARAMS = {"Dirichlet", "MultivariateNormal", "Categorical"}
_IDENTITY_SUPPORTS = (tc.real, tc.real_vector)


def native_distribution(spec, asarray):
    """The native Pyro distribution of a neutral spec (``asarray`` converts parameters)."""
    params = spec.params
    if spec.name in _TENSOR_PARAMS or any(
        not isinstance(v, Tensor | float | int | str) for v in params.values()
    ):
        params = {
            k: v
            if isinstance(v, Tensor | str)
            or (isinstance(v, int) and k in ("dimension", "total_count"))
            else asarray(v)
            for k, v in params.items()
        }
    if spec.name in _NO_VALIDATE_ARG:
        return _FAMILIES[spec.name](**params)
    return _FAMILIES[spec.name](**params, validate_args=False)


def expand(native, batch_shape, event_ndims: int):
    batch_shape = torch.Size(batch_shape)
    if native.batch_shape != batch_shape:
        native = native.expand(batch_shape)
    return native.to_event(event_ndims) if event_ndims else native


def biject_to(support):
    """The bijection from R^k onto ``support``, or None for the identity."""
    if support in _IDENTITY_SUPPORTS:
        return None
    transform = _biject_to(support)
    return None if transform is identity_transform else transform
