"""The Pyro backend's distributions: neutral specs to native ``pyro.distributions``.

Pyro has no DiscreteUniform, TruncatedNormal or GaussianRandomWalk, and torch's LKJ sampler is
biased for d >= 3: those come from :mod:`ppl_bdl.backends.pyro.families`, built from torch pieces
to match NumPyro's.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as pd
import torch
from torch.distributions import biject_to as _biject_to
from torch.distributions import constraints as tc
from torch.distributions.mixture_same_family import MixtureSameFamilyConstraint
from torch.distributions.transforms import IndependentTransform, identity_transform

from ppl_bdl.backends.pyro import families as extra
from ppl_bdl.backends.pyro.values import plain
from ppl_bdl.errors import DistributionError

Tensor = torch.Tensor


def _folded_student_t(df, scale=1.0):
    return pd.FoldedDistribution(
        pd.StudentT(df, 0.0, scale, validate_args=False), validate_args=False
    )


#: ImproperUniform's supports by name; "interval" and "greater_than" take their bounds.
_SUPPORTS = {
    "real": tc.real,
    "positive": tc.positive,
    "unit_interval": tc.unit_interval,
    "ordered_vector": pd.constraints.ordered_vector,
    "positive_ordered_vector": pd.constraints.positive_ordered_vector,
    "simplex": tc.simplex,
    "corr_cholesky": tc.corr_cholesky,
    "lower_cholesky": tc.lower_cholesky,
    "positive_definite": tc.positive_definite,
    "corr_matrix": pd.constraints.corr_matrix,
    "interval": tc.interval,
    "greater_than": tc.greater_than_eq,
}


def _improper(support="real", shape=(), low=None, high=None):
    native = _SUPPORTS[support]
    bounds = tuple(b for b in (low, high) if b is not None)
    if bounds:
        native = native(*bounds)
    # one value spans ``shape``, as NumPyro's ImproperUniform has it (pyro's
    # positive_ordered_vector says event_dim 0 for its vectors)
    event_dim = 1 if support == "positive_ordered_vector" else native.event_dim
    native = tc.independent(native, len(shape) - event_dim)
    return pd.ImproperUniform(native, torch.Size(), torch.Size(shape))


def _lkj_cholesky(dimension, concentration=1.0):
    return extra.LKJCholesky(dimension, concentration, validate_args=False)


def _lkj(dimension, concentration=1.0):
    return extra.LKJ(dimension, concentration)


def _zero_inflated_poisson(gate, rate=1.0):
    return pd.ZeroInflatedPoisson(rate, gate=gate, validate_args=False)


def _wishart(df, scale_matrix=None, precision_matrix=None, scale_tril=None):
    return pd.Wishart(
        df,
        covariance_matrix=scale_matrix,
        precision_matrix=precision_matrix,
        scale_tril=scale_tril,
        validate_args=False,
    )


def _multinomial(total_count=1, probs=None, logits=None):
    # torch draws one total_count for the whole batch; its log_prob reads the counts themselves.
    counts = np.unique(
        np.asarray(total_count.detach().cpu() if isinstance(total_count, Tensor) else total_count)
    )
    if counts.size != 1:
        raise DistributionError(
            "Multinomial: the pyro backend needs one total_count for the whole batch (torch's "
            f"Multinomial), got {counts.size} different values. Use the numpyro backend, or "
            "split the data by total_count."
        )
    native = pd.Multinomial(int(counts[0]), probs, logits, validate_args=False)
    shape = torch.broadcast_shapes(native.batch_shape, tuple(np.shape(total_count)))
    return native.expand(shape) if shape != native.batch_shape else native


_FAMILIES = {
    "Normal": pd.Normal,
    "HalfNormal": pd.HalfNormal,
    "Cauchy": pd.Cauchy,
    "HalfCauchy": pd.HalfCauchy,
    "StudentT": pd.StudentT,
    "HalfStudentT": _folded_student_t,
    "Laplace": pd.Laplace,
    "Logistic": pd.Logistic,
    "LogNormal": pd.LogNormal,
    "Gamma": pd.Gamma,
    "InverseGamma": pd.InverseGamma,
    "Chi2": pd.Chi2,
    "Beta": pd.Beta,
    "Exponential": pd.Exponential,
    "Weibull": pd.Weibull,
    "Pareto": pd.Pareto,
    "Uniform": pd.Uniform,
    "TruncatedNormal": extra.TruncatedNormal,
    "VonMises": extra.VonMises,
    "ImproperUniform": _improper,
    "Bernoulli": pd.Bernoulli,
    "Binomial": pd.Binomial,
    "Categorical": pd.Categorical,
    "Poisson": pd.Poisson,
    "NegativeBinomial": pd.NegativeBinomial,
    "GammaPoisson": pd.GammaPoisson,
    "ZeroInflatedPoisson": _zero_inflated_poisson,
    "BetaBinomial": pd.BetaBinomial,
    "Geometric": pd.Geometric,
    "DiscreteUniform": extra.DiscreteUniform,
    "OrderedLogistic": pd.OrderedLogistic,
    "Dirichlet": pd.Dirichlet,
    "MultivariateNormal": pd.MultivariateNormal,
    "LowRankMultivariateNormal": pd.LowRankMultivariateNormal,
    "Multinomial": _multinomial,
    "LKJCholesky": _lkj_cholesky,
    "LKJ": _lkj,
    "Wishart": _wishart,
    "Delta": pd.Delta,
    "GaussianRandomWalk": extra.GaussianRandomWalk,
    "MixtureSameFamily": None,  # built below from its nested specs
}
#: Builders that take no ``validate_args`` (they set it themselves).
_NO_VALIDATE_ARG = {
    "HalfStudentT",
    "ImproperUniform",
    "LKJCholesky",
    "LKJ",
    "ZeroInflatedPoisson",
    "Wishart",
    "Multinomial",
}
#: Families whose Python-number parameters must be tensors too (the rest broadcast numbers).
_TENSOR_PARAMS = {
    "Dirichlet",
    "MultivariateNormal",
    "LowRankMultivariateNormal",
    "Categorical",
    "Multinomial",
    "OrderedLogistic",
    "Delta",
    "LKJCholesky",
    "LKJ",
    "Wishart",
    "VonMises",
}
#: Parameters that stay Python values (sizes, flags).
_STATIC = {"dimension", "num_steps", "event_dim", "support", "shape"}
#: Counts that torch wants as floats when they are arrays (lgamma has no integer kernel).
_COUNTS = {"total_count"}
_IDENTITY_SUPPORTS = (tc.real, tc.real_vector)


def _param(spec, key, value, asarray):
    if key in _STATIC or isinstance(value, str):
        return value
    if isinstance(value, Tensor):
        value = plain(value)  # torch's own code needs no model-tensor hook
        # floats to the fit's precision (a float32 latent times a NumPy float64 constant is
        # float64 in torch); integer counts to floats (torch's lgamma has no integer kernel)
        if value.is_floating_point() or key in _COUNTS:
            return asarray(value if value.is_floating_point() else value.double())
        return value
    if isinstance(value, float | int) and not isinstance(value, bool):
        if spec.name not in _TENSOR_PARAMS or (key in _COUNTS and isinstance(value, int)):
            return value
    if key in _COUNTS:
        return asarray(np.asarray(value, dtype=float))
    return asarray(value)


def native_distribution(spec, asarray):
    """The native Pyro distribution of a neutral spec (``asarray`` converts parameters)."""
    if spec.name == "MixtureSameFamily":
        return pd.MixtureSameFamily(
            native_distribution(spec.params["mixing_distribution"], asarray),
            native_distribution(spec.params["component_distribution"], asarray),
            validate_args=False,
        )
    if spec.name in _RESHAPED:
        return _reshaped(spec, asarray)
    if spec.name == "TransformedDistribution":
        return pd.TransformedDistribution(
            native_distribution(spec.params["base_distribution"], asarray),
            [native_transform(t, asarray) for t in spec.params["transforms"]],
            validate_args=False,
        )
    params = {k: _param(spec, k, v, asarray) for k, v in spec.params.items()}
    if spec.name in _NO_VALIDATE_ARG:
        return _FAMILIES[spec.name](**params)
    return _FAMILIES[spec.name](**params, validate_args=False)


_TRANSFORMS = {
    "ExpTransform": pd.transforms.ExpTransform,
    "SigmoidTransform": pd.transforms.SigmoidTransform,
    "AffineTransform": pd.transforms.AffineTransform,
    "OrderedTransform": pd.transforms.OrderedTransform,
    "StickBreakingTransform": pd.transforms.StickBreakingTransform,
    "LowerCholeskyTransform": extra.LowerCholeskyTransform,  # NumPyro's layout, a bijection
    "CorrCholeskyTransform": pd.transforms.CorrCholeskyTransform,
}


def native_transform(spec, asarray):
    """Pyro's transform of a :mod:`ppl_bdl.dsl.dist.transforms` spec."""
    params = {
        k: v if isinstance(v, int | float) else asarray(plain(v) if isinstance(v, Tensor) else v)
        for k, v in spec.params.items()
    }
    return _TRANSFORMS[spec.name](**params)


