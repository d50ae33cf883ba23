"""Replica exchange SG-MCMC (bdl.ReSGLD, bdl.ReSGHMC; Deng et al. 2020): its options, the swap
rule against NumPy, the minibatch correction's variance, and mode hopping on a bimodal target."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.backend_protocol import Batch
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.kernels.replica_exchange import (
    make_swap,
    swap_log_ratios,
)
from ppl_bdl.inference.mcmc.replica_exchange import ladder_energies
from ppl_bdl.inference.methods import resolve_method
from ppl_bdl.inference.setup import prepare
from ppl_bdl.posterior.diagnostics import ConvergenceWarning
from ppl_bdl.trace.layout import ModelDensity

LADDER = (1.0, 3.0, 9.0, 27.0)
WEIGHT = 0.3  # of the mode at −4


@bdl.model
def bimodal():
    """x ~ 0.3 N(−4, 0.5²) + 0.7 N(4, 0.5²): the barrier at 0 is 32 nats above the modes."""
    mixing = dist.Categorical(probs=np.array([WEIGHT, 1.0 - WEIGHT]))
    bdl.sample(
        "x", dist.MixtureSameFamily(mixing, dist.Normal(np.array([-4.0, 4.0]), np.full(2, 0.5)))
    )


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _bimodal_fit(method: str, num_samples: int, num_chains: int, **options):
    with warnings.catch_warnings():  # a chain stuck in one mode disagrees with the others
        warnings.simplefilter("ignore", ConvergenceWarning)
        return _fit_bimodal(method, num_samples, num_chains, **options)


def _fit_bimodal(method: str, num_samples: int, num_chains: int, **options):
    return bdl.fit(
        bimodal(),
        backend="numpyro",
        method=method,
        step_size=0.02,
        num_warmup=200,
        num_samples=num_samples,
        num_chains=num_chains,
        init={"x": 4.0},  # every chain starts in the heavier mode
        progress=False,
        seed=1,
        **options,
    )


# -- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "temperatures",
    [(2.0, 4.0), (1.0,), (1.0, 1.0, 2.0), (1.0, 4.0, 2.0), "1,2", (1.0, float("inf")), (1.0, True)],
)
def test_bad_ladders_are_refused_naming_the_option(temperatures):
    with pytest.raises(ConfigError, match=r"ReSGLD\(temperatures=.*starting at 1.0|tuple"):
        bdl.ReSGLD(temperatures=temperatures)


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"swap_every": 0}, r"ReSGHMC\(swap_every=0\): swap_every must be an int >= 1"),
        ({"correction_factor": 0.5}, r"correction_factor must be a number >= 1"),
        ({"correction": "yes"}, r"correction must be True or False"),
        ({"control_variate": "svrg"}, r"takes no control variate"),
        ({"temperature": 2.0}, r"temperatures=\(1.0, \.\.\.\)"),
        ({"momentum_decay": 2.0}, r"momentum_decay must be in \[0, 1\]"),
    ],
)
def test_bad_options_are_refused(options, pattern):
    with pytest.raises(ConfigError, match=pattern):
        bdl.ReSGHMC(**options)


def test_the_string_form_builds_the_same_object():
    given = {"temperatures": (1.0, 2.0), "swap_every": 3, "step_size": 1e-3}
    assert resolve_method("resgld", given) == bdl.ReSGLD(**given)
    assert resolve_method("resghmc", {"friction": 0.5}) == bdl.ReSGHMC(friction=0.5)


# -- the swap rule ---------------------------------------------------------------------------
def _numpy_log_ratios(energies, taus, variances, factor):
    betas = 1.0 / np.asarray(taus)
    dbeta = betas[:-1] - betas[1:]
    return dbeta * (energies[:-1] - energies[1:] - dbeta * variances / (2.0 * factor))


def test_swap_log_ratios_match_numpy():
    backend = bdl.backends.get("numpyro", precision="float64")
    energies, variances = np.array([5.0, 3.0, 4.5, 1.0]), np.array([2.0, 0.5, 8.0])
    with backend.scope(), backend.activate():
        got = swap_log_ratios(
            backend.asarray(energies),
            backend.asarray(1.0 / np.array(LADDER)),
            backend.asarray(variances),
            2.0,
        )
    expected = _numpy_log_ratios(energies, LADDER, variances, 2.0)
    np.testing.assert_allclose(backend.to_numpy(got), expected, rtol=1e-12)


def test_one_swap_step_accepts_at_the_exact_rate_and_moves_states_with_momenta():
    """Fixed energies: each proposed pair swaps with probability min(1, exp(log ratio)); the
    swapped slots exchange positions, velocities rescaled by √(τ_to / τ_from)."""
    import jax

    backend = bdl.backends.get("numpyro", precision="float64")
    taus = np.array(LADDER)
    energies, variances = np.array([5.0, 6.0, 4.0, 4.5]), np.array([1.0, 0.0, 3.0])
    rates = np.minimum(1.0, np.exp(_numpy_log_ratios(energies, taus, variances, 1.0)))
    swap = make_swap(taus, 1, 1.0, momentum=True)
    positions = np.arange(8.0).reshape(4, 2)
    with backend.scope(), backend.activate():
        state = {
            "position": backend.asarray(positions),
            "velocity": backend.asarray(positions + 100.0),
            "count": backend.asarray(0.0),  # turn 0: the even pairs (0, 1), (2, 3)
            "swaps_proposed": backend.asarray(np.zeros(3)),
            "swaps_accepted": backend.asarray(np.zeros(3)),
        }
        u, v = backend.asarray(energies), backend.asarray(variances)
        grads = backend.asarray(-positions)

        def one(key):
            moved, _, moved_grads = swap(key, state, u, v, grads)
            return moved, moved_grads

        keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
        moved, moved_grads = jax.jit(jax.vmap(one))(keys)
    accepted = np.asarray(moved["swaps_accepted"])
    np.testing.assert_array_equal(np.asarray(moved["swaps_proposed"][0]), [1.0, 0.0, 1.0])
    for pair in (0, 2):  # binomial error of 20,000 proposals
        sd = np.sqrt(rates[pair] * (1 - rates[pair]) / len(keys))
        assert abs(accepted[:, pair].mean() - rates[pair]) < 4 * sd + 1e-12
    assert accepted[:, 1].sum() == 0  # an odd pair on an even turn
    swapped = accepted[:, 0] > 0
    pos, vel = np.asarray(moved["position"]), np.asarray(moved["velocity"])
    np.testing.assert_array_equal(
        pos[swapped][:, 0], np.broadcast_to(positions[1], (swapped.sum(), 2))
    )
    shape = (swapped.sum(), 2)
    down, up = (positions[1] + 100.0) / np.sqrt(3.0), (positions[0] + 100.0) * np.sqrt(3.0)
    np.testing.assert_allclose(vel[swapped][:, 0], np.broadcast_to(down, shape))
    np.testing.assert_allclose(vel[swapped][:, 1], np.broadcast_to(up, shape))
    np.testing.assert_array_equal(
        np.asarray(moved_grads)[swapped][:, 0], np.broadcast_to(-positions[1], shape)
    )
    assert 0 < swapped.sum() < len(keys)
    np.testing.assert_array_equal(
        pos[~swapped][:, 0], np.broadcast_to(positions[0], ((~swapped).sum(), 2))
    )


def test_the_minibatch_variance_of_the_energy_differences_matches_numpy():
    """σ̂² of Ũ_k − Ũ_{k+1} is N² (1 − B/N) s²_d / B from the batch's per-point log densities,
    and Ũ_k is the model's minibatch potential."""
    y = np.random.default_rng(0).normal(size=50)
    setup = prepare(mean_model(y), "numpyro", "float64", 0)
    backend, batch_index = setup.backend, np.array([3, 7, 11, 20, 41])
    mus = np.array([[0.0], [0.5], [-1.0]])
    with backend.scope(), backend.activate():
        energies = ladder_energies(setup, 3, ("data", 50), 5, True)
        data = setup.bound.data_arrays(backend)[0]
        indices = backend.asarray(batch_index, dtype="int")
        (_, (potentials, variances)), grads = energies(backend.asarray(mus), Batch(data, indices))
        density = ModelDensity(setup.bound, backend, setup.layout)
        exact = [float(density.potential(backend.asarray(m), data, {"data": indices})) for m in mus]
    np.testing.assert_allclose(backend.to_numpy(potentials), exact, rtol=1e-10)
    points = -0.5 * (y[batch_index][None, :] - mus) ** 2  # log N(y | μ, 1) up to a constant
    diffs = points[:-1] - points[1:]
    expected = 50**2 * (1 - 5 / 50) * diffs.var(axis=1, ddof=1) / 5
    np.testing.assert_allclose(backend.to_numpy(variances), expected, rtol=1e-10)
    assert np.asarray(backend.to_numpy(grads)).shape == (3, 1)


