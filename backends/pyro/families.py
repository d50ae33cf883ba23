"""Families Pyro lacks, built from torch pieces: TruncatedNormal, GaussianRandomWalk,
DiscreteUniform, a von Mises on the circle [-pi, pi], and the bijection onto positive-definite
matrices (for a latent Wishart).

Each matches NumPyro's class of the same name (parameters, support, moments), so a model gives
the same density on both backends.

Example
-------
>>> import torch
>>> from ppl_bdl.backends.pyro.families import TruncatedNormal
>>> d = TruncatedNormal(torch.tensor(0.0), torch.tensor(1.0), low=torch.tensor(0.0))
>>> round(float(d.log_prob(torch.tensor(0.5))), 4)
-0.3508
"""

from __future__ import annotations

import math

import pyro.distributions as pd
import torch
from torch.distributions import constraints as tc
from torch.distributions.transforms import Transform
from torch.distributions.utils import broadcast_all
from torch.special import log_ndtr, ndtr, ndtri

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class TruncatedNormal(pd.TorchDistribution):
    """N(loc, scale²) restricted to [low, high] (a bound of None is infinite)."""

    arg_constraints = {}
    has_rsample = True

    def __init__(self, loc, scale, low=None, high=None, validate_args=None):
        self._bounds = (low is not None, high is not None)
        low = -math.inf if low is None else low
        high = math.inf if high is None else high
        self.loc, self.scale, self.low, self.high = broadcast_all(loc, scale, low, high)
        super().__init__(self.loc.shape, validate_args=False)

    @tc.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        has_low, has_high = self._bounds
        if has_low and has_high:
            return tc.interval(self.low, self.high)
        return tc.greater_than_eq(self.low) if has_low else tc.less_than(self.high)

    def _frame(self):
        """Standardised bounds, flipped to the lower tail when both are above the mean, where
        1 - Φ loses all precision; Z = Φ(hi) - Φ(lo) in the flipped frame."""
        # A missing bound is a constant ±inf: a gradient through (±inf - loc) / scale is NaN.
        has_low, has_high = self._bounds
        infinite = torch.full_like(self.loc, math.inf)
        a = (self.low - self.loc) / self.scale if has_low else -infinite
        b = (self.high - self.loc) / self.scale if has_high else infinite
        upper = a > 0
        lo, hi = torch.where(upper, -b, a), torch.where(upper, -a, b)
        log_z = log_ndtr(hi) + torch.log(-torch.expm1(log_ndtr(lo) - log_ndtr(hi)))
        return a, b, upper, lo, hi, log_z

    def log_prob(self, value):
        z = (value - self.loc) / self.scale
        log_z = self._frame()[-1]
        return -0.5 * z * z - _LOG_SQRT_2PI - torch.log(self.scale) - log_z

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        _, _, upper, lo, hi, _ = self._frame()
        u = torch.rand(shape, dtype=self.loc.dtype, device=self.loc.device)
        p_lo, p_hi = ndtr(lo), ndtr(hi)
        z = ndtri(p_lo + u * (p_hi - p_lo))
        x = self.loc + self.scale * torch.where(upper, -z, z)
        return torch.minimum(torch.maximum(x, self.low), self.high)

    def _phi_ratios(self):
        a, b, _, _, _, log_z = self._frame()
        log_phi = lambda t: -0.5 * t * t - _LOG_SQRT_2PI  # noqa: E731
        ra, rb = torch.exp(log_phi(a) - log_z), torch.exp(log_phi(b) - log_z)
        return a, b, ra, rb

    @property
    def mean(self):
        _, _, ra, rb = self._phi_ratios()
        return self.loc + self.scale * (ra - rb)

    @property
    def variance(self):
        a, b, ra, rb = self._phi_ratios()
        a_ra = torch.where(torch.isfinite(a), a * ra, torch.zeros_like(a))
        b_rb = torch.where(torch.isfinite(b), b * rb, torch.zeros_like(b))
        return self.scale**2 * (1 + a_ra - b_rb - (ra - rb) ** 2)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        has_low, has_high = self._bounds
        return TruncatedNormal(
            self.loc.expand(batch_shape),
            self.scale.expand(batch_shape),
            self.low.expand(batch_shape) if has_low else None,
            self.high.expand(batch_shape) if has_high else None,
        )