#: The DSL's reshaped specs (``expand``, ``to_event``, ``mask``): Pyro's own methods.
_RESHAPED = frozenset({"ExpandedDistribution", "Independent", "MaskedDistribution"})


def _reshaped(spec, asarray):
    base = native_distribution(spec.params["base_dist"], asarray)
    if spec.name == "ExpandedDistribution":
        return expand(base, spec.params["batch_shape"], 0)
    if spec.name == "Independent":
        return base.to_event(spec.params["reinterpreted_batch_ndims"])
    mask = spec.params["mask"]
    if isinstance(mask, bool | np.bool_):
        return base.mask(bool(mask))
    mask = plain(mask) if isinstance(mask, Tensor) else asarray(np.asarray(mask))
    return base.mask(mask.bool())


def observed_value(spec, value, float_dtype):
    """``value`` (valid values of any numeric dtype) as a tensor that ``spec``'s family takes.

    torch's densities compute on floats (Bernoulli's BCE, Binomial's lgamma, ...): integer and
    boolean values become ``float_dtype``; Categorical labels accept floats (torch casts them).
    """
    if not isinstance(value, Tensor):
        value = torch.as_tensor(np.asarray(value))
    return value if value.is_floating_point() else value.to(float_dtype)


def expand(native, batch_shape, event_ndims: int):
    batch_shape = torch.Size(batch_shape)
    if native.batch_shape != batch_shape:
        try:
            native = native.expand(batch_shape)
        except NotImplementedError:  # e.g. pyro's LKJ (a subclass without its own expand)
            native = pd.torch_distribution.ExpandedDistribution(native, batch_shape)
    return native.to_event(event_ndims) if event_ndims else native


def biject_to(support):
    """The bijection from R^k onto ``support``, or None for the identity."""
    if support in _IDENTITY_SUPPORTS:
        return None
    if isinstance(support, MixtureSameFamilyConstraint):  # a mixture's values: its components'
        support = support.base_constraint
    if isinstance(support, tc.independent):
        inner = biject_to(support.base_constraint)
        n = support.reinterpreted_batch_ndims
        if inner is None or n == 0:
            return inner
        return IndependentTransform(inner, n)
    if support is tc.positive_definite:  # torch registers none (a latent Wishart)
        return extra.PositiveDefiniteTransform()
    if support is tc.lower_cholesky:  # torch's LowerCholeskyTransform is not a bijection
        return extra.LowerCholeskyTransform()
    transform = _biject_to(support)
    return None if transform is identity_transform else transform
