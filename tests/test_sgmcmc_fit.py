"""SG-MCMC through ``fit`` on both backends: exact posteriors recovered, chains, thinning, errors,
a user-registered kernel, and cyclical SG-MCMC on a multimodal target."""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl import random as br
from ppl_bdl.inference.mcmc.kernels import Kernel
from ppl_bdl.inference.mcmc.sgmcmc import _cyclical_plan


@bdl.model
def blr(X, y):
    """Conjugate Bayesian linear regression with known noise: w ~ N(0, I), y ~ N(Xw, 1)."""
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


@bdl.model
def gaussian(mu, sd):
    bdl.sample("x", dist.Normal(mu, sd))


def _blr_data(n: int = 100):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 2))
    y = X @ np.array([0.5, -0.3]) + rng.normal(size=n)
    cov = np.linalg.inv(X.T @ X + np.eye(2))
    return X, y, cov @ X.T @ y, np.sqrt(np.diag(cov))


#: Small steps relative to the curvature (N = 100 -> λ ≈ 100): αλ ≈ 0.05; minibatch B = 50.
BLR_SETTINGS = {
    "sgld": dict(step_size=5e-4),
    "sghmc": dict(step_size=2e-4, momentum_decay=0.5),
    "psgld": dict(step_size=5e-3),
}


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
@pytest.mark.parametrize("method", sorted(BLR_SETTINGS))
def test_conjugate_linear_regression_recovered(backend, method):
    X, y, mean, sd = _blr_data()
    post = bdl.fit(
        blr(X, y),
        backend=backend,
        method=method,
        batch_size=50,
        num_warmup=1000,
        num_samples=4000,
        num_chains=2,
        seed=0,
        progress=False,
        **BLR_SETTINGS[method],
    )
    w = post.samples["w"].reshape(-1, 2)
    # ~200 effective draws: the MC standard error is ~0.07 sd for the mean and ~5% for the sd;
    # the step size and the minibatch noise inflate the sd by a few percent more (pSGLD, which
    # leaves out the Γ(θ) correction of its preconditioner, by up to ~10%).
    np.testing.assert_array_less(np.abs(w.mean(0) - mean) / sd, 0.3)
    np.testing.assert_allclose(w.std(0) / sd, 1.0, atol=0.2 if method == "psgld" else 0.15)


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
@pytest.mark.parametrize("method", sorted(BLR_SETTINGS))
def test_gaussian_target_full_batch(backend, method):
    # Curvature 1/sd² = 0.25: αλ ≈ 0.05 (psgld's preconditioner is ≈ 2 here).
    settings = {
        "sgld": dict(step_size=0.2),
        "sghmc": dict(step_size=0.1, momentum_decay=0.5),
        "psgld": dict(step_size=0.1),
    }[method]
    post = bdl.fit(
        gaussian(1.0, 2.0),
        backend=backend,
        method=method,
        num_warmup=200,
        num_samples=4000,
        num_chains=2,
        seed=1,
        progress=False,
        **settings,
    )
    x = post.samples["x"]
    # ~150-200 effective draws (psgld's fewest): the tolerance is 4 MC standard errors of the
    # mean at the run's own ESS (about 0.6), and 20% for the sd.
    ess = float(az.ess(x))
    assert abs(x.mean() - 1.0) < 4 * 2.0 / np.sqrt(ess), (x.mean(), ess)
    assert x.std() == pytest.approx(2.0, rel=0.2)


def test_shapes_thinning_stats_and_arviz(backend):
    X, y, _, _ = _blr_data()
    post = bdl.fit(
        blr(X, y),
        backend=backend,
        method="sghmc",
        step_size=2e-4,
        batch_size=20,
        num_warmup=50,
        num_samples=30,
        thinning=3,
        num_chains=2,
        seed=0,
        progress=False,
    )
    assert post.samples["w"].shape == (2, 30, 2)
    assert set(post.sample_stats) == {"step_size", "grad_norm", "kinetic_energy", "potential"}
    assert all(v.shape == (2, 30) for v in post.sample_stats.values())
    idata = post.to_arviz()
    assert "sample_stats" in idata.groups() and "log_likelihood" in idata.groups()


