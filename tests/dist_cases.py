"""Every family of ``ppl_bdl.dsl.dist`` with parameters, test points and exact answers.

Each case gives the family's log density from SciPy (or a closed form where SciPy has none), and
its mean and variance, for tests/test_dist_families.py. Parameters include batch shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special as sp
from scipy import stats as st

from ppl_bdl import dist


@dataclass
class Case:
    id: str
    make: Callable[..., Any]
    params: dict[str, Any]
    values: np.ndarray
    logpdf: Callable[..., np.ndarray]
    #: (mean, variance) of one draw, elementwise (None: no moment test).
    moments: Callable[..., tuple] | None = None
    #: parameters whose gradient is checked against finite differences of ``logpdf``
    grad: tuple[str, ...] = ()
    value_grad: bool = False
    #: parameters for the moment test, where they differ from ``params``
    moment_params: dict | None = None
    #: a map applied to each draw before its moments are compared (LKJCholesky: L -> L Lᵀ)
    sample_map: Callable | None = None


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _ordered_logistic_probs(predictor, cutpoints):
    cdf = _sig(cutpoints - np.asarray(predictor)[..., None])
    ones = np.ones(cdf.shape[:-1] + (1,))
    return np.diff(np.concatenate([0 * ones, cdf, ones], -1), axis=-1)


def _take(p, k):
    k = np.asarray(k, int)
    p = np.broadcast_to(p, k.shape + p.shape[-1:])
    return np.take_along_axis(p, k[..., None], -1)[..., 0]


def _discrete_moments(p):
    k = np.arange(p.shape[-1])
    mean = (p * k).sum(-1)
    return mean, (p * k**2).sum(-1) - mean**2


def lkj_log_normalizer(d: int, eta: float) -> float:
    """log c_d(η) of the LKJ density det(R)^(η-1) / c_d (Lewandowski, Kurowicka & Joe 2009,
    section 3.2); c_2(η) = 2^(2η-1) B(η, η), c_3(1) = π²/2 (the volume of 3 × 3 correlations)."""
    out = 0.0
    for k in range(1, d):
        b = eta + (d - k - 1) / 2
        out += (2 * eta - 2 + d - k) * (d - k) * np.log(2) + (d - k) * sp.betaln(b, b)
    return out


def _lkj_logpdf(values, dimension, concentration):
    return (concentration - 1) * np.linalg.slogdet(values)[1] - lkj_log_normalizer(
        dimension, concentration
    )


def _lkj_cholesky_logpdf(values, dimension, concentration):
    # R = L Lᵀ has Jacobian Π_{i>=2} L_ii^(d-i+1) (i = 1..d) onto the free entries of R.
    diag = np.log(np.diagonal(values, axis1=-2, axis2=-1))[..., 1:]
    powers = dimension - np.arange(2, dimension + 1) + 2 * concentration - 2
    return (diag * powers).sum(-1) - lkj_log_normalizer(dimension, concentration)


def _lkj_moments(dimension, concentration):
    # off-diagonal r_ij ~ 2 Beta(b, b) - 1 with b = η - 1 + d / 2: mean 0, variance 1 / (2b + 1)
    b = concentration - 1 + dimension / 2
    var = np.full((dimension, dimension), 1 / (2 * b + 1))
    np.fill_diagonal(var, 0.0)
    return np.eye(dimension), var


def _wishart_moments(df, scale_matrix):
    diag = np.diagonal(scale_matrix)
    return df * scale_matrix, df * (scale_matrix**2 + np.outer(diag, diag))


def _grw_logpdf(values, scale, num_steps):
    steps = np.concatenate([values[..., :1], np.diff(values, axis=-1)], -1)
    return st.norm(0, np.asarray(scale)[..., None]).logpdf(steps).sum(-1)


def _mix_logpdf(values, probs, loc, scale):
    comp = st.norm(loc, scale).logpdf(np.asarray(values)[..., None])
    return sp.logsumexp(comp + np.log(probs), axis=-1)


def _mix_moments(probs, loc, scale):
    mean = (probs * loc).sum(-1)
    return mean, (probs * (scale**2 + loc**2)).sum(-1) - mean**2


def _half_t_moments(df, scale):
    mean = 2 * scale * np.sqrt(df / np.pi) * np.exp(sp.gammaln((df + 1) / 2) - sp.gammaln(df / 2))
    mean = mean / (df - 1)
    return mean, scale**2 * df / (df - 2) - mean**2


def _zip_logpdf(values, gate, rate):
    pois = st.poisson(rate).logpmf(values)
    return np.where(values == 0, np.log(gate + (1 - gate) * np.exp(-rate)), np.log1p(-gate) + pois)


def _lowrank_cov(cov_factor, cov_diag):
    return cov_factor @ cov_factor.T + np.diag(cov_diag)


def _mvn_logpdf(values, loc, cov):
    return st.multivariate_normal(loc, cov).logpdf(values)


def _truncnorm(loc, scale, low=-np.inf, high=np.inf):
    return st.truncnorm((low - loc) / scale, (high - loc) / scale, loc, scale)


def _scipy(frozen: Callable, pmf: bool = False):
    """logpdf / moments of a frozen SciPy distribution built from the parameters."""

    def logpdf(values, **p):
        d = frozen(**p)
        return d.logpmf(values) if pmf else d.logpdf(values)

    def moments(**p):
        d = frozen(**p)
        return d.mean(), d.var()

    return logpdf, moments


A = np.array
_corr = A([[1.0, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 1.0]])
_spd = A([[2.0, 0.5], [0.5, 1.0]])
_W = A([[0.5], [-0.3], [0.2]])


def _case(id, make, params, values, frozen=None, pmf=False, logpdf=None, moments=None, **kw):
    if frozen is not None:
        ref_logpdf, ref_moments = _scipy(frozen, pmf)
        logpdf = logpdf or ref_logpdf
        moments = None if moments is False else moments or ref_moments
    return Case(id, make, params, np.asarray(values), logpdf, moments, **kw)


_x = A([[0.3, -1.2], [2.5, 0.1]])  # (2, 2) points for a (2,) batch
_pos = A([[0.3, 1.7], [2.5, 0.6]])
_counts = A([[0, 3], [5, 1]])

CASES = [
    _case(
        "Normal",
        dist.Normal,
        dict(loc=A([0.0, 1.0]), scale=A([1.0, 2.0])),
        _x,
        lambda loc, scale: st.norm(loc, scale),
        grad=("loc", "scale"),
        value_grad=True,
    ),
    _case(
        "HalfNormal",
        dist.HalfNormal,
        dict(scale=A([1.0, 2.0])),
        _pos,
        lambda scale: st.halfnorm(scale=scale),
        grad=("scale",),
        value_grad=True,
    ),
    _case(
        "Cauchy",
        dist.Cauchy,
        dict(loc=A([0.0, 1.0]), scale=A([1.0, 2.0])),
        _x,
        lambda loc, scale: st.cauchy(loc, scale),
        moments=False,
        grad=("loc", "scale"),
    ),
    _case(
        "HalfCauchy",
        dist.HalfCauchy,
        dict(scale=A([1.0, 2.0])),
        _pos,
        lambda scale: st.halfcauchy(scale=scale),
        moments=False,
        grad=("scale",),
    ),
    _case(
        "StudentT",
        dist.StudentT,
        dict(df=A([5.0, 9.0]), loc=A([0.0, 1.0]), scale=1.5),
        _x,
        lambda df, loc, scale: st.t(df, loc, scale),
        grad=("df", "loc", "scale"),
    ),
    _case(
        "HalfStudentT",
        dist.HalfStudentT,
        dict(df=A([5.0, 9.0]), scale=A([1.0, 2.0])),
        _pos,
        logpdf=lambda v, df, scale: np.log(2) + st.t(df, 0, scale).logpdf(v),
        moments=_half_t_moments,
        grad=("df", "scale"),
    ),
    _case(
        "Laplace",
        dist.Laplace,
        dict(loc=A([0.0, 1.0]), scale=A([1.0, 2.0])),
        _x,
        lambda loc, scale: st.laplace(loc, scale),
        grad=("loc", "scale"),
    ),
    _case(
        "Logistic",
        dist.Logistic,
        dict(loc=A([0.5, -1.0]), scale=A([2.0, 0.7])),
        _x,
        lambda loc, scale: st.logistic(loc, scale),
        grad=("loc", "scale"),
        value_grad=True,
    ),
    _case(
        "LogNormal",
        dist.LogNormal,
        dict(loc=A([0.0, 0.5]), scale=A([0.5, 0.3])),
        _pos,
        lambda loc, scale: st.lognorm(s=scale, scale=np.exp(loc)),
        grad=("loc", "scale"),
    ),
    _case(
        "Gamma",
        dist.Gamma,
        dict(concentration=A([2.0, 5.0]), rate=A([1.0, 3.0])),
        _pos,
        lambda concentration, rate: st.gamma(concentration, scale=1 / rate),
        grad=("concentration", "rate"),
    ),
    _case(
        "InverseGamma",
        dist.InverseGamma,
        dict(concentration=A([6.0, 7.0]), rate=2.0),
        _pos,
        lambda concentration, rate: st.invgamma(concentration, scale=rate),
        grad=("concentration", "rate"),
    ),
    _case(
        "Chi2",
        dist.Chi2,
        dict(df=A([3.0, 7.5])),
        _pos,
        lambda df: st.chi2(df),
        grad=("df",),
        value_grad=True,
    ),
    _case(
        "Exponential",
        dist.Exponential,
        dict(rate=A([1.0, 3.0])),
        _pos,
        lambda rate: st.expon(scale=1 / rate),
        grad=("rate",),
    ),
    _case(
        "Weibull",
        dist.Weibull,
        dict(scale=A([1.0, 2.0]), concentration=A([1.5, 3.0])),
        _pos,
        lambda scale, concentration: st.weibull_min(concentration, scale=scale),
        grad=("scale", "concentration"),
        value_grad=True,
    ),
    _case(
        "Pareto",
        dist.Pareto,
        dict(scale=A([0.2, 0.5]), alpha=A([6.0, 9.0])),
        _pos,
        lambda scale, alpha: st.pareto(alpha, scale=scale),
        grad=("scale", "alpha"),
        value_grad=True,
    ),
    _case(
        "Beta",
        dist.Beta,
        dict(concentration1=A([2.0, 0.7]), concentration0=3.0),
        A([[0.2, 0.9], [0.5, 0.05]]),
        lambda concentration1, concentration0: st.beta(concentration1, concentration0),
        grad=("concentration1", "concentration0"),
        value_grad=True,
    ),
    _case(
        "Uniform",
        dist.Uniform,
        dict(low=A([-1.0, 0.0]), high=A([3.0, 2.5])),
        _x[:, ::-1] * 0.5,
        lambda low, high: st.uniform(low, high - low),
    ),
    _case(
        "TruncatedNormal",
        dist.TruncatedNormal,
        dict(loc=A([0.0, 1.0]), scale=A([1.0, 2.0]), low=A([-1.0, 0.5]), high=A([2.0, 3.0])),
        A([[0.3, 0.6], [1.9, 2.9]]),
        _truncnorm,
        grad=("loc", "scale", "low", "high"),
        value_grad=True,
    ),
    _case(
        "TruncatedNormal-low-tail",
        dist.TruncatedNormal,
        dict(loc=A([0.0, 1.0]), scale=A([1.0, 0.5]), low=A([3.0, 1.2])),
        A([[3.1, 1.3], [4.0, 2.5]]),
        _truncnorm,
        grad=("loc", "scale", "low"),
        value_grad=True,
    ),
    _case(
        "TruncatedNormal-high",
        dist.TruncatedNormal,
        dict(loc=0.5, scale=1.5, high=A([0.0, 2.0])),
        A([[-0.3, 1.3], [-4.0, 1.9]]),
        _truncnorm,
        grad=("loc", "scale", "high"),
    ),
    _case(
        "VonMises",
        dist.VonMises,
        dict(loc=A([0.5, -2.0]), concentration=A([2.0, 0.5])),
        A([[0.3, -3.0], [2.5, 1.0]]),
        lambda loc, concentration: st.vonmises(concentration, loc=loc),
        # draws are angles in [-pi, pi]: their linear moments are SciPy's at loc = 0
        moment_params=dict(loc=A([0.0, 0.0]), concentration=A([2.0, 0.5])),
        grad=("loc", "concentration"),
        value_grad=True,
    ),
    _case(
        "Bernoulli-probs",
        dist.Bernoulli,
        dict(probs=A([0.2, 0.7])),
        A([[0, 1], [1, 1]]),
        lambda probs: st.bernoulli(probs),
        pmf=True,
        grad=("probs",),
    ),
    _case(
        "Bernoulli-logits",
        dist.Bernoulli,
        dict(logits=A([-1.0, 2.0])),
        A([[0, 1], [1, 0]]),
        lambda logits: st.bernoulli(_sig(logits)),
        pmf=True,
        grad=("logits",),
    ),
    _case(
        "Binomial",
        dist.Binomial,
        dict(total_count=A([5, 8]), probs=A([0.3, 0.6])),
        _counts,
        lambda total_count, probs: st.binom(total_count, probs),
        pmf=True,
        grad=("probs",),
    ),
    _case(
        "Categorical",
        dist.Categorical,
        dict(probs=A([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])),
        A([[0, 2], [1, 1]]),
        logpdf=lambda v, probs: np.log(_take(probs, v)),
        moments=lambda probs: _discrete_moments(probs),
    ),
    _case(
        "Poisson",
        dist.Poisson,
        dict(rate=A([1.5, 4.0])),
        _counts,
        lambda rate: st.poisson(rate),
        pmf=True,
        grad=("rate",),
    ),
    _case(
        "NegativeBinomial-probs",
        dist.NegativeBinomial,
        dict(total_count=A([3.0, 5.5]), probs=A([0.4, 0.2])),
        _counts,
        lambda total_count, probs: st.nbinom(total_count, 1 - probs),
        pmf=True,
        grad=("total_count", "probs"),
    ),
    _case(
        "NegativeBinomial-logits",
        dist.NegativeBinomial,
        dict(total_count=2.0, logits=A([0.3, -1.0])),
        _counts,
        lambda total_count, logits: st.nbinom(total_count, 1 - _sig(logits)),
        pmf=True,
        grad=("logits",),
    ),
    _case(
        "GammaPoisson",
        dist.GammaPoisson,
        dict(concentration=A([2.0, 4.0]), rate=A([0.5, 2.0])),
        _counts,
        lambda concentration, rate: st.nbinom(concentration, rate / (1 + rate)),
        pmf=True,
        grad=("concentration", "rate"),
    ),
    _case(
        "ZeroInflatedPoisson",
        dist.ZeroInflatedPoisson,
        dict(gate=A([0.3, 0.1]), rate=A([2.0, 5.0])),
        _counts,
        logpdf=_zip_logpdf,
        grad=("gate", "rate"),
        moments=lambda gate, rate: ((1 - gate) * rate, (1 - gate) * rate * (1 + gate * rate)),
    ),
    _case(
        "BetaBinomial",
        dist.BetaBinomial,
        dict(concentration1=A([2.0, 0.5]), concentration0=A([3.0, 1.5]), total_count=A([5, 8])),
        _counts,
        lambda concentration1, concentration0, total_count: st.betabinom(
            total_count, concentration1, concentration0
        ),
        pmf=True,
        grad=("concentration1", "concentration0"),
    ),
    _case(
        "Geometric-probs",
        dist.Geometric,
        dict(probs=A([0.3, 0.6])),
        _counts,
        lambda probs: st.geom(probs, loc=-1),
        pmf=True,
        grad=("probs",),
    ),
    _case(
        "Geometric-logits",
        dist.Geometric,
        dict(logits=A([-0.5, 1.0])),
        _counts,
        lambda logits: st.geom(_sig(logits), loc=-1),
        pmf=True,
        grad=("logits",),
    ),
    _case(
        "DiscreteUniform",
        dist.DiscreteUniform,
        dict(low=A([0, -2]), high=A([5, 3])),
        A([[0, 3], [5, -2]]),
        lambda low, high: st.randint(low, high + 1),
        pmf=True,
    ),
    _case(
        "OrderedLogistic",
        dist.OrderedLogistic,
        dict(predictor=A([0.3, -1.0]), cutpoints=A([-1.0, 0.5, 2.0])),
        A([[0, 3], [2, 1]]),
        logpdf=lambda v, predictor, cutpoints: np.log(
            _take(_ordered_logistic_probs(predictor, cutpoints), v)
        ),
        moments=lambda predictor, cutpoints: _discrete_moments(
            _ordered_logistic_probs(predictor, cutpoints)
        ),
        grad=("predictor", "cutpoints"),
    ),
    _case(
        "Dirichlet",
        dist.Dirichlet,
        dict(concentration=A([2.0, 3.0, 1.5])),
        A([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]),
        logpdf=lambda v, concentration: np.array(
            [st.dirichlet(concentration).logpdf(x) for x in v]
        ),
        moments=lambda concentration: (
            st.dirichlet(concentration).mean(),
            st.dirichlet(concentration).var(),
        ),
        grad=("concentration",),
    ),
    _case(
        "MultivariateNormal",
        dist.MultivariateNormal,
        dict(loc=A([0.5, -1.0]), covariance_matrix=_spd),
        A([[0.1, 0.2], [-1.0, 2.0]]),
        logpdf=lambda v, loc, covariance_matrix: _mvn_logpdf(v, loc, covariance_matrix),
        moments=lambda loc, covariance_matrix: (loc, np.diag(covariance_matrix)),
        grad=("loc",),
        value_grad=True,
    ),
    _case(
        "LowRankMultivariateNormal",
        dist.LowRankMultivariateNormal,
        dict(loc=A([0.5, -1.0, 0.0]), cov_factor=_W, cov_diag=A([1.0, 0.5, 2.0])),
        A([[0.1, 0.2, 0.3], [-1.0, 2.0, 0.5]]),
        logpdf=lambda v, loc, cov_factor, cov_diag: _mvn_logpdf(
            v, loc, _lowrank_cov(cov_factor, cov_diag)
        ),
        moments=lambda loc, cov_factor, cov_diag: (
            loc,
            np.diag(_lowrank_cov(cov_factor, cov_diag)),
        ),
        grad=("loc", "cov_factor", "cov_diag"),
        value_grad=True,
    ),
    _case(
        "Multinomial",
        dist.Multinomial,
        dict(total_count=6, probs=A([0.2, 0.5, 0.3])),
        A([[1, 3, 2], [6, 0, 0]]),
        logpdf=lambda v, total_count, probs: st.multinomial(total_count, probs).logpmf(v),
        moments=lambda total_count, probs: (total_count * probs, total_count * probs * (1 - probs)),
    ),
    _case(
        "LKJCholesky",
        lambda dimension, concentration: dist.LKJCholesky(dimension, concentration),
        dict(dimension=3, concentration=1.7),
        np.linalg.cholesky(_corr)[None],
        logpdf=_lkj_cholesky_logpdf,
        moments=_lkj_moments,
        grad=("concentration",),
        sample_map=lambda L: L @ np.swapaxes(L, -1, -2),
    ),
    _case(
        "LKJ",
        lambda dimension, concentration: dist.LKJ(dimension, concentration),
        dict(dimension=3, concentration=1.7),
        A([_corr, np.eye(3)]),
        logpdf=_lkj_logpdf,
        moments=_lkj_moments,
        grad=("concentration",),
    ),
    _case(
        "Wishart",
        dist.Wishart,
        dict(df=A([4.0, 6.5]), scale_matrix=_spd),
        A([[[1.0, 0.2], [0.2, 3.0]], [[5.0, -1.0], [-1.0, 2.0]]]),
        logpdf=lambda v, df, scale_matrix: np.array(
            [st.wishart(d, scale_matrix).logpdf(x) for d, x in zip(df, v, strict=True)]
        ),
        moments=lambda df, scale_matrix: tuple(
            np.stack(m) for m in zip(*[_wishart_moments(d, scale_matrix) for d in df], strict=True)
        ),
        grad=("df",),
    ),
    _case(
        "Delta",
        lambda v, log_density: dist.Delta(v, log_density),
        dict(v=A([0.5, 2.0]), log_density=A([0.0, -1.5])),
        A([[0.5, 2.0], [0.5, 1.0]]),
        logpdf=lambda values, v, log_density: np.where(values == v, log_density, -np.inf),
        moments=lambda v, log_density: (v, 0 * v),
    ),
    _case(
        "GaussianRandomWalk",
        lambda scale, num_steps: dist.GaussianRandomWalk(scale, num_steps),
        dict(scale=A([0.5, 2.0]), num_steps=4),
        A([[0.1, 0.3, -0.2, 0.5], [1.0, -2.0, 0.0, 3.0]]),
        logpdf=_grw_logpdf,
        moments=lambda scale, num_steps: (
            0 * scale[:, None] * np.ones(num_steps),
            scale[:, None] ** 2 * np.arange(1, num_steps + 1),
        ),
        grad=("scale",),
        value_grad=True,
    ),
    _case(
        "MixtureSameFamily",
        lambda probs, loc, scale: dist.MixtureSameFamily(
            dist.Categorical(probs=probs), dist.Normal(loc, scale)
        ),
        dict(probs=A([0.3, 0.7]), loc=A([-1.0, 2.0]), scale=A([0.5, 1.0])),
        A([0.3, -1.0, 2.5]),
        logpdf=_mix_logpdf,
        moments=_mix_moments,
        grad=("loc", "scale"),
        value_grad=True,
    ),
    _case(
        "ImproperUniform",
        lambda support: dist.ImproperUniform(support),
        dict(support="positive"),
        A([0.5, 3.0]),
        logpdf=lambda v, support: 0 * v,
        moments=None,
    ),
]

#: The families this suite added (the issue's list); the default suite checks their draws and
#: gradients, the slow suite every family's.
NEW_FAMILIES = {
    "NegativeBinomial",
    "GammaPoisson",
    "ZeroInflatedPoisson",
    "BetaBinomial",
    "Multinomial",
    "Geometric",
    "DiscreteUniform",
    "OrderedLogistic",
    "TruncatedNormal",
    "Pareto",
    "Weibull",
    "Logistic",
    "Chi2",
    "VonMises",
    "Delta",
    "GaussianRandomWalk",
    "LowRankMultivariateNormal",
    "MixtureSameFamily",
    "LKJ",
    "Wishart",
}
NEW_CASES = [c for c in CASES if c.id.split("-")[0] in NEW_FAMILIES]
