"""Discrete latent sites summed out by each backend's enumeration, against exact answers.

* A Gaussian mixture: the marginal log density of the continuous sites equals
  Σ_i log Σ_k w_k N(y_i | μ_k, s) plus the priors and the log-Jacobian (closed form), and the
  draws of the assignments given θ have the frequencies p(z_i = k | y_i, θ) ∝ w_k N(y_i | μ_k, s)
  (binomial Monte Carlo error, 4.5 standard errors).
* An HMM: the marginal log density equals the forward algorithm's log-likelihood plus the
  prior (Rabiner 1989, Eq. 19-21), and the state draws' frequencies match forward-backward's
  smoothed marginals (Eq. 27).
* End to end (NumPyro by default, Pyro under -m slow): NUTS on a conjugate mixture of N = 5
  points whose exact posterior is a sum over the 2^5 assignments, each a conjugate Gaussian:
  E[μ | y] and P(z_i = 1 | y) within 4 Monte Carlo standard errors.
"""

from __future__ import annotations

import itertools

import arviz as az
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.common import prepare
from ppl_bdl.trace.enumeration import posterior_draws
from ppl_bdl.trace.layout import ModelDensity

WEIGHTS = np.array([0.3, 0.7])
Y = np.array([-2.3, -1.1, 0.2, 1.4, 2.8, 0.9])


@bdl.model
def mixture(y, weights):
    locs = bdl.sample("locs", dist.Normal(np.array([-1.0, 1.0]), 2.0))
    scale = bdl.sample("scale", dist.HalfNormal(1.5))
    with bdl.plate("data", y.shape[0]) as idx:
        z = bdl.sample("z", dist.Categorical(probs=weights))
        bdl.sample("y", dist.Normal(locs[z], scale), obs=y[idx])


def _density(bound, backend):
    setup = prepare(bound, backend, "float64", 0)
    return setup, ModelDensity(setup.bound, setup.backend, setup.layout, setup.params)


def _potential(density, backend, flat):
    with backend.scope(), backend.activate():
        return float(backend.to_numpy(density.potential(backend.asarray(flat))))


def test_mixture_marginal_density_is_the_closed_form(backend):
    setup, density = _density(mixture(Y, WEIGHTS), backend)
    assert setup.layout.discrete == ["z"] and setup.layout.names == ["locs", "scale"]
    rng = np.random.default_rng(0)
    for _ in range(3):
        locs, log_scale = rng.normal(size=2), rng.normal(scale=0.3)
        scale = np.exp(log_scale)
        expected = (
            stats.norm.logpdf(locs, [-1.0, 1.0], 2.0).sum()
            + stats.halfnorm.logpdf(scale, scale=1.5)
            + log_scale  # log-Jacobian of scale = exp(u)
            + logsumexp(np.log(WEIGHTS) + stats.norm.logpdf(Y[:, None], locs, scale), axis=1).sum()
        )
        got = -_potential(density, setup.backend, np.r_[locs, log_scale])
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)


def _assignment_probs(locs, scale):
    logp = np.log(WEIGHTS) + stats.norm.logpdf(Y[:, None], locs, scale)
    return np.exp(logp - logsumexp(logp, axis=1, keepdims=True))


def test_mixture_assignment_draws_match_their_conditional(backend):
    setup, density = _density(mixture(Y, WEIGHTS), backend)
    locs, scale = np.array([-1.5, 1.0]), 0.8
    draws = 1000 if backend != "pyro" else 400  # Pyro draws eagerly, one at a time
    flat = np.tile(np.r_[locs, np.log(scale)], (1, draws, 1))
    z = posterior_draws(density, flat, seed=1)["z"]
    assert z.shape == (1, draws, len(Y))
    exact = _assignment_probs(locs, scale)[:, 1]
    freq = z[0].mean(axis=0)
    se = np.sqrt(exact * (1 - exact) / draws)
    np.testing.assert_array_less(np.abs(freq - exact), 4.5 * se + 1e-12)


TRANS = np.array([[0.8, 0.2], [0.3, 0.7]])
HMM_Y = np.array([-1.2, -0.4, 0.9, 1.3, -0.2, 1.1, 0.8])


@bdl.model
def hmm(y, trans, scale):
    locs = bdl.sample("locs", dist.Normal(np.array([-1.0, 1.0]), 1.0))

    def step(z_prev, y_t):
        z = bdl.sample("z", dist.Categorical(probs=trans[z_prev]))
        bdl.sample("y", dist.Normal(locs[z], scale), obs=y_t)
        return z, None

    bdl.scan(step, 0, y)


