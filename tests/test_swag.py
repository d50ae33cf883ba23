"""SWA-Gaussian (method="swag"): the moments collected in the compiled step against NumPy, the
sampling formula's covariance, the SWA mean on a conjugate linear model against its closed
form, MultiSWAG's runs, the Posterior's export, prediction and saving, Ctrl-C, and the checks."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError, RunInterrupted
from ppl_bdl.inference.swag import SWAGMoments, collect_moments, init_moments
from ppl_bdl.trace.programs import clear_programs

SIGMA = 0.5


@bdl.model
def linear(X, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(bdl.math.matmul(X[idx], w), SIGMA), obs=y[idx])


def _data(n: int = 100):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, X @ np.array([1.0, -0.5]) + SIGMA * rng.normal(size=n)


X, Y = _data()
#: The exact posterior N(A⁻¹Xᵀy/σ², A⁻¹), A = XᵀX/σ² + I: its mean is the MAP.
PRECISION = X.T @ X / SIGMA**2 + np.eye(2)
EXACT_MEAN = np.linalg.solve(PRECISION, X.T @ Y / SIGMA**2)
EXACT_SD = np.sqrt(np.diag(np.linalg.inv(PRECISION)))

SWA = dict(num_steps=1500, swa_start=500, collect_every=5, rank=5, lr=1e-3, batch_size=10)


def _fit(backend: str, **options):
    return bdl.fit(linear(X, Y), backend=backend, method="swag", progress=False, seed=1, **options)


@pytest.fixture(scope="module", params=["numpyro", "pyro"])
def multiswag(request):
    """Two minibatched SWAG runs (MultiSWAG) of the linear model, on each backend."""
    return _fit(request.param, num_chains=2, num_samples=400, **SWA)


# -- the collection --------------------------------------------------------------------------------
def _numpy_moments(iterates: np.ndarray, rank: int):
    """θ̄, θ̄² and the ring of deviations θ_i − θ̄_i (column i mod K), from the iterates."""
    means = np.cumsum(iterates, axis=0) / np.arange(1, len(iterates) + 1)[:, None]
    ring = np.zeros((rank, iterates.shape[1]))
    for i, (theta, mean) in enumerate(zip(iterates, means, strict=True)):
        ring[i % rank] = theta - mean
    return iterates.mean(0), (iterates**2).mean(0), ring


def test_the_collection_step_matches_numpy(backend):
    """On a known sequence with some steps not collected: θ̄, θ̄², D and the count are NumPy's."""
    rng = np.random.default_rng(3)
    sequence = rng.normal(2.0, 1.5, size=(23, 3))
    collect = (rng.uniform(size=23) < 0.7).astype(float)
    be = bdl.backends.get(backend, "float64")
    with be.scope(), be.activate():
        m = be.math
        moments = init_moments(m, be.asarray(np.zeros(3)), rank=4)
        for theta, c in zip(sequence, collect, strict=True):
            moments = collect_moments(m, moments, be.asarray(theta), be.asarray(c))
        got = {k: np.asarray(be.to_numpy(v)) for k, v in moments.items()}
    mean, sq_mean, ring = _numpy_moments(sequence[collect == 1], 4)
    assert got["count"] == collect.sum()
    np.testing.assert_allclose(got["mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(got["sq_mean"], sq_mean, rtol=1e-12)
    np.testing.assert_allclose(got["deviations"], ring, atol=1e-12)


def _sgd_iterates(start: np.ndarray, lr: float, momentum: float, steps: int) -> np.ndarray:
    """Full-batch heavy-ball SGD on U(w) = ½|w|² + |y − Xw|²/(2σ²): v ← βv + ∇U, w ← w − lr v."""
    w, v, out = start.copy(), np.zeros_like(start), []
    for _ in range(steps):
        v = momentum * v + (w - X.T @ (Y - X @ w) / SIGMA**2)
        w = w - lr * v
        out.append(w)
    return np.array(out)


def test_a_run_collects_the_iterates_numpy_reproduces(backend):
    """Full-batch momentum SGD from a given start: the run's moments are those of its iterates
    t = swa_start + k·collect_every − 1 as NumPy computes them (float64)."""
    start = np.array([0.3, 0.2])
    options = dict(num_steps=60, swa_start=20, collect_every=4, rank=3, lr=1e-3, momentum=0.9)
    post = bdl.fit(
        linear(X, Y),
        backend=backend,
        method="swag",
        precision="float64",
        init={"w": start},
        num_samples=10,
        progress=False,
        **options,
    )
    iterates = _sgd_iterates(start, 1e-3, 0.9, 60)[20 + 4 - 1 :: 4]
    mean, sq_mean, ring = _numpy_moments(iterates, 3)
    params = post.guide.params
    assert params["count"].tolist() == [10.0]
    np.testing.assert_allclose(params["mean"][0], mean, rtol=1e-9)
    np.testing.assert_allclose(params["diag"][0], sq_mean - mean**2, rtol=1e-5, atol=1e-14)
    np.testing.assert_allclose(params["deviations"][0], ring, rtol=1e-6, atol=1e-12)


def test_draws_have_the_swag_covariance():
    """θ̄ + Σ_diag^½ z₁/√2 + D z₂/√(2(K−1)) has covariance ½(Σ_diag + DDᵀ/(K−1)): the sample
    covariance of 100,000 draws is within 5 Monte Carlo standard errors of it."""
    rng = np.random.default_rng(5)
    mean = rng.normal(size=(1, 4))
    sq_mean = mean**2 + rng.uniform(0.1, 1.0, size=(1, 4))
    deviations = rng.normal(size=(1, 3, 4))
    moments = SWAGMoments(np.array([7.0]), mean, sq_mean, deviations)
    draws = moments.sample(100_000, seed=0)[0]
    cov = moments.covariance(0)
    np.testing.assert_allclose(
        cov, 0.5 * (np.diag(sq_mean[0] - mean[0] ** 2) + deviations[0].T @ deviations[0] / 2)
    )
    error = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / len(draws))
    assert np.all(np.abs(np.cov(draws.T) - cov) < 5 * error)
    assert np.all(np.abs(draws.mean(0) - mean[0]) < 5 * np.sqrt(np.diag(cov) / len(draws)))


# -- fits ----------------------------------------------------------------------------------------
def test_the_swa_mean_is_the_exact_posterior_mean(multiswag):
    """Minibatched momentum SGD at a small constant lr: each run's SWA mean is within 0.2
    posterior sd of the exact posterior mean (the MAP of this Gaussian posterior)."""
    means = multiswag.guide.params["mean"]
    assert means.shape == (2, 2)
    assert np.all(np.abs(means - EXACT_MEAN) < 0.2 * EXACT_SD), (means, EXACT_MEAN)
    np.testing.assert_allclose(multiswag.guide.swa.samples["w"][:, 0], means, rtol=1e-5)
    assert multiswag.settings["collected"] == [200, 200]


def test_multiswag_runs_are_chains_of_draws(multiswag):
    draws = multiswag.samples["w"]
    assert draws.shape == (2, 400, 2) and multiswag.losses.shape == (2, 1500)
    assert not np.allclose(draws[0], draws[1])
    assert not multiswag.diagnostics  # independent draws: no mixing checks
    centre = draws.mean(1) - multiswag.guide.params["mean"]
    sd = np.sqrt(np.diagonal(multiswag.guide.moments.covariance(0)))
    assert np.all(np.abs(centre) < 5 * sd / np.sqrt(400))


def test_a_swag_posterior_exports_predicts_and_saves(multiswag, tmp_path):
    if multiswag.backend != "numpyro":
        pytest.skip("one backend is enough for the Posterior's own machinery")
    assert {"posterior", "log_likelihood", "observed_data"} <= set(multiswag.to_arviz().groups())
    pred = multiswag.predict(linear(X[:5], Y[:5]))
    assert pred.draws["y"].shape == (800, 5)
    np.testing.assert_allclose(pred.mean, X[:5] @ EXACT_MEAN, atol=0.1)
    back = bdl.load(multiswag.save(tmp_path / "swag.nc"), model=linear(X, Y))
    np.testing.assert_allclose(back.samples["w"], multiswag.samples["w"], rtol=1e-6)
    np.testing.assert_allclose(back.losses, multiswag.losses, rtol=1e-6)
    assert back.method == "swag" and back.settings["rank"] == 5


def test_cyclical_rates_collect_at_the_cycles_end():
    post = _fit("numpyro", schedule="cyclical", decay=0.05, num_samples=20, **SWA)
    assert post.settings["collected"] == [200]
    assert np.all(np.abs(post.guide.params["mean"][0] - EXACT_MEAN) < 0.2 * EXACT_SD)


def test_an_interrupted_run_keeps_the_moments_it_had(monkeypatch):
    """Ctrl-C in the second chunk: the partial posterior holds the moments of the first
    chunk's 300 steps (swa_start 100, every 5 steps: 40 iterates)."""
    clear_programs()
    backend = bdl.backends.get("numpyro")
    original = type(backend).compile_loop

    def compile_loop(self, step, emit):
        runner, calls = original(self, step, emit), {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return interrupted

    monkeypatch.setattr(type(backend), "compile_loop", compile_loop)
    options = dict(SWA, swa_start=100, chunk_size=300, num_samples=20)
    try:
        with pytest.raises(RunInterrupted, match="swag was interrupted at step 300") as info:
            _fit("numpyro", **options)
    finally:
        clear_programs()
    partial = info.value.partial
    assert partial.method == "swag" and partial.guide.params["count"].tolist() == [40.0]
    assert partial.samples["w"].shape == (1, 20, 2)


# -- checks --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, match",
    [
        ({"rank": 1}, r"SWAG\(rank=1\): rank must be an int >= 2"),
        ({"collect_every": 0}, "collect_every must be an int >= 1"),
        ({"num_steps": 100, "swa_start": 100}, "swa_start must be below num_steps"),
        (
            {"num_steps": 100, "swa_start": 50, "collect_every": 10, "rank": 20},
            r"collects 5 iterates after swa_start, fewer than rank=20 .* Raise num_steps to 250",
        ),
        ({"schedule": "cosine"}, "schedule must be one of 'constant', 'cyclical'"),
        ({"decay": 1.5}, r"decay must be a number in \(0.0, 1.0\]"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"momentum": 1.0}, r"momentum must be a number in \[0.0, 1.0\)"),
        ({"num_warmup": 10}, "SWAG's burn-in is swa_start"),
        ({"num_members": 3}, "MultiSWAG"),
    ],
)
def test_swag_settings_are_checked(options, match):
    with pytest.raises(ConfigError, match=match):
        bdl.SWAG(**options)


def test_the_string_form_builds_the_same_method():
    from ppl_bdl.inference.methods import resolve_method

    assert resolve_method("swag", {"rank": 4}) == bdl.SWAG(rank=4)
    with pytest.raises(ConfigError, match="chain_ids"):
        _fit("numpyro", chain_ids=[0], **SWA)
