"""``bdl.HMC``: the core's kernel with Stan's warmup (dual averaging, windowed mass) on every
backend, checked against Gaussian targets whose mean and covariance are known exactly."""

from __future__ import annotations

import arviz
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.inference.mcmc.hmc_warmup import TERM_BUFFER, slow_windows

SCALES = np.array([0.1, 1.0, 10.0])
CORRELATION = 0.99


@bdl.model
def scaled_normal():
    bdl.sample("x", dist.Normal(0.0, SCALES))


@bdl.model
def correlated_normal():
    cov = np.array([[1.0, CORRELATION], [CORRELATION, 1.0]])
    bdl.sample("x", dist.MultivariateNormal(np.zeros(2), covariance_matrix=cov))


def _fit(model, backend, **options):
    method = bdl.HMC(num_warmup=1000, num_samples=1000, num_chains=2, **options)
    return bdl.fit(model(), backend=backend, method=method, seed=3, progress=False)


def _check_moments(post, scales):
    """Standardised, each coordinate's mean within 4 MCSE of 0 and its second moment within 4
    MCSE of 1 (sd(z) = 1 and sd(z²) = √2, over the ESS of z and of z²)."""
    z = np.asarray(post.samples["x"]) / scales  # (chains, draws, d)
    for name, values, target, sd in (("z", z, 0.0, 1.0), ("z²", z**2, 1.0, np.sqrt(2))):
        ess = np.array([arviz.ess(values[..., j]) for j in range(len(scales))])
        error = np.abs(values.mean((0, 1)) - target)
        assert np.all(error < 4 * sd / np.sqrt(ess)), (name, error, ess)


def test_windows_follow_stans_schedule():
    """75 fast steps, slow windows of 25, 50, 100, ... (the last stretched), 50 fast steps; a
    warmup under 150 split 15% / 75% / 10%; under 20 no mass adaptation."""
    assert slow_windows(1000) == (75, [99, 149, 249, 449, 949])
    assert slow_windows(100) == (15, [89])
    assert slow_windows(19) == (19, [])
    for n in (20, 149, 150, 151, 500, 2000, 5000):
        start, ends = slow_windows(n)
        term = TERM_BUFFER if n >= 150 else int(0.1 * n)
        assert ends[-1] == n - term - 1 and start < ends[0], (n, start, ends)
        sizes = np.diff([start - 1, *ends])
        assert np.all(sizes[1:-1] == 2 * sizes[:-2]), (n, sizes)  # doubling, but the last


def test_diagonal_mass_learns_the_scales(backend):
    """Scales 0.1, 1 and 10: the draws have the target's moments, and the step size ends near 1
    (without the mass learnt, the 0.1 direction would hold it near 0.1)."""
    post = _fit(scaled_normal, backend)
    _check_moments(post, SCALES)
    step = np.asarray(post.sample_stats["step_size"])
    assert np.all(step > 0.5), step.reshape(2, -1)[:, 0]
    accept = float(np.mean(post.sample_stats["acceptance_rate"]))
    assert 0.65 < accept < 0.95, accept  # the target 0.8, within dual averaging's bias


@pytest.mark.filterwarnings("ignore::ppl_bdl.ConvergenceWarning")  # the diagonal mass's fit
@pytest.mark.slow_on("pyro")  # the same program as NumPyro's; its dense algebra is checked there
def test_dense_mass_learns_the_correlation(backend):
    """Correlation 0.99: with a dense mass the step size ends near 1; with a diagonal one it is
    held by the narrow direction (sd 0.1); both sample the right moments."""
    dense = _fit(correlated_normal, backend, dense_mass=True)
    diagonal = _fit(correlated_normal, backend)
    for post in (dense, diagonal):
        _check_moments(post, np.ones(2))
    product = np.prod(np.asarray(dense.samples["x"]), axis=-1)  # E = ρ, sd = √(1 + ρ²)
    mcse = np.sqrt(1 + CORRELATION**2) / np.sqrt(arviz.ess(product))
    assert abs(product.mean() - CORRELATION) < 4 * mcse, (product.mean(), mcse)
    assert np.all(np.asarray(dense.sample_stats["step_size"]) > 0.5)
    assert np.all(np.asarray(diagonal.sample_stats["step_size"]) < 0.35)


@pytest.mark.filterwarnings("ignore::ppl_bdl.ConvergenceWarning")  # 20 draws
def test_no_warmup_keeps_the_given_step_size(backend):
    """``num_warmup=0``: nothing adapts; every draw uses the step size given."""
    post = bdl.fit(
        scaled_normal(),
        backend=backend,
        method=bdl.HMC(num_warmup=0, num_samples=20, num_chains=1, step_size=0.05),
        progress=False,
    )
    np.testing.assert_allclose(np.asarray(post.sample_stats["step_size"]), 0.05, rtol=1e-6)