def test_same_seed_same_draws_and_chains_independent_of_count(backend):
    X, y, _, _ = _blr_data()
    kw = dict(
        backend=backend,
        method="sgld",
        step_size=5e-4,
        batch_size=20,
        num_warmup=20,
        num_samples=20,
        seed=3,
        progress=False,
    )
    a = bdl.fit(blr(X, y), num_chains=2, **kw).samples["w"]
    b = bdl.fit(blr(X, y), num_chains=2, **kw).samples["w"]
    one = bdl.fit(blr(X, y), num_chains=1, **kw).samples["w"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(one[0], a[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(a[0], a[1])


@pytest.mark.parametrize("method", ["csgld", "csghmc"])
def test_cyclical_keeps_draws_only_in_sampling_stages(backend, method):
    X, y, _, _ = _blr_data()
    post = bdl.fit(
        blr(X, y),
        backend=backend,
        method=method,
        step_size=2e-4,
        batch_size=50,
        num_warmup=10,
        num_samples=40,
        num_cycles=2,
        thinning=2,
        num_chains=1,
        seed=0,
        progress=False,
    )
    assert post.samples["w"].shape == (1, 40, 2)
    assert np.all(post.sample_stats["exploring"] == 0.0)
    total, keep = _cyclical_plan(10, 80, 2, 0.8)
    assert keep.sum() >= 80 and total > 10 + 80


def test_schedules_through_fit(backend):
    X, y, _, _ = _blr_data()
    for schedule in ("polynomial", "cyclical"):
        post = bdl.fit(
            blr(X, y),
            backend=backend,
            method="sgld",
            step_size=5e-4,
            schedule=schedule,
            num_cycles=2,
            batch_size=50,
            num_warmup=10,
            num_samples=20,
            num_chains=1,
            progress=False,
        )
        sizes = post.sample_stats["step_size"][0]
        assert np.all(np.diff(sizes) < 0) if schedule == "polynomial" else sizes.max() <= 5e-4


# -- a user-registered kernel ----------------------------------------------------------------------
@bdl.kernels.register("sgnht", overwrite=True)
def sgnht(value_and_grad, diffusion: float = 1.0) -> Kernel:
    """Stochastic gradient Nosé-Hoover thermostat (Ding et al., 2014), in the learning-rate form:
    v ← v − ξ v − η ∇Ũ + √(2 A η) ε, θ ← θ + v, ξ ← ξ + (vᵀv / d − η)."""

    def init(position):
        return {
            "position": position,
            "velocity": bm.zeros_like(position),
            "xi": bm.sum(position * 0.0) + diffusion,
        }

    def step(key, state, minibatch, step_size):
        potential, grad = value_and_grad(state["position"], minibatch)
        noise = br.normal(key, tuple(state["position"].shape))
        v = state["velocity"]
        v = v - state["xi"] * v - step_size * grad + bm.sqrt(2.0 * diffusion * step_size) * noise
        xi = state["xi"] + bm.mean(v * v) - step_size
        new = {"position": state["position"] + v, "velocity": v, "xi": xi}
        info = {"step_size": step_size, "grad_norm": bm.norm(grad), "thermostat": xi}
        return new, dict(info, potential=potential)

    return Kernel(init, step)


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_user_registered_kernel_runs_through_fit(backend):
    assert "sgnht" in bdl.kernels.available()
    X, y, mean, sd = _blr_data()
    post = bdl.fit(
        blr(X, y),
        backend=backend,
        method="sgnht",
        step_size=2e-4,
        batch_size=50,
        num_warmup=500,
        num_samples=1500,
        num_chains=2,
        seed=0,
        progress=False,
        diffusion=0.5,
    )
    w = post.samples["w"].reshape(-1, 2)
    np.testing.assert_array_less(np.abs(w.mean(0) - mean) / sd, 0.5)
    assert "thermostat" in post.sample_stats


def test_a_kernels_pilot_margin_is_checked_and_kept():
    assert bdl.kernels.get("psgld").pilot_margin == 0.01  # its preconditioner hides a big step
    assert bdl.kernels.get("sgnht").pilot_margin == 0.1
    for bad in (0, 1.5, True, "0.1"):
        with pytest.raises(bdl.ConfigError, match="pilot_margin must be a number in"):
            bdl.kernels.register("bad_margin", pilot_margin=bad)


# -- a multimodal target --------------------------------------------------------------------------
CENTERS = np.array([[i, j] for i in (-6.0, 0.0, 6.0) for j in (-6.0, 0.0, 6.0)])


@bdl.model
def mixture(centers):
    """Nine unit Gaussians on a 3x3 grid, 6 apart (barriers of about 4 nats)."""
    x = bdl.sample("x", dist.Normal(0.0, 20.0), shape=(2,))
    bdl.factor("mixture", bm.logsumexp(-0.5 * bm.sum((x - centers) ** 2, axis=-1)))


def _modes_visited(x: np.ndarray) -> int:
    dist_to = np.linalg.norm(x[:, None, :] - CENTERS[None], axis=-1)
    near = dist_to.min(1) < 1.5
    return len(set(dist_to.argmin(1)[near].tolist()))


def _compare_modes(backend: str):
    cycles, exploration, step = 10, 0.5, 1.5
    total, _ = _cyclical_plan(0, 1000, cycles, exploration)
    common = dict(
        backend=backend,
        num_warmup=0,
        num_chains=4,
        seed=0,
        progress=False,
        init={"x": np.array([0.3, 0.2])},
        step_size=step,
    )
    csgld = bdl.fit(
        mixture(CENTERS),
        method="csgld",
        num_samples=1000,
        num_cycles=cycles,
        exploration=exploration,
        **common,
    )
    # The same number of gradient evaluations (steps) for SGLD with a decaying step size.
    sgld = bdl.fit(
        mixture(CENTERS), method="sgld", schedule="polynomial", num_samples=total, **common
    )
    visits_c = [_modes_visited(c) for c in csgld.samples["x"]]
    visits_s = [_modes_visited(c) for c in sgld.samples["x"]]
    assert sum(visits_c) > sum(visits_s), (visits_c, visits_s)


def test_csgld_visits_more_modes_than_decaying_sgld_numpyro():
    _compare_modes("numpyro")


@pytest.mark.slow
def test_csgld_visits_more_modes_than_decaying_sgld_pyro():
    _compare_modes("pyro")


# -- errors -----------------------------------------------------------------------------------------
@bdl.model
def with_discrete(y):
    z = bdl.sample("z", dist.Bernoulli(probs=0.5))
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu + z, 1.0), obs=y[idx])


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(step_size=0.0), bdl.ConfigError, "step_size must be a positive"),
        (dict(step_size=-1e-3), bdl.ConfigError, "step_size must be a positive"),
        (dict(step_size="big"), bdl.ConfigError, "positive number or .auto."),
        (dict(step_size=1e-3, batch_size=101), bdl.ConfigError, "batch_size=101 is larger"),
        (dict(step_size=1e-3, schedule="exponential"), bdl.ConfigError, "unknown schedule"),
        (dict(step_size=1e-3, frictionn=1.0), bdl.ConfigError, "unknown option"),
    ],
)
def test_bad_settings(backend, options, error, match):
    X, y, _, _ = _blr_data()
    with pytest.raises(error, match=match):
        bdl.fit(
            blr(X, y),
            backend=backend,
            method="sgld",
            num_warmup=5,
            num_samples=5,
            num_chains=1,
            progress=False,
            **options,
        )