class GaussianRandomWalk(pd.TorchDistribution):
    """x₀ ~ N(0, scale²), xₜ - xₜ₋₁ ~ N(0, scale²), for ``num_steps`` steps (the event)."""

    arg_constraints = {}
    support = tc.real_vector
    has_rsample = True

    def __init__(self, scale, num_steps=1, validate_args=None):
        (self.scale,) = broadcast_all(scale)
        self.num_steps = int(num_steps)
        super().__init__(self.scale.shape, torch.Size([self.num_steps]), validate_args=False)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        steps = torch.randn(shape, dtype=self.scale.dtype, device=self.scale.device)
        return torch.cumsum(steps, -1) * self.scale.unsqueeze(-1)

    def log_prob(self, value):
        steps = torch.cat([value[..., :1], value[..., 1:] - value[..., :-1]], -1)
        scale = self.scale.unsqueeze(-1)
        return (-0.5 * (steps / scale) ** 2 - _LOG_SQRT_2PI - torch.log(scale)).sum(-1)

    @property
    def mean(self):
        return torch.zeros(self.batch_shape + self.event_shape, dtype=self.scale.dtype)

    @property
    def variance(self):
        t = torch.arange(1, self.num_steps + 1, dtype=self.scale.dtype)
        return self.scale.unsqueeze(-1) ** 2 * t

    def expand(self, batch_shape, _instance=None):
        return GaussianRandomWalk(self.scale.expand(torch.Size(batch_shape)), self.num_steps)


class DiscreteUniform(pd.TorchDistribution):
    """Integers low..high (both included), equally likely. Draws are floats, as in torch."""

    arg_constraints = {}

    def __init__(self, low=0, high=1, validate_args=None):
        low, high = broadcast_all(low, high)
        dtype = torch.get_default_dtype()
        self.low, self.high = low.to(dtype), high.to(dtype)
        super().__init__(self.low.shape, validate_args=False)

    @tc.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return tc.integer_interval(self.low, self.high)

    def log_prob(self, value):
        shape = torch.broadcast_shapes(value.shape, self.batch_shape)
        return (-torch.log(self.high - self.low + 1)).expand(shape)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        u = torch.rand(shape, dtype=self.low.dtype, device=self.low.device)
        draws = self.low + torch.floor(u * (self.high - self.low + 1))
        return torch.minimum(draws, self.high)

    @property
    def mean(self):
        return (self.low + self.high) / 2

    @property
    def variance(self):
        return ((self.high - self.low + 1) ** 2 - 1) / 12

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return DiscreteUniform(self.low.expand(batch_shape), self.high.expand(batch_shape))


class VonMises(pd.VonMises):
    """torch's von Mises with its support on the circle [-pi, pi], as NumPyro's: a latent angle
    is then sampled through the same bijection on both backends (torch's support, the whole real
    line, leaves a periodic, improper density on the unconstrained space)."""

    support = tc.interval(-math.pi, math.pi)


