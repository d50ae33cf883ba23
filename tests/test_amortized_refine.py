"""MCMC-refined amortized guides (``guides.Amortized(..., refine_steps=T)``): on a linear-Gaussian
latent model, whose per-point posterior is a Gaussian with a known non-diagonal covariance, the
refined draws recover that covariance where the diagonal encoder's draws (T = 0) show none; the
batched HMC and MALA chains against a Gaussian; the adapted step size; encode's shapes on both
backends; the errors; and (slow) the shipped VAE fitted with a refinement.

Every fit is in float64, as in tests/test_amortized.py (one process mixing precisions trips
JAX's dispatch cache)."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, guides, nn
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.batched_hmc import EXTRA_NORMALS, hmc_chains

# x_i | z_i ~ N(A z_i, s^2 I), z_i ~ N(0, I): z_i | x_i ~ N(S A'x_i / s^2, S), S = (I + A'A/s^2)^-1,
# here with a correlation of about -0.86 between the two coordinates.
A = np.array([[1.0, 0.8], [0.8, 1.0], [0.5, 0.6]])
N, TRUE_SIGMA = 200, 0.5
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, 2)) @ A.T + TRUE_SIGMA * _rng.normal(size=(N, 3))
DRAWS = 2000  # per point; the sample correlation's standard error is (1 - rho^2)/sqrt(DRAWS)


@bdl.model
def linear_gaussian(X):
    sigma = bdl.param("sigma", 1.0, constraint="positive")
    with bdl.plate("data", X.shape[0]) as idx:
        z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(2,))
        bdl.sample("x", dist.Normal(z @ A.T, sigma), obs=X[idx], shape=(3,))


def exact_posterior(sigma: float, x: np.ndarray):
    cov = np.linalg.inv(np.eye(2) + A.T @ A / sigma**2)
    return x @ A @ cov.T / sigma**2, cov


def correlation(cov: np.ndarray) -> float:
    return float(cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]))


def fit(backend: str, num_steps: int, **refine):
    # A linear encoder: the exact posterior mean is linear in x and its covariance constant, so
    # q_0's only gap is the correlation a diagonal Gaussian cannot hold.
    guide = guides.Amortized(nn.Dense("enc", 3, 4), sites=["z"], **refine)
    return bdl.fit(
        linear_gaussian(X),
        backend=backend,
        method="vi",
        guide=guide,
        num_steps=num_steps,
        lr=0.02,
        batch_size=50,
        num_samples=4,
        precision="float64",
        progress=False,
    )


@pytest.fixture(scope="module")
def fits():
    """An unrefined fit and one refined by 10 HMC steps whose step size starts small (0.1) and
    is adapted toward a mean acceptance of 0.8 (NumPyro, 400 steps)."""
    plain = fit("numpyro", 400)
    refined = fit(
        "numpyro",
        400,
        refine_steps=10,
        refine_leapfrog=3,
        refine_step_size=0.1,
        refine_target_accept=0.8,
    )
    return plain, refined


def test_refined_draws_recover_the_exact_posterior_covariance(fits):
    """q_T's covariance of three points, at the fitted σ, against the exact one: each entry
    within 5 standard errors (se of a sample covariance: √((σ_ii σ_jj + σ_ij²)/n)) plus 0.02
    for the chain's T = 10 steps, and the correlation within 0.05 of -0.86; the means within
    5 se. The unrefined fit's draws: correlation within 0.06 of 0."""
    plain, refined = fits
    for post, refined_draws in ((refined, True), (plain, False)):
        draws = post.encode(X[:3], num_samples=DRAWS, seed=1)["z"]
        assert draws.shape == (DRAWS, 3, 2)
        mean, cov = exact_posterior(float(post.params["sigma"]), X[:3])
        for i in range(3):
            sample_cov = np.cov(draws[:, i].T)
            if not refined_draws:
                assert abs(correlation(sample_cov)) < 0.06
                continue
            se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / DRAWS)
            np.testing.assert_array_less(np.abs(sample_cov - cov), 5 * se + 0.02)
            assert abs(correlation(sample_cov) - correlation(cov)) < 0.05
            se_mean = np.sqrt(np.diag(cov) / DRAWS)
            np.testing.assert_array_less(np.abs(draws[:, i].mean(0) - mean[i]), 5 * se_mean)


def test_model_fitted_on_refined_draws_and_step_size_adapted(fits):
    """σ's maximum-likelihood value is near the true 0.5 (N = 200: its se is about 0.02); the
    refined fit lands there, and its step size grew from 0.1 (where nearly every proposal is
    accepted, above the 0.8 target). The posterior's draws of z are refined too."""
    plain, refined = fits
    assert abs(float(refined.params["sigma"]) - TRUE_SIGMA) < 0.06
    assert float(refined.guide.params["refine:step_size"][0]) > 0.3
    assert "refine:step_size" not in plain.guide.params
    assert refined.samples["z"].shape == (1, 4, N, 2)
    assert np.isfinite(refined.losses).all()


