"""The NumPyro backend's distributions: neutral specs to native ``numpyro.distributions``.

NumPyro has a native class for every family of the DSL; a few need their parameters renamed
(``Wishart``) or their nested specs mapped (``MixtureSameFamily``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as nd
from numpyro.distributions import constraints as ndc
from numpyro.distributions import transforms as ndt
from numpyro.distributions.transforms import IdentityTransform
from numpyro.distributions.transforms import biject_to as _biject_to


def _folded_student_t(df, scale=1.0, validate_args=None):
    base = nd.StudentT(df, 0.0, scale, validate_args=validate_args)
    return nd.FoldedDistribution(base, validate_args=validate_args)


#: ImproperUniform's supports by name; "interval" and "greater_than" take their bounds.
_SUPPORTS = {
    "real": ndc.real,
    "positive": ndc.positive,
    "unit_interval": ndc.unit_interval,
    "ordered_vector": ndc.ordered_vector,
    "positive_ordered_vector": ndc.positive_ordered_vector,
    "simplex": ndc.simplex,
    "corr_cholesky": ndc.corr_cholesky,
    "lower_cholesky": ndc.lower_cholesky,
    "positive_definite": ndc.positive_definite,
    "corr_matrix": ndc.corr_matrix,
    "interval": ndc.interval,
    "greater_than": ndc.greater_than,
}


def _improper(support="real", shape=(), low=None, high=None, validate_args=None):
    support = _SUPPORTS[support]
    bounds = tuple(b for b in (low, high) if b is not None)
    if bounds:
        support = support(*bounds)
    return nd.ImproperUniform(support, (), tuple(shape), validate_args=validate_args)


def _wishart(df, scale_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None):
    return nd.Wishart(
        df,
        scale_matrix=scale_matrix,
        rate_matrix=precision_matrix,
        scale_tril=scale_tril,
        validate_args=validate_args,
    )


def _multinomial(total_count=1, probs=None, logits=None, validate_args=None):
    # Sampling under jit needs a static bound on the counts; it is known when total_count is data.
    try:
        total_count_max = int(np.max(np.asarray(total_count)))
    except Exception:  # a traced total_count: log_prob works, draws need a concrete one
        total_count_max = None
    return nd.Multinomial(
        total_count, probs, logits, total_count_max=total_count_max, validate_args=validate_args
    )


def _mixture(mixing_distribution, component_distribution, validate_args=None):
    return nd.MixtureSameFamily(
        native_distribution(mixing_distribution),
        native_distribution(component_distribution),
        validate_args=validate_args,
    )


def _truncated_normal(loc=0.0, scale=1.0, low=None, high=None, validate_args=None):
    return nd.TruncatedNormal(loc, scale, low=low, high=high, validate_args=validate_args)


_FAMILIES = {
    "Normal": nd.Normal,
    "HalfNormal": nd.HalfNormal,
    "Cauchy": nd.Cauchy,
    "HalfCauchy": nd.HalfCauchy,
    "StudentT": nd.StudentT,
    "HalfStudentT": _folded_student_t,
    "Laplace": nd.Laplace,
    "Logistic": nd.Logistic,
    "LogNormal": nd.LogNormal,
    "Gamma": nd.Gamma,
    "InverseGamma": nd.InverseGamma,
    "Chi2": nd.Chi2,
    "Beta": nd.Beta,
    "Exponential": nd.Exponential,
    "Weibull": nd.Weibull,
    "Pareto": nd.Pareto,
    "Uniform": nd.Uniform,
    "TruncatedNormal": _truncated_normal,
    "VonMises": nd.VonMises,
    "ImproperUniform": _improper,
    "Bernoulli": nd.Bernoulli,
    "Binomial": nd.Binomial,
    "Categorical": nd.Categorical,
    "Poisson": nd.Poisson,
    "NegativeBinomial": nd.NegativeBinomial,
    "GammaPoisson": nd.GammaPoisson,
    "ZeroInflatedPoisson": nd.ZeroInflatedPoisson,
    "BetaBinomial": nd.BetaBinomial,
    "Geometric": nd.Geometric,
    "DiscreteUniform": nd.DiscreteUniform,
    "OrderedLogistic": nd.OrderedLogistic,
    "Dirichlet": nd.Dirichlet,
    "MultivariateNormal": nd.MultivariateNormal,
    "LowRankMultivariateNormal": nd.LowRankMultivariateNormal,
    "Multinomial": _multinomial,
    "LKJCholesky": nd.LKJCholesky,
    "LKJ": nd.LKJ,
    "Wishart": _wishart,
    "Delta": nd.Delta,
    "GaussianRandomWalk": nd.GaussianRandomWalk,
    "MixtureSameFamily": _mixture,
}

_IDENTITY_SUPPORTS = (ndc.real, ndc.real_vector)
#: Families whose values index an array (take_along_axis needs integer indices).
_INDEX_VALUED = frozenset({"Categorical", "OrderedLogistic"})


def native_distribution(spec):
    """The native NumPyro distribution of a neutral spec.

    No NumPyro argument validation (on by default in NumPyro): the core validates a model's
    parameters and observed values once, by site; in the compiled steps the support mask it adds
    to every log-density is pure cost.

    NumPy parameters (and Python lists, which NumPyro's distributions do not take, while torch's
    do) become JAX arrays here, under the caller's precision: a jitted NumPyro
    helper (``jnp.linalg.cholesky`` in ``Wishart``) first called on a NumPy array in float32 and
    later in a ``jax.enable_x64`` scope is otherwise fed a float32 buffer by JAX 0.10's dispatch
    cache and fails (``RuntimeProgramInputMismatch``).
    """
    if spec.name in _RESHAPED:
        return _reshaped(spec)
    if spec.name == "ImproperUniform":  # its shape stays a tuple (not an array)
        return _improper(**spec.params, validate_args=False)
    if spec.name == "TransformedDistribution":
        return nd.TransformedDistribution(
            native_distribution(spec.params["base_distribution"]),
            [native_transform(t) for t in spec.params["transforms"]],
            validate_args=False,
        )
    params = {  # NumPy parameters and Python lists as JAX arrays of the current precision
        k: jnp.asarray(v) if isinstance(v, np.ndarray | list | tuple) else v
        for k, v in spec.params.items()
    }
    # Composite families (HalfNormal, StudentT, ...) build inner distributions without passing
    # validate_args on: switch NumPyro's validation off around them too.
    with numpyro.validation_enabled(False):
        return _FAMILIES[spec.name](**params, validate_args=False)


_TRANSFORMS = {
    "ExpTransform": ndt.ExpTransform,
    "SigmoidTransform": ndt.SigmoidTransform,
    "AffineTransform": ndt.AffineTransform,
    "OrderedTransform": ndt.OrderedTransform,
    "StickBreakingTransform": ndt.StickBreakingTransform,
    "LowerCholeskyTransform": ndt.LowerCholeskyTransform,
    "CorrCholeskyTransform": ndt.CorrCholeskyTransform,
}


def native_transform(spec):
    """NumPyro's transform of a :mod:`ppl_bdl.dsl.dist.transforms` spec."""
    params = {
        k: v if isinstance(v, int | float) else jnp.asarray(v) for k, v in spec.params.items()
    }
    return _TRANSFORMS[spec.name](**params)