# -- fits ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_fits():
    return {
        "sgld": _bimodal_fit("sgld", 2000, 2),
        "resgld": _bimodal_fit("resgld", 2000, 2, temperatures=LADDER),
    }


def test_single_temperature_sgld_stays_in_one_mode(short_fits):
    below = (short_fits["sgld"].samples["x"] < 0).mean(axis=1)
    assert set(below.tolist()) <= {0.0, 1.0}


def test_the_temperature_one_replica_visits_both_modes(short_fits):
    post = short_fits["resgld"]
    below = (post.samples["x"] < 0).mean(axis=1)
    assert np.all((below > 0.05) & (below < 0.95)), below
    # every draw sits in one of the modes, as the temperature-1 target's do
    assert np.all(np.abs(np.abs(post.samples["x"]) - 4.0) < 3.0)


def test_swap_rates_and_the_ladder_are_recorded(short_fits):
    settings = short_fits["resgld"].settings
    assert settings["temperatures"] == list(LADDER)
    rates = settings["swap_rates"]
    assert len(rates) == len(LADDER) - 1
    assert all(0.2 < r < 1.0 for r in rates), rates


@pytest.mark.slow  # ~15 s: 8 ladders of 20,000 steps
@pytest.mark.parametrize("method", ["resgld", "resghmc"])
def test_the_temperature_one_replica_carries_the_modes_at_their_weights(method):
    """Across 8 chains of 20,000 draws the fraction below 0 varies by about 0.03 from chain to
    chain, so the mean's Monte Carlo error is about 0.011; 0.045 is 4 of them."""
    post = _bimodal_fit(method, 20_000, 8, temperatures=LADDER)
    below = (post.samples["x"] < 0).mean(axis=1)
    assert abs(below.mean() - WEIGHT) < 0.045, below


@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_both_backends_sample_a_conjugate_posterior(backend):
    """A normal mean with known variance: the posterior is N(Σy / (n + 1/100), 1 / (n + 1/100));
    minibatches with the corrected swaps, two ladders (run side by side on NumPyro)."""
    y = np.random.default_rng(0).normal(loc=1.0, size=100)
    precision = len(y) + 1 / 100
    post = bdl.fit(
        mean_model(y),
        backend=backend,
        method=bdl.ReSGHMC(temperatures=(1.0, 2.0), momentum_decay=0.2),
        step_size=2e-3,
        batch_size=20,
        num_warmup=200,
        num_samples=600,
        num_chains=2,
        progress=False,
        seed=0,
    )
    draws = post.samples["mu"]
    assert draws.shape == (2, 600)
    # 1,200 autocorrelated draws: 0.05 is several Monte Carlo errors of the mean (sd 0.1)
    assert abs(draws.mean() - y.sum() / precision) < 0.05
    assert 0.05 < draws.std() < 0.2
    assert len(post.settings["swap_rates"]) == 1 and 0 < post.settings["swap_rates"][0] <= 1