@pytest.mark.parametrize("leapfrog", [4, 1])
def test_batched_chains_sample_a_correlated_gaussian(leapfrog):
    """HMC (4 leapfrog steps) and MALA (1) chains, one per row with rows' own affine maps, from
    a start far too narrow: after 40 steps the rows' draws have the target's covariance within
    5 se + 0.02."""
    backend = bdl.backends.get("numpyro")
    cov = exact_posterior(0.5, np.zeros((1, 3)))[1]
    precision = np.linalg.inv(cov)
    rows = 3000
    with backend.scope(), backend.activate():
        m = backend.math
        P = backend.asarray(precision)

        def log_density(z):
            return -0.5 * m.sum((z @ P) * z, axis=-1)

        loc = backend.asarray(np.zeros((rows, 2)))
        scale = backend.asarray(np.tile([0.3, 0.4], (rows, 1)))
        z0 = scale * backend.random.normal(backend.random.key(1), (rows, 2))
        noise = backend.random.normal(backend.random.key(0), (40, rows, 2 + EXTRA_NORMALS))
        step = 1.0 if leapfrog > 1 else 0.8
        z, accept = hmc_chains(log_density, loc, scale, z0, noise, step, leapfrog, backend)
        z = np.asarray(backend.to_numpy(z))
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / rows)
    np.testing.assert_array_less(np.abs(np.cov(z.T) - cov), 5 * se + 0.02)
    assert 0.3 < float(accept) <= 1.0


def test_encode_shapes_on_both_backends(backend):
    post = fit(backend, 3, refine_steps=2, refine_kernel="langevin")
    draws = post.encode(X[:5], num_samples=7)["z"]
    assert draws.shape == (7, 5, 2) and np.isfinite(draws).all()
    loc, scale = post.encode(X[:5])["z"]  # q_0's loc and scale, as without a refinement
    assert loc.shape == scale.shape == (5, 2)
    assert post.samples["z"].shape == (1, 4, N, 2)


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("refine_steps", -1, "refine_steps must be an int >= 0"),
        ("refine_steps", 2.5, "refine_steps must be an int >= 0"),
        ("refine_steps", True, "refine_steps must be an int >= 0"),
        ("refine_kernel", "nuts", "'hmc', 'langevin'"),
        ("refine_step_size", 0.0, "refine_step_size"),
        ("refine_leapfrog", 0, "refine_leapfrog"),
        ("refine_target_accept", 1.5, "refine_target_accept"),
    ],
)
def test_bad_refine_options(option, value, says):
    with pytest.raises(ConfigError, match=says):
        guides.Amortized(nn.Dense("enc", 3, 4), sites=["z"], **{option: value})


def test_refine_options_refused_without_an_amortized_guide():
    with pytest.raises(ConfigError, match=r"refine_steps.*guides\.Amortized"):
        bdl.fit(linear_gaussian(X), backend="numpyro", method="vi", refine_steps=3)
    with pytest.raises(ConfigError, match=r"refine_kernel.*guides\.Amortized"):
        bdl.VI(guide="meanfield", refine_kernel="hmc")
    with pytest.raises(ConfigError, match=r"\['refine_steps'\].*guides\.Amortized"):
        bdl.fit(
            linear_gaussian(X),
            backend="numpyro",
            method="vi",
            num_steps=2,
            guide_settings={"refine_steps": 3},
            progress=False,
        )


@pytest.mark.slow
def test_refined_vae_fits_and_encodes():
    """The shipped VAE (Bernoulli, dense, latent 2) fits with T = 5 HMC steps per draw (step
    size adapted toward 0.8): finite losses that fall, an adapted step size, q_T's draws of new
    images, and a finite held-out log p(x). (Its held-out log p(x) against T = 0's is what
    benchmarks/vae_refine.py measures: q_0, the estimate's proposal, fits a refined decoder's
    posterior less well, so that estimate is looser there; see docs/inference.md.)"""
    from ppl_bdl.models import vae

    post, _ = vae.fit_vae(
        "numpyro",
        n=400,
        size=12,
        latent_dim=2,
        hidden=64,
        num_steps=1500,
        batch_size=50,
        lr=3e-3,
        num_samples=2,
        precision="float64",
        refine_steps=5,
        refine_target_accept=0.8,
    )
    assert np.isfinite(post.losses).all()
    assert post.losses[-100:].mean() < 0.5 * post.losses[:10].mean()
    assert 0.05 < float(post.guide.params["refine:step_size"][0]) < 5.0
    test = vae.stroke_images(50, 12, seed=1)
    assert post.encode(test[:5], num_samples=3)["z"].shape == (3, 5, 2)
    assert np.isfinite(post.log_marginal(test, num_particles=100).per_point).all()