#: The DSL's reshaped specs (``expand``, ``to_event``, ``mask``): NumPyro's own methods.
_RESHAPED = frozenset({"ExpandedDistribution", "Independent", "MaskedDistribution"})


def _reshaped(spec):
    base = native_distribution(spec.params["base_dist"])
    if spec.name == "ExpandedDistribution":
        return expand(base, spec.params["batch_shape"], 0)
    if spec.name == "Independent":
        return base.to_event(spec.params["reinterpreted_batch_ndims"])
    mask = spec.params["mask"]
    return base.mask(mask if isinstance(mask, bool) else jnp.asarray(mask, dtype=bool))


def observed_value(spec, value, int_dtype):
    """``value`` (a JAX array of valid values, any numeric dtype) in the dtype ``spec`` needs.

    Labels of index-valued families become integers (float labels crash ``take_along_axis``);
    booleans become numbers. Runs when a step is traced, so it only reads the static dtype.
    """
    dtype = value.dtype
    if _index_valued(spec):
        return value if jnp.issubdtype(dtype, jnp.integer) else value.astype(int_dtype)
    if dtype == jnp.bool_:
        return value.astype(int_dtype if spec.is_discrete else jnp.result_type(float))
    return value


def _index_valued(spec) -> bool:
    if spec.name == "MixtureSameFamily":
        return _index_valued(spec.params["component_distribution"])
    if spec.name in _RESHAPED:
        return _index_valued(spec.params["base_dist"])
    return spec.name in _INDEX_VALUED


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
