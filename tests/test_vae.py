"""The shipped VAE (models/vae.py) on the stroke images: it fits on both backends and beats a
model of independent pixels on held-out images, and the IWAE bound rises with K (Burda et al.
2015; Eq. 3.18 of "Bayesian Computation in Deep Learning")."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_bdl.models import vae

SIZE, N = 12, 400


def independent_pixels_log_lik(train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """log p(x) per test image under independent Bernoulli pixels at the training frequencies:
    the baseline a latent variable has to beat."""
    p = np.clip(train.mean(0), 1e-3, 1 - 1e-3)
    return (test * np.log(p) + (1 - test) * np.log1p(-p)).reshape(len(test), -1).sum(1)


@pytest.fixture(scope="module", params=["numpyro", "pyro"])
def fitted(request):
    post, X = vae.fit_vae(
        request.param,
        n=N,
        size=SIZE,
        latent_dim=2,
        hidden=64,
        num_steps=1500,
        batch_size=50,
        lr=3e-3,
        num_samples=2,
    )
    return post, X


def test_vae_fits_and_beats_independent_pixels(fitted):
    post, X = fitted
    assert post.losses[-100:].mean() < 0.5 * post.losses[:10].mean()
    test = vae.stroke_images(200, SIZE, seed=1)
    elbo = post.log_marginal(test, num_particles=1, seed=0).per_point  # K = 1: the ELBO
    baseline = independent_pixels_log_lik(X, test)
    # A lower bound of log p(x) above the baseline's exact log-likelihood by more than 4
    # standard errors of the mean difference over the 200 held-out images (measured: 3.5 nats
    # per image, se 0.5, after this short fit).
    diff = elbo - baseline
    assert diff.mean() > 4 * diff.std(ddof=1) / np.sqrt(len(diff))
    assert post.samples["z"].shape == (1, 2, N, 2)
    loc, scale = post.encode(test[:5])["z"]
    assert loc.shape == scale.shape == (5, 2) and np.all(scale > 0)


def test_iwae_bound_rises_with_k(fitted):
    """IWAE_K of each held-out image, K = 1 (the ELBO), 5, 50, with independent draws: the mean
    over 200 images of IWAE_5 − IWAE_1 and of IWAE_50 − IWAE_5 is at least −3 standard errors
    (the sample sd of the per-image differences over √200: the images are independent, and so
    are the estimates). The bound is non-decreasing in K in expectation (Burda et al. 2015,
    Theorem 1); on a fitted VAE it rises clearly."""
    post, _ = fitted
    test = vae.stroke_images(200, SIZE, seed=1)
    bounds = {K: post.log_marginal(test, num_particles=K, seed=K).per_point for K in (1, 5, 50)}
    for small, large in ((1, 5), (5, 50)):
        diff = bounds[large] - bounds[small]
        se = diff.std(ddof=1) / np.sqrt(len(diff))
        assert diff.mean() > -3 * se, (small, large, diff.mean(), se)
    assert bounds[50].mean() > bounds[1].mean()  # strictly, by far: the encoder is not exact


@pytest.mark.slow  # ~1 min per case
@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
@pytest.mark.parametrize(
    "architecture, likelihood, objective",
    [("conv", "bernoulli", "elbo"), ("dense", "gaussian", "iwae")],
)
def test_vae_variants_fit(backend, architecture, likelihood, objective):
    post, X = vae.fit_vae(
        backend,
        n=1000,
        size=16,
        latent_dim=4,
        hidden=128,
        architecture=architecture,
        likelihood=likelihood,
        objective=objective,
        num_particles=5 if objective == "iwae" else 1,
        num_steps=3000,
        lr=2e-3,
        num_samples=2,
    )
    assert post.losses[-200:].mean() < 0.5 * post.losses[:10].mean()
    test = vae.stroke_images(200, 16, likelihood, seed=1)
    est = post.log_marginal(test, num_particles=100)
    if likelihood == "bernoulli":
        diff = est.per_point - independent_pixels_log_lik(X, test)
        assert diff.mean() > 10.0
    else:  # Gaussian pixels: the fitted noise sd is below the data's pixel sd
        assert float(post.params["sigma"]) < 0.5 * X.std()
    assert np.isfinite(est.per_point).all()


def test_shipped_example_runs_from_models(capsys):
    """``python -m ppl_bdl.models.vae``'s main at tiny settings: it fits and prints the held-out
    bounds (the statistics are checked above, on both backends). On Pyro only: main's
    arguments reach fit_vae the same way for either backend, and on NumPyro its five XLA
    programs (the steps, the draws, the diagnostics, three bounds) cost ~28 s of CPU."""
    vae.main(
        [
            "--backend",
            "pyro",
            "--n",
            "100",
            "--size",
            "8",
            "--steps",
            "5",
            "--latent-dim",
            "2",
            "--hidden",
            "8",
            "--held-out",
            "10",
        ]
    )
    out = capsys.readouterr().out
    assert "fitted in" in out and "held-out IWAE_1 (the ELBO):" in out
    assert "held-out IWAE_100:" in out