def test_discrete_latents_are_summed_out_on_full_batches_and_refused_with_minibatches(backend):
    y = np.random.default_rng(0).normal(size=20)
    post = bdl.fit(
        with_discrete(y),
        backend=backend,
        method="sghmc",
        step_size=1e-3,
        num_warmup=5,
        num_samples=5,
        num_chains=1,
        progress=False,
    )
    assert set(np.unique(post.samples["z"])) <= {0, 1}  # drawn from p(z | mu, y) per draw
    with pytest.raises(bdl.ConfigError, match=r"discrete latent sites \['z'\].*without batch_size"):
        bdl.fit(
            with_discrete(y),
            backend=backend,
            method="sghmc",
            step_size=1e-3,
            batch_size=5,
            num_warmup=5,
            num_samples=5,
            num_chains=1,
            progress=False,
        )


def test_diverging_in_warmup_names_kernel_step_and_step_size(backend):
    X, y, _, _ = _blr_data()
    with pytest.raises(bdl.InferenceError) as info:
        bdl.fit(
            blr(X, y),
            backend=backend,
            method="sghmc",
            step_size=0.5,
            batch_size=50,
            num_warmup=500,
            num_samples=50,
            num_chains=2,
            progress=False,
        )
    message = str(info.value)
    assert "'sghmc'" in message and "at step" in message and "step size 0.5" in message
    assert "smaller step_size" in message and "No draws were kept" in message
    assert info.value.partial is None