def _forward_backward(locs, scale):
    """log p(y) and the smoothed marginals p(z_t | y) (Rabiner 1989, Eq. 19-21, 27); the chain
    starts in state 0 before the first step."""
    log_e = stats.norm.logpdf(HMM_Y[:, None], locs, scale)
    log_t = np.log(TRANS)
    alpha = [log_t[0] + log_e[0]]
    for t in range(1, len(HMM_Y)):
        alpha.append(logsumexp(alpha[-1][:, None] + log_t, axis=0) + log_e[t])
    beta = [np.zeros(2)]
    for t in range(len(HMM_Y) - 1, 0, -1):
        beta.insert(0, logsumexp(log_t + log_e[t] + beta[0], axis=1))
    loglik = logsumexp(alpha[-1])
    marginals = np.exp(np.array(alpha) + np.array(beta) - loglik)
    return loglik, marginals


def test_hmm_marginal_density_is_the_forward_algorithm(backend):
    setup, density = _density(hmm(HMM_Y, TRANS, 0.7), backend)
    assert setup.layout.discrete == ["z"]
    for locs in (np.array([-1.0, 1.0]), np.array([0.3, -0.5])):
        loglik, _ = _forward_backward(locs, 0.7)
        expected = loglik + stats.norm.logpdf(locs, [-1.0, 1.0], 1.0).sum()
        got = -_potential(density, setup.backend, locs)
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_hmm_state_draws_match_forward_backward(backend):
    setup, density = _density(hmm(HMM_Y, TRANS, 0.7), backend)
    locs = np.array([-0.8, 1.0])
    draws = 1000 if backend != "pyro" else 400
    z = posterior_draws(density, np.tile(locs, (1, draws, 1)), seed=2)["z"]
    assert z.shape == (1, draws, len(HMM_Y))
    exact = _forward_backward(locs, 0.7)[1][:, 1]
    freq = z[0].mean(axis=0)
    se = np.sqrt(exact * (1 - exact) / draws)
    np.testing.assert_array_less(np.abs(freq - exact), 4.5 * se + 1e-12)


# -- end to end: a conjugate mixture with a closed-form posterior --------------------------------
CONJ_Y = np.array([-2.2, -1.6, 0.3, 1.7, 2.4])
PRIOR_LOCS, PRIOR_SD, NOISE = np.array([-2.0, 2.0]), 1.5, 1.0


@bdl.model
def conjugate_mixture(y):
    locs = bdl.sample("locs", dist.Normal(PRIOR_LOCS, PRIOR_SD))
    with bdl.plate("data", y.shape[0]) as idx:
        z = bdl.sample("z", dist.Categorical(probs=np.array([0.5, 0.5])))
        bdl.sample("y", dist.Normal(locs[z], NOISE), obs=y[idx])


def _exact_posterior():
    """E[locs | y] and P(z_i = 1 | y), summing over all 2^N assignments: given z, each
    component's mean has a conjugate normal posterior and its points a joint normal marginal."""
    log_w, means, z_all = [], [], []
    for z in itertools.product([0, 1], repeat=len(CONJ_Y)):
        z = np.array(z)
        lw, mean = len(z) * np.log(0.5), np.zeros(2)
        for k in range(2):
            yk = CONJ_Y[z == k]
            cov = NOISE**2 * np.eye(len(yk)) + PRIOR_SD**2
            if len(yk):
                lw += stats.multivariate_normal.logpdf(yk, np.full(len(yk), PRIOR_LOCS[k]), cov)
            precision = 1 / PRIOR_SD**2 + len(yk) / NOISE**2
            mean[k] = (PRIOR_LOCS[k] / PRIOR_SD**2 + yk.sum() / NOISE**2) / precision
        log_w.append(lw), means.append(mean), z_all.append(z)
    w = np.exp(np.array(log_w) - logsumexp(log_w))
    return w @ np.array(means), w @ np.array(z_all)


def _check_conjugate_mixture(backend, **settings):
    post = bdl.fit(conjugate_mixture(CONJ_Y), backend=backend, seed=0, progress=False, **settings)
    exact_locs, exact_z = _exact_posterior()
    locs, z = post.samples["locs"], post.samples["z"]
    assert z.dtype.kind == "i" and set(np.unique(z)) <= {0, 1}
    for k in range(2):
        draws = locs[..., k]
        mcse = draws.std() / np.sqrt(float(az.ess(draws, method="mean")))
        assert abs(draws.mean() - exact_locs[k]) < 4 * mcse, (k, draws.mean(), exact_locs[k])
    for i in range(len(CONJ_Y)):
        draws = z[..., i].astype(float)
        ess = float(az.ess(draws, method="mean")) if draws.std() > 0 else draws.size
        se = np.sqrt(exact_z[i] * (1 - exact_z[i]) / ess)
        assert abs(draws.mean() - exact_z[i]) < 4 * se + 0.01, (i, draws.mean(), exact_z[i])