class PositiveDefiniteTransform(Transform):
    """R^(n(n+1)/2) -> symmetric positive-definite n × n matrices: the vector fills a lower-
    triangular L row by row, its diagonal through exp, and the value is L Lᵀ.

    ``log |J| = n log 2 + Σᵢ (n - i + 2) log Lᵢᵢ`` (i = 1..n): the exp on the diagonal, and the
    Jacobian 2ⁿ Πᵢ Lᵢᵢ^(n-i+1) of L -> L Lᵀ (Muirhead 1982, Aspects of Multivariate Statistical
    Theory, Theorem 2.1.9).
    """

    domain = tc.independent(tc.real, 1)
    codomain = tc.positive_definite
    bijective = True

    def __eq__(self, other):
        return isinstance(other, PositiveDefiniteTransform)

    @staticmethod
    def _size(m: int) -> int:
        n = int(round((math.sqrt(8 * m + 1) - 1) / 2))
        if n * (n + 1) // 2 != m:
            raise ValueError(f"a vector of {m} entries does not fill a lower-triangular matrix.")
        return n

    def _call(self, x):
        n = self._size(x.shape[-1])
        rows, cols = torch.tril_indices(n, n)
        diag = rows == cols
        entries = torch.where(diag, torch.exp(x), x)
        L = x.new_zeros(x.shape[:-1] + (n, n))
        L[..., rows, cols] = entries
        return L @ L.transpose(-1, -2)

    def _inverse(self, y):
        n = y.shape[-1]
        L = torch.linalg.cholesky(y)
        rows, cols = torch.tril_indices(n, n)
        entries = L[..., rows, cols]
        return torch.where(rows == cols, torch.log(entries), entries)

    def log_abs_det_jacobian(self, x, y):
        n = self._size(x.shape[-1])
        rows, cols = torch.tril_indices(n, n)
        log_diag = x[..., rows == cols]
        weights = torch.arange(n + 1, 1, -1, dtype=x.dtype)  # n - i + 2 for i = 1..n
        return n * math.log(2.0) + (log_diag * weights).sum(-1)

    def forward_shape(self, shape):
        n = self._size(shape[-1])
        return torch.Size(shape[:-1]) + (n, n)

    def inverse_shape(self, shape):
        n = shape[-1]
        return torch.Size(shape[:-2]) + (n * (n + 1) // 2,)


class LowerCholeskyTransform(Transform):
    """R^(n(n+1)/2) -> lower-triangular n × n matrices with a positive diagonal, as NumPyro's: the
    first n(n-1)/2 entries fill the strict lower triangle row by row, the last n are the log of
    the diagonal, so ``log |J|`` is their sum (torch's ``LowerCholeskyTransform`` maps n × n
    matrices and is no bijection)."""

    domain = tc.independent(tc.real, 1)
    codomain = tc.lower_cholesky
    bijective = True

    def __eq__(self, other):
        return isinstance(other, LowerCholeskyTransform)

    def _call(self, x):
        n = PositiveDefiniteTransform._size(x.shape[-1])
        rows, cols = torch.tril_indices(n, n, -1)
        L = torch.diag_embed(torch.exp(x[..., x.shape[-1] - n :]))
        L[..., rows, cols] = x[..., : x.shape[-1] - n]
        return L

    def _inverse(self, y):
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, -1)
        diag = torch.log(torch.diagonal(y, dim1=-2, dim2=-1))
        return torch.cat([y[..., rows, cols], diag], -1)

    def log_abs_det_jacobian(self, x, y):
        n = y.shape[-1]
        return x[..., x.shape[-1] - n :].sum(-1)

    def forward_shape(self, shape):
        n = PositiveDefiniteTransform._size(shape[-1])
        return torch.Size(shape[:-1]) + (n, n)

    def inverse_shape(self, shape):
        n = shape[-1]
        return torch.Size(shape[:-2]) + (n * (n + 1) // 2,)


class LKJCholesky(pd.LKJCholesky):
    """torch's LKJCholesky with a correct onion-method sampler.

    In the onion method (Lewandowski, Kurowicka & Joe 2009, section 3.2) row i + 1 of the factor
    (i = 1..d-1) has squared radius y ~ Beta(i / 2, β - (i - 1) / 2), β = η + (d - 2) / 2, and a
    uniform direction in Rⁱ. torch 2.x draws y ~ Beta(i - 1/2, ·), which leaves the correlations
    of rows 3 and on too spread (for d = 3, η = 1: variances 0.30 instead of 0.25); its density
    is right and kept.
    """

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        d, conc = self.dim, self.concentration
        i = torch.arange(1, d, dtype=conc.dtype, device=conc.device)
        beta = conc.unsqueeze(-1) + (d - 2) / 2 - (i - 1) / 2
        y = torch.distributions.Beta(i / 2, beta).sample(sample_shape)
        z = torch.randn(shape, dtype=conc.dtype, device=conc.device).tril(-1)[..., 1:, :]
        w = torch.sqrt(y).unsqueeze(-1) * z / z.norm(dim=-1, keepdim=True)
        factor = torch.cat([torch.zeros_like(w[..., :1, :]), w], -2)
        diag = torch.cat([torch.ones_like(y[..., :1]), torch.sqrt(torch.clamp(1 - y, min=0))], -1)
        return factor + torch.diag_embed(diag)


class LKJ(pd.TransformedDistribution):
    """LKJ on correlation matrices: :class:`LKJCholesky` mapped through R = L Lᵀ (pyro's LKJ,
    with the corrected sampler and an ``expand`` that works)."""

    arg_constraints = {}
    support = pd.constraints.corr_matrix

    def __init__(self, dim, concentration=1.0, validate_args=None):
        base = LKJCholesky(dim, concentration, validate_args=False)
        self.dim, self.concentration = base.dim, base.concentration
        transform = pd.transforms.CorrMatrixCholeskyTransform().inv
        super().__init__(base, transform, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return LKJ(self.dim, self.concentration.expand(torch.Size(batch_shape)))

    @property
    def mean(self):
        eye = torch.eye(self.dim, dtype=self.concentration.dtype)
        return eye.expand(self.batch_shape + (self.dim, self.dim))

    @property
    def variance(self):
        # off-diagonal r_ij = 2 Beta(b, b) - 1, b = η - 1 + d / 2 (LKJ 2009, section 3.2)
        b = self.concentration - 1 + self.dim / 2
        off = (1 / (2 * b + 1))[..., None, None]
        eye = torch.eye(self.dim, dtype=self.concentration.dtype)
        return off * (1 - eye)
