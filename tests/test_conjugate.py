"""Exact check: Bayesian linear regression with known noise has a Gaussian posterior in closed form.

With ``w ~ N(0, s² I)`` and ``y ~ N(X w, σ² I)``, ``Σ = (XᵀX/σ² + I/s²)⁻¹`` and ``μ = Σ Xᵀy/σ²``
(Bishop 2006, Eqs. 3.53-3.54). NUTS on every backend must match both.

Tolerances come from the Monte Carlo error of each estimate: the posterior mean of ``w_i`` is
compared with ``μ_i`` within 4 ``sqrt(Σ_ii / ESS_i)``; each covariance entry is the mean of
``z = (w_i - μ_i)(w_j - μ_j)`` (centred on the exact mean, so no bias correction is needed), whose
Monte Carlo standard error is ``sd(z) / sqrt(ESS(z))``, and it must lie within 4 of them of
``Σ_ij``.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.models.regression import conjugate_posterior, linear_regression_known_noise

NOISE, PRIOR_SCALE = 0.5, 1.0


def _data():
    rng = np.random.default_rng(42)
    X = rng.normal(size=(30, 3))
    X[:, 2] = 0.6 * X[:, 0] + 0.8 * X[:, 2]  # correlated inputs: a non-diagonal covariance
    y = X @ np.array([0.8, -0.5, 0.3]) + NOISE * rng.normal(size=30)
    return X, y


def _z_score(samples: np.ndarray, target: float) -> float:
    """(estimate - target) in Monte Carlo standard errors; ``samples`` shaped (chain, draw)."""
    ess = float(az.ess(samples, method="mean"))
    return (samples.mean() - target) / (samples.std() / np.sqrt(ess))


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_nuts_matches_closed_form_posterior(backend):
    X, y = _data()
    mean, cov = conjugate_posterior(X, y, NOISE, PRIOR_SCALE)
    post = bdl.fit(
        linear_regression_known_noise(X, y, noise=NOISE, prior_scale=PRIOR_SCALE),
        backend=backend,
        num_warmup=500,
        num_samples=1000,
        num_chains=2,
        seed=3,
        progress=False,
    )
    w = post.samples["w"].astype(np.float64)  # (chain, draw, 3)
    report = []
    for i in range(3):
        z = _z_score(w[..., i], mean[i])
        report.append(f"mean[{i}]: {w[..., i].mean():.4f} vs {mean[i]:.4f} ({z:+.2f} MCSE)")
        assert abs(z) < 4.0, "\n".join(report)
    for i in range(3):
        for j in range(i, 3):
            prod = (w[..., i] - mean[i]) * (w[..., j] - mean[j])
            z = _z_score(prod, cov[i, j])
            report.append(f"cov[{i},{j}]: {prod.mean():.5f} vs {cov[i, j]:.5f} ({z:+.2f} MCSE)")
            assert abs(z) < 4.0, "\n".join(report)


def test_closed_form_against_numpy_lstsq():
    # A flat prior (huge s) and the posterior mean is the least-squares fit.
    X, y = _data()
    mean, _ = conjugate_posterior(X, y, NOISE, prior_scale=1e6)
    np.testing.assert_allclose(mean, np.linalg.lstsq(X, y, rcond=None)[0], rtol=1e-6)
