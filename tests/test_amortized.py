"""Amortized guides (``guides.Amortized``): the encoder recovers the exact posterior of
probabilistic PCA, ``log_marginal`` matches pPCA's closed-form log p(x), the objective's scale,
errors, and a global guide beside the encoder.

Every fit here is in float64: the models add NumPy constants to the latents, and JAX 0.10's
dispatch cache feeds a float32 buffer to an op compiled under ``enable_x64`` when one process
mixes the two precisions (see backends/numpyro/dists.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import multivariate_normal

import ppl_bdl as bdl
from ppl_bdl import dist, guides, nn
from ppl_bdl.errors import ConfigError, DataError, ModelError
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.vi.guides.base import inverse_softplus
from ppl_bdl.inference.vi.runner import VIRun

D, K, N, SIGMA = 4, 2, 300, 0.5
_rng = np.random.default_rng(0)
# Orthogonal columns: M = W'W + s^2 I is diagonal, so the exact posterior of z is a diagonal
# Gaussian, inside the guide's family (Tipping & Bishop 1999).
W = np.linalg.qr(_rng.normal(size=(D, K)))[0] * np.array([2.0, 1.0])
MU = np.array([0.5, -0.5, 0.25, 0.0])
X = _rng.normal(size=(N, K)) @ W.T + MU + SIGMA * _rng.normal(size=(N, D))


@bdl.model
def ppca_fixed(X):
    """pPCA with the decoder given: only q(z|x) is fitted."""
    with bdl.plate("data", X.shape[0]) as idx:
        z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(K,))
        bdl.sample("x", dist.Normal(z @ W.T + MU, SIGMA), obs=X[idx], shape=(D,))


def exact_posterior(W, mu, sigma, X):
    """z | x ~ N(M^-1 W'(x - mu), sigma^2 M^-1), M = W'W + sigma^2 I (Tipping & Bishop 1999)."""
    M_inv = np.linalg.inv(W.T @ W + sigma**2 * np.eye(W.shape[1]))
    return (X - mu) @ W @ M_inv.T, sigma**2 * M_inv


def exact_log_marginal(W, mu, sigma, X):
    """log p(x) = log N(x; mu, W W' + sigma^2 I)."""
    return multivariate_normal(mu, W @ W.T + sigma**2 * np.eye(len(mu))).logpdf(X)


def _encoder():
    return nn.Dense("enc", D, 2 * K, prior=nn.glorot_normal())


@pytest.fixture(scope="module", params=["numpyro", "pyro"])
def fixed_fit(request):
    """The encoder of pPCA fitted for 3000 steps (B = 100, 4 particles, cosine lr), read at the
    last step (where the decayed lr has stilled Adam's noise)."""
    setup = prepare(ppca_fixed(X), request.param, "float64", 0)
    run = VIRun(
        setup,
        0,
        guide=guides.Amortized(_encoder(), sites=["z"]),
        num_steps=3000,
        lr=0.02,
        schedule="cosine",
        batch_size=100,
        num_particles=4,
    )
    losses, failure = run.steps(3000)
    assert failure is None
    return run, losses


def test_encoder_recovers_the_exact_ppca_posterior(fixed_fit):
    run, _ = fixed_fit
    loc, scale = run.fitted_guide().encode(X)["z"]
    exact_loc, cov = exact_posterior(W, MU, SIGMA, X)
    sd = np.sqrt(np.diag(cov))
    # The optimum is exact; what is left is Adam's noise at the end of the schedule: measured
    # 0.4-3% of a posterior sd (rms over points) and 1-7% on the scales on the two backends.
    err = (loc - exact_loc) / sd
    assert np.sqrt(np.mean(err**2)) < 0.06
    assert np.abs(err).max() < 0.15
    assert np.all(np.abs(scale / sd - 1.0) < 0.12)


def test_minibatch_loss_is_minus_the_elbo_of_the_data_set(fixed_fit):
    """At the exact q the ELBO is log p(D): the last losses (N/B-scaled minibatch estimates of
    -ELBO) average to -sum log p(x_i) within 4 standard errors of their mean."""
    _, losses = fixed_fit
    last = losses[-600:]
    exact = -exact_log_marginal(W, MU, SIGMA, X).sum()
    # -ELBO >= -log p(D): the residual KL of the ~2% errors above is ~0.01 nats.
    assert abs(last.mean() - exact) < 4 * last.std() / np.sqrt(len(last)) + 0.5


def test_log_marginal_matches_ppca_closed_form(fixed_fit):
    run, _ = fixed_fit
    fitted = run.fitted_guide()
    est = fitted.log_marginal(run.setup.bound, X, {}, num_particles=1000, seed=1)
    exact = exact_log_marginal(W, MU, SIGMA, X)
    # Per point, the estimate's error is its Monte Carlo error, whose standard error is
    # mc_se = sqrt(1/ESS - 1/K) (delta method); its bias (-mc_se^2/2) is far below it. Over 300
    # points the largest |z| of a standard normal exceeds 5 with probability 2e-4.
    z = (est.per_point - exact) / est.mc_se
    assert np.abs(z).max() < 5.0
    assert abs(est.total - exact.sum()) < 4 * np.sqrt(np.sum(est.mc_se**2))
    assert est.ess.min() > 900  # q(z|x) is the posterior: near-equal weights


def test_log_marginal_with_a_wider_shifted_proposal(fixed_fit):
    """With the encoder's q(z|x) made twice as wide and shifted by half a posterior sd, the
    weights are far from equal (ESS well below K) but bounded (q is wider than the posterior
    in every direction), and the estimate stays within its stated Monte Carlo error. (A q
    narrower than the posterior has unbounded weights: there ESS and mc_se say it, as for any
    importance sampler.)"""
    run, _ = fixed_fit
    guide = run.guide
    params = {k: v for k, v in run._current().items() if k in guide.param_layout.shapes}
    _, cov = exact_posterior(W, MU, SIGMA, X)
    bias = params["encoder:enc.bias"].copy()
    bias[:K] += 0.5 * np.sqrt(np.diag(cov))
    bias[K:] = inverse_softplus(2.0 * np.logaddexp(0.0, bias[K:]))
    fitted = guide.fitted(guide.param_layout.pack({**params, "encoder:enc.bias": bias}))
    est = fitted.log_marginal(run.setup.bound, X, {}, num_particles=1000, seed=2)
    exact = exact_log_marginal(W, MU, SIGMA, X)
    assert np.median(est.ess) < 600  # a poor proposal indeed
    assert np.abs((est.per_point - exact) / est.mc_se).max() < 5.0


@bdl.model
def ppca(X):
    """pPCA with W, mu, sigma fitted (maximum likelihood through the ELBO)."""
    n, d = X.shape
    W_ = bdl.param("W", 0.1 * np.random.default_rng(1).normal(size=(d, K)))
    mu = bdl.param("mu", np.zeros(d))
    sigma = bdl.param("sigma", 1.0, constraint="positive")
    with bdl.plate("data", n) as idx:
        z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(K,))
        bdl.sample("x", dist.Normal(z @ W_.T + mu, sigma), obs=X[idx], shape=(d,))


@pytest.mark.slow  # ~25 s per backend
def test_ppca_fitted_decoder_encoder_and_log_marginal(backend):
    """The issue's check: W, mu, sigma fitted; given them, the encoder is the exact posterior
    and log_marginal(X, 1000) is the closed form. (A diagonal q makes the ELBO pick W with
    orthogonal columns, where the exact posterior is diagonal.)"""
    Xc = X - MU  # centred inputs: the encoder's x-dependent scale converges in time
    post = bdl.fit(
        ppca(Xc),
        backend=backend,
        method="vi",
        num_steps=6000,
        lr=0.03,
        schedule="cosine",
        num_particles=8,
        precision="float64",
        num_samples=5,
        guide=guides.Amortized(_encoder(), sites=["z"]),
        progress=False,
    )
    Wf, muf, sf = post.params["W"], post.params["mu"], float(post.params["sigma"])
    # sigma^2 is the maximum-likelihood one: the mean of the discarded eigenvalues of the
    # sample covariance (Tipping & Bishop 1999, Eq. 8).
    eigenvalues = np.linalg.eigvalsh(np.cov(Xc.T, bias=True))
    assert sf == pytest.approx(np.sqrt(eigenvalues[: D - K].mean()), rel=0.02)
    exact_loc, cov = exact_posterior(Wf, muf, sf, Xc)
    sd = np.sqrt(np.diag(cov))
    loc, scale = post.encode(Xc)["z"]
    assert np.abs((loc - exact_loc) / sd).max() < 0.1
    assert np.all(np.abs(scale / sd - 1.0) < 0.1)
    est = post.log_marginal(Xc, num_particles=1000)
    exact = exact_log_marginal(Wf, muf, sf, Xc)
    assert np.abs((est.per_point - exact) / est.mc_se).max() < 5.0


def _lifted_encoder(backend: str, weight=None, bias=None):
    """A torch Linear (pyro) or an equinox Linear (numpyro) lifted as the encoder, holding
    ``weight`` (D, 2K) and ``bias`` (2K,) when given (else the module's own initial values)."""
    if backend == "pyro":
        import torch

        module = torch.nn.Linear(D, 2 * K)
        if weight is not None:
            with torch.no_grad():
                module.weight.copy_(torch.as_tensor(weight.T))
                module.bias.copy_(torch.as_tensor(bias))
    else:
        import equinox as eqx
        import jax

        module = eqx.nn.Linear(D, 2 * K, key=jax.random.PRNGKey(0))
        if weight is not None:
            module = eqx.tree_at(lambda m: (m.weight, m.bias), module, (weight.T, bias))
    return nn.lift(module, name="enc")


def test_a_lifted_module_is_an_encoder(backend):
    """A lifted torch / equinox module as the encoder: it starts at the module's own values (set
    here to the exact pPCA posterior, which encode() then returns), and a fit from the module's
    default initialisation trains it (the loss falls by hundreds of nats; the encoder's means
    move towards the exact ones)."""
    exact_loc, cov = exact_posterior(W, MU, SIGMA, X)
    sd = np.sqrt(np.diag(cov))
    A = W @ cov.T / SIGMA**2  # loc = (x - mu) @ A: W M^-1, with cov = sigma^2 M^-1
    weight = np.concatenate([A, np.zeros((D, K))], axis=1)
    bias = np.concatenate([-MU @ A, inverse_softplus(sd)])
    setup = prepare(ppca_fixed(X), backend, "float64", 0)
    lifted = guides.Amortized(_lifted_encoder(backend, weight, bias), sites=["z"])
    loc, scale = VIRun(setup, 0, guide=lifted, num_steps=1).fitted_guide().encode(X)["z"]
    np.testing.assert_allclose(loc, exact_loc, atol=1e-5 * sd.min())  # float32 module values
    np.testing.assert_allclose(scale, np.broadcast_to(sd, scale.shape), rtol=1e-5)
    post = bdl.fit(
        ppca_fixed(X),
        backend=backend,
        method="vi",
        num_steps=400,
        lr=0.02,
        batch_size=100,
        num_samples=2,
        precision="float64",
        progress=False,
        guide=guides.Amortized(_lifted_encoder(backend), sites=["z"]),
    )
    assert post.losses[-50:].mean() < post.losses[:20].mean() - 100.0
    start = (
        VIRun(setup, 0, guide=guides.Amortized(_lifted_encoder(backend), sites=["z"]), num_steps=1)
        .fitted_guide()
        .encode(X)["z"][0]
    )
    fitted = post.encode(X)["z"][0]
    assert np.abs(fitted - exact_loc).mean() < 0.5 * np.abs(start - exact_loc).mean()


# -- global latents beside the encoder, other objectives, prediction ---------------------------
@bdl.model
def ppca_bayes(X):
    """pPCA with a prior on W: W is global (mean-field), z local (amortized)."""
    W_ = bdl.sample("W", dist.Normal(0.0, 1.0), shape=(D, K))
    with bdl.plate("data", X.shape[0]) as idx:
        z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(K,))
        bdl.sample("x", dist.Normal(z @ W_.T + MU, SIGMA), obs=X[idx], shape=(D,))


