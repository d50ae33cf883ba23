"""HMC tuned by the ELBO (``bdl.HMC(adapt="elbo")``): its options' checks, the objective's
gradient against finite differences, the tuned mass and the draws on an anisotropic Gaussian
(known exactly), and ESS per gradient against dual averaging on an ill-conditioned regression."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.elbo_tuning import ElboTuning, elbo_objective
from ppl_bdl.inference.setup import prepare
from ppl_bdl.models import regression
from ppl_bdl.posterior.diagnostics import ConvergenceWarning
from ppl_bdl.trace.layout import ModelDensity

MEANS = np.array([0.5, -1.0, 2.0])
SCALES = np.array([0.1, 1.0, 5.0])


@bdl.model
def anisotropic():
    bdl.sample("x", dist.Normal(MEANS, SCALES))


def _fit(bound, backend="numpyro", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(bound, backend=backend, progress=False, seed=0, **options)


# -- construction -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, words",
    [
        (dict(adapt="warmup"), ["adapt", "'warmup'", "'dual_averaging', 'elbo'"]),
        (dict(adapt="elbo", elbo_steps=0), ["elbo_steps", "0", ">= 1"]),
        (dict(adapt="elbo", elbo_lr=-0.1), ["elbo_lr", "-0.1", "> 0"]),
        (dict(adapt="elbo", elbo_chain_length=1.5), ["elbo_chain_length", ">= 1"]),
        (dict(adapt="elbo", elbo_particles=True), ["elbo_particles", ">= 1"]),
        (dict(adapt="elbo", elbo_tune_init="yes"), ["elbo_tune_init", "True or False"]),
        (dict(adapt="elbo", elbo_init_scale=0.0), ["elbo_init_scale", "> 0"]),
        (dict(adapt="elbo", elbo_init_inflation=0.5), ["elbo_init_inflation", ">= 1"]),
        (dict(adapt="elbo", dense_mass=True), ["dense_mass", "diagonal"]),
        (dict(elbo_steps=50), ["elbo_steps", "adapt='elbo'"]),
    ],
)
def test_options_are_checked_at_construction(options, words):
    with pytest.raises(ConfigError) as error:
        bdl.HMC(**options)
    for word in words:
        assert word in str(error.value)


def test_nuts_refuses_elbo_tuning_and_says_to_use_hmc():
    for options in (dict(adapt="elbo"), dict(elbo_steps=10)):
        with pytest.raises(ConfigError, match=r"bdl.NUTS.*bdl.HMC\(adapt='elbo'"):
            bdl.NUTS(**options)
    with pytest.raises(ConfigError, match="bdl.HMC"):
        bdl.fit(anisotropic(), backend="numpyro", method="nuts", adapt="elbo")


def test_the_string_form_builds_the_same_method():
    config = bdl.HMC(adapt="elbo", elbo_steps=20, num_steps=4, step_size=0.2).elbo_config()
    assert config == ElboTuning(steps=20, num_steps=4, step_size=0.2)
    assert bdl.HMC(adapt="elbo").elbo_config() == ElboTuning()


# -- the objective's gradient ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
@pytest.mark.parametrize("accept", [True, False])
def test_objective_gradient_matches_finite_differences(backend, accept):
    """On a 3-d Gaussian in float64: the reparameterisation gradient through T = 2 moves of 3
    leapfrog steps equals central differences. Every proposal accepted (log u = −50), or every
    one rejected (log u = 50: z_T = z_0, the step size's gradient 0: the decision is a mask);
    q_0's mean and scale get the gradient of q_0's own ELBO."""
    setup = prepare(anisotropic(), backend, "float64", 0)
    b, m = setup.backend, setup.backend.math
    density = ModelDensity(setup.bound, b, setup.layout)
    config = ElboTuning(chain_length=2, num_steps=3, init_inflation=1.5)
    fn = elbo_objective(b, lambda z, data: density.value_and_grad(z, data), config)
    rng = np.random.default_rng(0)
    with b.scope(), b.activate():
        noise = [b.asarray(rng.normal(size=s)) for s in ((3,), (2, 3))]
        log_u = b.asarray(np.full(2, -50.0 if accept else 50.0))
        fixed = {"init_mean": b.asarray(MEANS + 0.3), "init_log_scale": b.asarray(np.log(SCALES))}
        point = {"log_step_size": np.log(0.05), "log_mass_factor": np.array([0.3, -0.2, 0.1])}

        surrogate = b.jit(lambda params: fn(params, fixed, *noise, log_u, density.data)[0])

        def value(params):
            return surrogate({k: b.asarray(v) for k, v in params.items()})

        point_arrays = {k: b.asarray(v) for k, v in point.items()}
        _, grads = b.value_and_grad(
            lambda p: fn(p, fixed, *noise, log_u, density.data), has_aux=True
        )(point_arrays)
        h = 1e-6
        for name, at in point.items():
            flat = np.atleast_1d(at).astype(float)
            numeric = []
            for i in range(flat.size):
                up, down = flat.copy(), flat.copy()
                up[i] += h
                down[i] -= h
                shape = np.shape(at)
                diff = float(value({**point, name: up.reshape(shape)}))
                diff -= float(value({**point, name: down.reshape(shape)}))
                numeric.append(diff / (2 * h))
            exact = np.atleast_1d(np.asarray(b.to_numpy(grads[name]), float))
            np.testing.assert_allclose(exact, numeric, rtol=1e-5, atol=1e-7)
        if not accept:
            assert float(m.abs(grads["log_step_size"])) == 0.0
        # q_0's own ELBO, -U(μ + σ ⊙ ξ) + Σ log σ, gives the gradient of its mean and scale
        init = {k: np.asarray(b.to_numpy(v), float) for k, v in fixed.items()}
        _, q0_grads = b.value_and_grad(
            lambda p: fn({**point_arrays, **p}, {}, *noise, log_u, density.data), has_aux=True
        )({k: b.asarray(v) for k, v in init.items()})

        def q0_elbo(mean, log_scale):
            z = b.asarray(mean + np.exp(log_scale) * b.to_numpy(noise[0]))
            return -float(density.value_and_grad(z, density.data)[0]) + log_scale.sum()

        for i in range(3):
            step = np.eye(3)[i] * h
            mean, log_scale = init["init_mean"], init["init_log_scale"]
            by_mean = (q0_elbo(mean + step, log_scale) - q0_elbo(mean - step, log_scale)) / (2 * h)
            by_scale = q0_elbo(mean, log_scale + step) - q0_elbo(mean, log_scale - step)
            np.testing.assert_allclose(float(q0_grads["init_mean"][i]), by_mean, rtol=1e-5)
            np.testing.assert_allclose(
                float(q0_grads["init_log_scale"][i]), by_scale / (2 * h), rtol=1e-5
            )


# -- an anisotropic Gaussian, known exactly ----------------------------------------------------
@pytest.fixture(scope="module")
def tuned_fit():
    method = bdl.HMC(adapt="elbo", elbo_steps=600, num_warmup=10, num_samples=1000, num_chains=2)
    return _fit(anisotropic(), method=method)


def test_tuned_inverse_mass_follows_the_target_variances(tuned_fit):
    mass = np.asarray(tuned_fit.settings["elbo_inverse_mass"])
    ratio = mass / SCALES**2  # a constant up to the tuning's error: the variances span 2500x
    assert ratio.max() / ratio.min() < 2.5, ratio
    assert tuned_fit.settings["elbo_step_size"] > 0
    objective = np.asarray(tuned_fit.settings["elbo_objective"])
    assert objective.shape == (600,) and objective[-50:].mean() > objective[:50].mean()


def test_draws_match_the_exact_mean_and_variance(tuned_fit):
    x = np.asarray(tuned_fit.samples["x"])
    ess = az.ess(tuned_fit.to_arviz())["x"].values
    assert ess.min() > 100, ess
    flat = x.reshape(-1, 3)
    mean_error = np.abs(flat.mean(0) - MEANS) / (SCALES / np.sqrt(ess))
    var_error = np.abs(flat.var(0) / SCALES**2 - 1) / np.sqrt(2 / ess)
    assert mean_error.max() < 4 and var_error.max() < 4, (mean_error, var_error)
    stats = tuned_fit.sample_stats
    assert {"acceptance_rate", "diverging", "n_steps", "step_size"} <= set(stats)
    assert np.all(np.asarray(stats["n_steps"]) == 10)


# -- an ill-conditioned posterior -----------------------------------------------------------------
def _ill_conditioned():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 6))
    X = (base + 0.8 * base[:, :1]) * np.logspace(-1, 1, 6)
    y = X @ rng.normal(size=6) + 0.5 * rng.normal(size=200)
    exact = regression.conjugate_posterior(X, y, noise=0.5, prior_scale=3.0)
    return regression.linear_regression_known_noise(X, y, noise=0.5, prior_scale=3.0), exact


@pytest.mark.slow
def test_tuned_and_dual_averaging_hmc_draw_the_exact_ill_conditioned_posterior():
    """A regression whose posterior sds span 100x (0.004-0.43), correlated: the ELBO-tuned HMC
    and HMC with Stan's warmup, both at 10 leapfrog steps a draw, have the exact posterior
    means within 4 MCSE; and Stan's warmup gives more effective draws per gradient, counting
    each method's tuning (``benchmarks/elbo_hmc.py`` prints the same comparison)."""
    (bound, (mean, cov)), draws = _ill_conditioned(), 2000
    tuned = _fit(bound, method=bdl.HMC(adapt="elbo", num_warmup=10, num_samples=draws))
    dual = _fit(bound, method=bdl.HMC(num_warmup=500, num_samples=draws, num_steps=10))
    sd = np.sqrt(np.diag(cov))
    per_gradient = {}
    for name, post in (("tuned", tuned), ("dual", dual)):
        ess = az.ess(post.to_arviz())["w"].values
        error = np.abs(post.samples["w"].reshape(-1, 6).mean(0) - mean) / (sd / np.sqrt(ess))
        assert error.max() < 4, (name, error, ess)
        per_gradient[name] = ess.min()
    config = bdl.HMC(adapt="elbo").elbo_config()
    tuning = config.steps * config.particles * (config.chain_length * config.num_steps + 2)
    per_gradient["tuned"] /= 4 * (draws + 10) * 10 + tuning
    per_gradient["dual"] /= 4 * (draws + 500) * 10
    assert per_gradient["dual"] > per_gradient["tuned"], per_gradient
