"""SG-MCMC step sizes chosen by the pilot (``step_size="auto"``, the default), and starting points
where chains can mix: on the shipped BNN where the old docs' value diverged, on a conjugate model
against the exact posterior, and on a UCI BNN started from the prior."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.inference.mcmc.step_size import GRID, SAFETY_FACTOR, climbs
from ppl_bdl.models import bnn, regression


def test_climbs_tells_unstable_from_settling_and_stationary():
    rng = np.random.default_rng(0)
    t = np.arange(100)
    settling = 500 * np.exp(-t / 10) + rng.normal(size=100)
    stationary = 10 + rng.normal(size=100)
    exploding = 1.1**t
    # jumps within its first quarter and stays up: the first quarter's median is already high
    jumped = np.where(t < 3, 0.0, 400.0) + 3 * rng.normal(size=100)
    thermalising = 5 * (1 - np.exp(-t / 10)) + rng.normal(size=100)  # from a mode: +d/2
    assert not climbs(settling[None], dim=10)
    assert not climbs(stationary[None], dim=10)
    assert not climbs(thermalising[None], dim=10)
    assert climbs(exploding[None], dim=10)
    assert climbs(jumped[None], dim=10)
    assert climbs(np.stack([stationary, exploding]), dim=10)  # any chain


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_auto_works_where_the_old_docs_value_diverged(backend, method):
    """The issue's case: SGHMC with step_size=1e-4 diverged at step 2 on a 1-D BNN regression with
    20 hidden units. With the default (auto) step size the fit runs and the chosen value is kept."""
    X, y = regression.sine_data()
    model = bnn.make_bnn_regression(hidden=(20,))
    post = bdl.fit(
        model(X, y),
        backend=backend,
        method=method,
        batch_size=20,
        num_warmup=500,
        num_samples=200,
        num_chains=2,
        init="median",
        seed=0,
        progress=False,
    )
    chosen = post.settings["step_size"]
    assert chosen in {g * SAFETY_FACTOR for g in GRID}
    assert np.all(np.isfinite(post.samples["net.0.weight"]))
    np.testing.assert_allclose(post.sample_stats["step_size"], chosen, rtol=1e-6)
    # it predicts: the held-out RMSE is far below the data's spread
    assert post.predict(model(X)).rmse(y) < 0.6 * y.std()


@bdl.model
def gaussian_mean(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_auto_recovers_a_conjugate_posterior(backend):
    y = np.random.default_rng(3).normal(2.0, 1.0, size=200)
    precision = 1 / 100 + y.size
    mean, sd = y.sum() / precision, 1 / np.sqrt(precision)
    post = bdl.fit(
        gaussian_mean(y),
        backend=backend,
        method="sgld",
        batch_size=50,
        num_warmup=1000,
        num_samples=3000,
        num_chains=2,
        seed=1,
        progress=False,
    )
    mu = post.samples["mu"].ravel()
    # A few hundred effective draws: the mean is within 0.3 sd; the sd within 25% (step-size bias
    # and minibatch noise inflate it a little).
    assert abs(mu.mean() - mean) < 0.3 * sd
    assert abs(mu.std() / sd - 1) < 0.25


@bdl.model
def nowhere_finite():
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("nan", bm.log(x - x - 1.0))  # log(-1): NaN everywhere


def test_auto_says_when_no_step_size_works(backend):
    with pytest.raises(bdl.InferenceError, match="found no step size"):
        bdl.fit(
            nowhere_finite(),
            backend=backend,
            method="sgld",
            num_warmup=5,
            num_samples=5,
            num_chains=1,
            progress=False,
        )


def test_median_start_is_jittered_per_chain(backend):
    X, y = regression.sine_data()
    post = bdl.fit(
        bnn.make_bnn_regression(hidden=(5,))(X, y),
        backend=backend,
        method="sgld",
        step_size=1e-6,
        num_warmup=0,
        num_samples=1,
        num_chains=3,
        init="median",
        progress=False,
    )
    w = post.samples["net.0.weight"][:, 0]
    assert not np.allclose(w[0], w[1]) and np.abs(w).max() < 1.0  # near the prior's centre (0)


def test_a_vi_fit_starts_the_chains(backend):
    y = np.random.default_rng(3).normal(2.0, 1.0, size=100)
    vi = bdl.fit(
        gaussian_mean(y),
        backend=backend,
        method="vi",
        num_steps=500,
        lr=0.05,
        num_samples=4,
        progress=False,
    )
    post = bdl.fit(
        gaussian_mean(y),
        backend=backend,
        method="sgld",
        step_size=1e-5,
        num_warmup=0,
        num_samples=1,
        num_chains=4,
        init=vi,
        progress=False,
    )
    # one SGLD step of 1e-5 from each of the VI draws
    np.testing.assert_allclose(post.samples["mu"][:, 0], vi.samples["mu"][0], atol=0.05)


def _uci(name: str):
    root = Path(
        os.environ.get("PPL_BDL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    folder = root / "uci" / name
    if not folder.is_dir():
        pytest.skip(f"the UCI data is not here ({folder}): it comes with ../shared/data")
    data = np.loadtxt(folder / "data.txt")
    features = np.loadtxt(folder / "index_features.txt", dtype=int)
    target = int(np.loadtxt(folder / "index_target.txt"))
    train = np.loadtxt(folder / "index_train_0.txt", dtype=int)
    X, y = data[train][:, features], data[train][:, target]
    X = (X - X.mean(0)) / X.std(0)
    return X, (y - y.mean()) / y.std()


@pytest.mark.slow
def test_a_uci_bnn_started_from_the_prior_runs(backend):
    """init="prior" reached NaN at step 2 on a UCI BNN with a fixed step size; the pilot starts
    from the same points and picks a step size they survive."""
    X, y = _uci("concrete")
    model = bnn.make_bnn_regression(hidden=(50,), activation="relu")
    post = bdl.fit(
        model(X, y),
        backend=backend,
        method="sghmc",
        batch_size=32,
        num_warmup=1000,
        num_samples=200,
        num_chains=2,
        init="prior",
        seed=0,
        progress=False,
    )
    assert np.all(np.isfinite(post.samples["net.0.weight"]))
    assert post.predict(model(X)).rmse(y) < 0.9