@pytest.mark.parametrize(
    "backend, objective",
    [
        ("numpyro", "elbo"),
        ("pyro", "elbo"),
        ("pyro", "iwae"),
        ("pyro", "renyi"),
        pytest.param("numpyro", "iwae", marks=pytest.mark.slow),  # ~10 s each: compilation
        pytest.param("numpyro", "renyi", marks=pytest.mark.slow),
    ],
)
def test_global_guide_with_every_objective(backend, objective):
    extra = {"alpha": 0.5} if objective == "renyi" else {}
    post = bdl.fit(
        ppca_bayes(X),
        backend=backend,
        method="vi",
        num_steps=300,
        batch_size=50,
        objective=objective,
        num_particles=3,
        init_scale=0.1,
        num_samples=20,
        precision="float64",
        guide=guides.Amortized(_encoder(), sites=["z"]),
        progress=False,
        **extra,
    )
    assert np.isfinite(post.losses).all()
    assert post.losses[-50:].mean() < post.losses[:50].mean()
    assert post.samples["W"].shape == (1, 20, D, K)
    assert post.samples["z"].shape == (1, 20, N, K)
    assert sorted(post.guide.params)[:2] == ["encoder:enc.bias", "encoder:enc.weight"]
    assert post.guide.params["scale"].shape == (D * K,)  # the mean-field guide of W
    # log p(x) under the guide's W (the vmap over particles' own draws of W)
    est = post.log_marginal(X[:10], num_particles=50)
    assert est.per_point.shape == (10,) and np.isfinite(est.per_point).all()
    # predict: the training points reconstructed at the posterior's draws of z
    pred = post.predict(ppca_bayes(X))
    assert pred.draws["x"].shape == (20, N, D)
    draws = post.guide.sample(3)
    assert draws["z"].shape == (3, N, K)
    assert np.isfinite(post.guide.log_prob(draws)).all()