def test_diverging_chain_partial_posterior(backend):
    X, y, _, _ = _blr_data()
    # Stable for the first steps of the cycle-free run, then the step size is far too large.
    with pytest.raises(bdl.InferenceError) as info:
        bdl.fit(
            blr(X, y),
            backend=backend,
            method="sgld",
            step_size=0.5,
            batch_size=50,
            num_warmup=0,
            num_samples=200,
            num_chains=1,
            seed=0,
            progress=False,
            init={"w": np.array([0.45, -0.2])},
        )
    err = info.value
    assert "step size 0.5" in str(err)
    assert err.partial is not None
    draws = err.partial.samples["w"]
    assert draws.shape[0] == 1 and 0 < draws.shape[1] < 200
    assert np.all(np.isfinite(draws))


@pytest.mark.parametrize("length", [7, 107, 250, 1000])
def test_the_cyclical_schedule_restarts_every_cycle_when_compiled(backend, length):
    """α_t = α_0/2 [cos(π mod(t, L)/L) + 1]: α_0 at the first step of every cycle. (XLA divides by
    multiplying with 1/L: a floor of t / L made the first step of a later cycle a step of 0.)"""
    from ppl_bdl.inference.mcmc.schedules import cyclical_step_size

    be = bdl.backends.get(backend)
    schedule = cyclical_step_size(1.0, 3 * length, 3)
    with be.activate():
        sizes = be.to_numpy(be.jit(schedule)(be.asarray(np.arange(3.0 * length))))
    t = np.arange(3 * length)
    np.testing.assert_allclose(sizes, 0.5 * (np.cos(np.pi * (t % length) / length) + 1), atol=1e-6)


def test_csghmc_crosses_into_its_second_cycle(backend):
    """Two cycles of 107 steps: the run used to stop at step 107 on NumPyro (a step size of 0
    made the kinetic energy infinite)."""
    y = np.random.default_rng(0).normal(size=600)
    post = bdl.fit(
        _mean3(y),
        backend=backend,
        method="csghmc",
        step_size=1e-4,
        num_cycles=2,
        num_warmup=0,
        num_samples=8,
        thinning=5,
        num_chains=1,
        batch_size=50,
        progress=False,
    )
    assert np.all(np.isfinite(post.sample_stats["kinetic_energy"]))
    assert post.samples["mu"].shape == (1, 8, 3)


@bdl.model
def _mean3(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0), shape=(3,))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu.sum(), 1.0), obs=y[idx])