def test_nuts_on_a_conjugate_mixture_matches_its_exact_posterior():
    _check_conjugate_mixture("numpyro", num_warmup=300, num_samples=1000, num_chains=2)


@pytest.mark.slow
def test_nuts_on_a_conjugate_mixture_matches_its_exact_posterior_on_pyro():
    _check_conjugate_mixture("pyro", num_warmup=300, num_samples=600, num_chains=2)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sgld", "vi"])
def test_other_methods_sum_the_assignments_out(backend, method):
    """Full-batch SG-MCMC and VI on the same posterior: loose checks (their bias is the
    method's), that each moves the means to the right place. Both start at the prior means:
    the posterior has a minor label-switched mode that a chain started there can stay in."""
    options = (
        dict(method="vi", num_steps=1500, lr=0.05, num_samples=1000)
        if method == "vi"
        else dict(
            method="sgld",
            step_size=2e-3,
            num_warmup=1000,
            num_samples=2000,
            num_chains=2,
            init={"locs": PRIOR_LOCS},
        )
    )
    post = bdl.fit(conjugate_mixture(CONJ_Y), backend=backend, seed=0, progress=False, **options)
    exact_locs, _ = _exact_posterior()
    np.testing.assert_allclose(post.samples["locs"].mean(axis=(0, 1)), exact_locs, atol=0.35)


# -- errors ---------------------------------------------------------------------------------------
@bdl.model
def poisson_latent(y):
    rate = bdl.sample("rate", dist.HalfNormal(3.0))
    k = bdl.sample("k", dist.Poisson(rate))
    bdl.sample("y", dist.Normal(k, 1.0), obs=y)


@bdl.model
def vector_discrete(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    z = bdl.sample("z", dist.Bernoulli(probs=0.5), shape=(3,))
    bdl.sample("y", dist.Normal(mu + z, 1.0), obs=y)


def test_unsupported_discrete_latents_are_refused_clearly():
    with pytest.raises(ModelError, match=r"'k' \(Poisson\) has an infinite support"):
        bdl.fit(poisson_latent(np.array(2.0)), backend="numpyro", progress=False)
    with pytest.raises(ModelError, match=r"'z' has \(3,\) values per draw outside plates"):
        bdl.fit(vector_discrete(np.zeros(3)), backend="numpyro", progress=False)


def test_minibatches_are_refused_with_discrete_latents():
    with pytest.raises(ConfigError, match="takes no minibatches. Fit without batch_size"):
        bdl.fit(
            mixture(Y, WEIGHTS),
            backend="numpyro",
            method="sgld",
            batch_size=3,
            num_warmup=5,
            num_samples=5,
            progress=False,
        )


def test_prediction_at_new_points_draws_their_assignments_from_the_prior():
    post = bdl.fit(
        conjugate_mixture(CONJ_Y),
        backend="numpyro",
        num_warmup=50,
        num_samples=20,
        num_chains=1,
        progress=False,
        seed=0,
    )
    at_training = post.predict(conjugate_mixture(CONJ_Y), seed=1)
    assert at_training.draws["y"].shape == (20, len(CONJ_Y))
    new = post.predict(conjugate_mixture(np.array([0.0, 1.0, 2.0])), seed=1)
    assert new.draws["z"].shape == (20, 3) and new.draws["y"].shape == (20, 3)


def test_lowered_models_mark_discrete_sites_for_the_backends_own_nuts():
    import jax
    import numpyro

    native = conjugate_mixture(CONJ_Y).lower("numpyro")
    mcmc = numpyro.infer.MCMC(
        numpyro.infer.NUTS(native), num_warmup=300, num_samples=1000, progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(0))
    locs = np.asarray(mcmc.get_samples()["locs"])
    exact_locs, _ = _exact_posterior()
    mcse = locs.std(axis=0) / np.sqrt([float(az.ess(locs[None, :, k])) for k in range(2)])
    np.testing.assert_array_less(np.abs(locs.mean(axis=0) - exact_locs), 4 * mcse)

    from pyro import poutine

    trace = poutine.trace(conjugate_mixture(CONJ_Y).lower("pyro")).get_trace()
    assert trace.nodes["z"]["infer"] == {"enumerate": "parallel"}