def test_delta_global_guide_is_map(backend):
    post = bdl.fit(
        ppca_bayes(X),
        backend=backend,
        method="vi",
        num_steps=200,
        num_samples=4,
        precision="float64",
        guide=guides.Amortized(_encoder(), sites=["z"], global_guide="delta"),
        progress=False,
    )
    W_draws = post.samples["W"][0]
    assert np.allclose(W_draws, W_draws[0])  # a point mass


# -- errors ---------------------------------------------------------------------------------------
@bdl.model
def two_locals(X):
    with bdl.plate("data", X.shape[0]) as idx:
        z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(K,))
        c = bdl.sample("c", dist.Normal(0.0, 1.0))
        bdl.sample("x", dist.Normal(z @ W.T + c[..., None], SIGMA), obs=X[idx], shape=(D,))


def _fit(model, guide, **kw):
    return bdl.fit(
        model,
        backend="pyro",
        method="vi",
        guide=guide,
        num_steps=5,
        num_samples=2,
        progress=False,
        precision="float64",
        **kw,
    )


def test_errors_name_what_is_wrong():
    with pytest.raises(ModelError, match=r"\['c'\] sit in the data plate"):
        _fit(two_locals(X), guides.Amortized(_encoder(), sites=["z"]))
    with pytest.raises(ModelError, match="needs \\(2, 6\\): 2 x \\(2 \\(z\\) \\+ 1 \\(c\\)\\)"):
        _fit(two_locals(X), guides.Amortized(_encoder(), sites=["z", "c"]))
    with pytest.raises(ModelError, match="'w' is not a latent site"):
        _fit(ppca_fixed(X), guides.Amortized(_encoder(), sites=["w"]))
    with pytest.raises(ModelError, match="site 'W' sits in the plates none"):
        _fit(ppca_bayes(X), guides.Amortized(_encoder(), sites=["z", "W"]))
    with pytest.raises(ConfigError, match="no argument 'Y'"):
        _fit(ppca_fixed(X), guides.Amortized(_encoder(), inputs="Y"))
    with pytest.raises(ConfigError, match="no latent site outside the amortized sites"):
        _fit(ppca_fixed(X), guides.Amortized(_encoder()), init_scale=0.1)
    with pytest.raises(ConfigError, match="unknown option"):
        _fit(ppca_bayes(X), guides.Amortized(_encoder()), rank=2)
    with pytest.raises(ConfigError, match="unknown Amortized family"):
        guides.Amortized(_encoder(), family="flow")
    with pytest.raises(ConfigError, match="ppl_bdl.dsl.nn network"):
        guides.Amortized(lambda x: x)
    with pytest.raises(ConfigError, match="distinct site names"):
        guides.Amortized(_encoder(), sites=["z", "z"])
    post = _fit(ppca_fixed(X), guides.Amortized(_encoder()))
    with pytest.raises(DataError, match=r"rows of shape \(4,\)"):
        post.encode(np.zeros((3, 5)))
    with pytest.raises(ConfigError, match="num_particles must be an int"):
        post.log_marginal(X, num_particles=0)
    mf = _fit(ppca_bayes(X[:20]), "meanfield")
    with pytest.raises(ConfigError, match="needs an amortized guide"):
        mf.encode(X)
