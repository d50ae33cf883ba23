"""Energy-based models (``bdl.ebm``): the samplers' stationary law on a fixed quadratic energy,
training by Algorithm 3 on a 2-D Gaussian mixture, and the errors, on both backends."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

import ppl_bdl as bdl
from ppl_bdl import math as bm
from ppl_bdl import nn
from ppl_bdl.inference.ebm.trainer import EBMTrainer
from ppl_bdl.models import ebm as ebm_models

# -- a fixed quadratic energy: E(x) = ½ |A x + b|², so p(x) = N(μ, Λ⁻¹), Λ = AᵀA, μ = −A⁻¹b ------
A = np.array([[1.0, 0.0], [0.8, 1.5]])
B_VEC = np.array([0.5, -1.0])
PRECISION = A.T @ A
MEAN = -np.linalg.solve(A, B_VEC)


def quadratic_model(backend: str, sampler: str, step_size: float, **options):
    net = nn.Sequential("quad", [nn.Dense("a", 2, 2), lambda h: 0.5 * bm.sum(h * h, axis=-1)])
    # Dense computes x @ W + b, so W = Aᵀ
    params = {"quad.a.weight": A.T, "quad.a.bias": B_VEC}
    return bdl.ebm.EnergyModel(
        net,
        params,
        event_shape=(2,),
        box=(-4.0, 4.0),
        backend=backend,
        sampler=sampler,
        step_size=step_size,
        **options,
    )


def stationary_covariance(sampler: str, step_size: float, momentum_decay: float = 0.1):
    """The exact stationary covariance of the kernel's linear recursion on the quadratic energy
    (the discretised chain's, not the continuous Λ⁻¹): S = M S Mᵀ + Q, solved directly.

    sgld: e' = (I − αΛ) e + √(2α) ε, so M = I − αΛ, Q = 2α I (S = (Λ − αΛ²/2)⁻¹).
    sghmc: v' = (1 − a) v − ηΛ e + ξ, e' = e + v', ξ ~ N(0, 2aη I), on the state (e, v)."""
    eye = np.eye(2)
    if sampler == "sgld":
        return scipy.linalg.solve_discrete_lyapunov(
            eye - step_size * PRECISION, 2 * step_size * eye
        )
    a, eta = momentum_decay, step_size
    M = np.block([[eye - eta * PRECISION, (1 - a) * eye], [-eta * PRECISION, (1 - a) * eye]])
    Q = 2 * a * eta * np.block([[eye, eye], [eye, eye]])
    return scipy.linalg.solve_discrete_lyapunov(M, Q)[:2, :2]


def assert_gaussian(x: np.ndarray, mean: np.ndarray, cov: np.ndarray, z: float = 4.0):
    """Sample mean and covariance of n independent draws within z Monte Carlo standard errors:
    sd(mean_i) = √(S_ii / n), sd(S_ij) = √((S_ii S_jj + S_ij²) / n) (Gaussian draws)."""
    n = len(x)
    mean_err = np.abs(x.mean(0) - mean) / np.sqrt(np.diag(cov) / n)
    cov_sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    cov_err = np.abs(np.cov(x.T) - cov) / cov_sd
    assert mean_err.max() < z, (x.mean(0), mean, mean_err)
    assert cov_err.max() < z, (np.cov(x.T), cov, cov_err)
    return cov_err.max()


# n = 4000 chains from independent starts, each kept once after a burn-in that contracts the
# start by ρ^steps < 1e-14 (ρ: the recursion's spectral radius, 0.79 and 0.84): the draws are
# independent, so the effective sample size is n, and 4 standard errors bound every moment
# (5 moments: a false alarm has probability < 4e-4; the seed is fixed). The step sizes are
# large enough that the discretised law differs from Λ⁻¹ by 11 standard errors.
STATIONARY_CASES = [("sgld", 0.3, 150, {}), ("sghmc", 0.5, 200, {"momentum_decay": 0.3})]


@pytest.mark.parametrize(
    ("sampler", "step_size", "steps", "options"),
    STATIONARY_CASES,
    ids=[c[0] for c in STATIONARY_CASES],
)
def test_stationary_law_on_a_quadratic_energy_is_the_kernels_gaussian(
    backend, sampler, step_size, steps, options
):
    model = quadratic_model(backend, sampler, step_size, **options)
    x = model.sample(4000, steps=steps, start="noise", seed=1)
    exact = stationary_covariance(sampler, step_size, **options)
    assert_gaussian(x, MEAN, exact)
    # The test tells the discretised chain from the continuous target: at this step size their
    # covariances differ by more than the tolerance (so passing above is not by a wide margin).
    with pytest.raises(AssertionError):
        assert_gaussian(x, MEAN, np.linalg.inv(PRECISION))


# -- Algorithm 3 on a 2-D Gaussian mixture ---------------------------------------------------------
def mixture_data(n: int = 2000, seed: int = 0) -> np.ndarray:
    """Three equally weighted components N(c_k, 0.4² I), c_k = (±1.5, 0), (0, 1.5)."""
    return ebm_models.gaussian_mixture_2d(n, seed=seed)


def moment_errors(x: np.ndarray, X: np.ndarray) -> tuple[float, float]:
    """(max |mean difference| / the data's sd per coordinate, ‖Cov(x) − Cov(X)‖_F / ‖Cov(X)‖_F)."""
    mean_err = np.abs(x.mean(0) - X.mean(0)) / X.std(0)
    cov_X = np.cov(X.T)
    return float(mean_err.max()), float(np.linalg.norm(np.cov(x.T) - cov_X) / np.linalg.norm(cov_X))


@pytest.mark.slow_on("numpyro")  # the same check runs on Pyro by default (~2x its CPU on NumPyro)
def test_mixture_samples_match_the_datas_means_and_covariance(backend):
    """A short fit (300 updates of K = 10 steps): the persistent chains, run on for 10 steps at
    the final θ, match the data's moments. The Monte Carlo error of 2000 draws of 1000 chains
    is about 0.03 sd for a mean and 0.05 for the covariance; 300 updates add a bias of the same
    order (seeds 0-2, both backends: mean errors 0.002-0.067 sd, covariance 0.024-0.101), so
    the tolerances are 0.15 sd and 0.2. Draws of the untrained model (uniform noise in the
    data's box) are off by 0.5 in covariance: rejected (checked)."""
    X = mixture_data()
    net = nn.MLP("energy", [2, 32, 32, 1], activation="silu", prior=nn.he_normal())
    ebm = bdl.ebm.fit(
        net,
        X,
        backend=backend,
        num_steps=300,
        batch_size=100,
        chain_steps=10,
        step_size=0.01,
        lr=3e-3,
    )
    assert ebm.losses.shape == (300,) and np.isfinite(ebm.losses).all()
    assert ebm.buffer.shape == (1000, 2)
    mean_err, cov_err = moment_errors(ebm.sample(2000, steps=10, seed=1), X)
    assert mean_err < 0.15 and cov_err < 0.2, (mean_err, cov_err)
    # The energy is low where the data is: at the components' centres, not between them.
    centres, between = np.array([[-1.5, 0.0], [1.5, 0.0]]), np.array([[0.0, -1.5], [0.0, 3.5]])
    assert ebm.energy(centres).max() < ebm.energy(between).min()
    _, cov0 = moment_errors(ebm.sample(2000, steps=1, start="noise"), X)
    assert cov0 > 0.2, cov0


@pytest.mark.slow  # ~20 s per fit: the shipped example's 1000 updates of K = 20 steps
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_shipped_mixture_example_samples_from_noise_match_the_data(backend, seed):
    """The shipped 2-D example (models/ebm.py): chains started from uniform noise and run 1000
    steps at the trained θ (mixed: the errors do not change from 300 to 1000 steps) sample the
    data's law. Measured over these seeds and backends: mean errors <= 0.22 sd, covariance <=
    0.18 (the model's bias: how it weighs the three modes; the Monte Carlo error of 2000
    independent chains is 0.02 and 0.04). Tolerances 0.25 and 0.25; the untrained model's
    draws are off by 0.5 in covariance."""
    X, ebm = ebm_models.fit_2d(backend, "mixture", seed=seed, hidden=(32, 32))
    mean_err, cov_err = moment_errors(ebm.sample(2000, steps=1000, start="noise", seed=1), X)
    assert mean_err < 0.25 and cov_err < 0.25, (mean_err, cov_err)
    mean_err, cov_err = moment_errors(ebm.sample(2000, steps=100, seed=1), X)
    assert mean_err < 0.25 and cov_err < 0.25, (mean_err, cov_err)


# -- other settings run, on both backends ----------------------------------------------------------
SMALL = dict(num_steps=30, batch_size=50, chain_steps=5, step_size=0.01, lr=1e-3)
#: Smoke tests whose time on NumPyro is its compilation (a few seconds per fit and per sample
#: shape): the default suite runs them on Pyro, ``-m slow`` on NumPyro too.
SMOKE_BACKENDS = [pytest.param("numpyro", marks=pytest.mark.slow), "pyro"]


def small_net():
    return nn.MLP("energy", [2, 16, 1], activation="silu", prior=nn.he_normal())


@pytest.mark.parametrize(
    "options",
    [
        {"persistent": False, "start": "noise"},  # short-run chains from noise (Nijkamp et al.)
        {"persistent": False, "start": "data"},  # contrastive divergence (Hinton)
        {"sampler": "sghmc", "momentum_decay": 0.2, "reinit": 0.0, "buffer_size": 50},
        {"sampler": "psgld", "schedule": "polynomial", "clip": True, "energy_l2": 0.1},
        {"sampler": "csgld", "num_cycles": 1, "temperature": 0.5},
    ],
    ids=["short-run", "cd", "sghmc", "psgld-clip", "csgld"],
)
@pytest.mark.parametrize("backend", SMOKE_BACKENDS)
def test_other_settings_train(backend, options):
    X = mixture_data(200)
    ebm = bdl.ebm.fit(small_net(), X, backend=backend, **{**SMALL, **options})
    assert ebm.losses.shape == (30,) and np.isfinite(ebm.losses).all()
    assert set(ebm.history) == {"loss", "energy_data", "energy_samples", "grad_norm"}
    assert (ebm.buffer is None) == (options.get("persistent") is False)
    x = ebm.sample(20)
    assert x.shape == (20, 2) and np.isfinite(x).all()
    if options.get("clip"):
        low, high = ebm.box
        assert (ebm.buffer >= low - 1e-6).all() and (ebm.buffer <= high + 1e-6).all()


def test_same_seed_same_fit_and_the_trainer_runs_on(backend):
    X = mixture_data(200)
    settings = {**SMALL, "lr_schedule": "constant", "seed": 3}
    a = bdl.ebm.fit(small_net(), X, backend=backend, **settings)
    trainer = EBMTrainer(small_net(), X, backend=backend, **{**settings, "num_steps": 60})
    trainer.run(30)
    np.testing.assert_allclose(trainer.model.losses, a.losses, rtol=1e-5, atol=1e-6)
    first = {k: v.copy() for k, v in trainer.model.params.items()}
    trainer.run(30)  # goes on from where it stopped, with the same compiled loop
    assert trainer.model.losses.shape == (60,)
    assert any(not np.allclose(first[k], v) for k, v in trainer.model.params.items())


def test_a_diverging_chain_stops_training_with_the_model_before_it(backend):
    X = mixture_data(200)
    net = nn.MLP("energy", [2, 16, 1], activation=bm.exp, prior=nn.he_normal())  # exp overflows
    with pytest.raises(bdl.InferenceError, match="smaller step_size") as info:
        bdl.ebm.fit(net, X, backend=backend, **{**SMALL, "step_size": 1e3})
    partial = info.value.partial
    assert isinstance(partial, bdl.ebm.EnergyModel)
    assert all(np.isfinite(v).all() for v in partial.params.values())


def test_a_lifted_module_is_an_energy(backend):
    if backend == "pyro":
        import torch

        module = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        first = module[0].weight.detach().numpy().T
    else:
        import equinox as eqx
        import jax

        # equinox modules take one example: the scalar output is one energy per point
        module = eqx.nn.MLP(2, "scalar", 8, 1, key=jax.random.PRNGKey(0))
        first = np.asarray(module.layers[0].weight).T
    lifted = nn.lift(module, name="e")
    sites = lifted.sites(bdl.backends.get(backend))
    start = bdl.ebm.trainer.Energy(lifted, bdl.backends.get(backend)).initial_params(0)
    weight = next(k for k in sites if k.endswith("0.weight"))
    np.testing.assert_allclose(start[weight].T, first, rtol=1e-6)  # the module's own values
    ebm = bdl.ebm.fit(lifted, mixture_data(200), backend=backend, **SMALL)
    assert np.isfinite(ebm.losses).all() and ebm.sample(4).shape == (4, 2)


# -- errors: what was seen, what was expected, what to do ------------------------------------------
def _fit(X=None, net=None, **options):
    X = mixture_data(100) if X is None else X
    return bdl.ebm.fit(
        small_net() if net is None else net, X, backend="numpyro", **{**SMALL, **options}
    )


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"sampler": "nope"}, bdl.ConfigError, r"unknown sampler 'nope'.*'sgld'"),
        ({"sampler": "nuts"}, bdl.ConfigError, r"SG-MCMC kernels"),
        ({"friction": 1.0}, bdl.ConfigError, r"unknown option\(s\) \['friction'\].*'sgld'"),
        ({"chain_steps": 0}, bdl.ConfigError, r"chain_steps .* >= 1, got 0"),
        ({"step_size": -1.0}, bdl.ConfigError, r"step_size must be a positive"),
        ({"schedule": "linear"}, bdl.ConfigError, r"schedule must be one of"),
        ({"batch_size": 500}, bdl.ConfigError, r"batch_size must be .* at most the 100 points"),
        ({"buffer_size": 10}, bdl.ConfigError, r"buffer_size=10 is smaller than batch_size=50"),
        ({"reinit": 2.0}, bdl.ConfigError, r"reinit .* in \[0, 1\], got 2.0"),
        ({"start": "zeros"}, bdl.ConfigError, r"start must be one of \['noise', 'data'\]"),
        ({"persistent": "yes"}, bdl.ConfigError, r"persistent must be True or False"),
        ({"energy_l2": -1}, bdl.ConfigError, r"energy_l2 must be a number >= 0"),
        ({"lr_schedule": "step"}, bdl.ConfigError, r"schedule"),
        ({"clip": 1}, bdl.ConfigError, r"clip must be True or False"),
        ({"sampler": "csgld", "num_cycles": 9}, bdl.ConfigError, r"9 cycles over each chain's 5"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(options, error, match):
    with pytest.raises(error, match=match):
        _fit(**options)


def test_bad_data_is_refused_with_its_shape():
    with pytest.raises(bdl.DataError, match=r"X has shape \(100,\); expected \(N, \*event\)"):
        _fit(X=np.zeros(100))
    X = mixture_data(100)
    X[3, 1] = np.nan
    with pytest.raises(bdl.DataError, match=r"1 non-finite value\(s\) \(first at index \(3, 1\)"):
        _fit(X=X)
    with pytest.raises(bdl.ModelError, match=r"failed on a batch of X's rows of shape \(2, 3\)"):
        _fit(X=np.zeros((100, 3)))


def test_an_energy_that_is_not_one_number_per_point_is_refused():
    with pytest.raises(
        bdl.ModelError,
        match=r"to shape \(2, 3\); an energy is one number per "
        r"point, so expected \(2,\) or \(2, 1\)",
    ):
        _fit(net=nn.MLP("energy", [2, 8, 3]))
    with pytest.raises(bdl.ModelError, match=r"must be a ppl_bdl.dsl.nn network .* got function"):
        _fit(net=lambda x: x.sum(-1))


def test_a_model_from_given_params_checks_them():
    net = small_net()
    good = {k: np.zeros(s) for k, s in net.sites().items()}
    with pytest.raises(bdl.ModelError, match=r"missing \['energy.1.bias'\]"):
        bdl.ebm.EnergyModel(
            net,
            {k: v for k, v in good.items() if k != "energy.1.bias"},
            event_shape=(2,),
            backend="numpyro",
        )
    with pytest.raises(bdl.ModelError, match=r"params\['energy.0.weight'\] has shape \(3, 16\)"):
        bdl.ebm.EnergyModel(
            net, {**good, "energy.0.weight": np.zeros((3, 16))}, event_shape=(2,), backend="numpyro"
        )
    model = bdl.ebm.EnergyModel(net, good, event_shape=(2,), backend="numpyro")
    with pytest.raises(bdl.ConfigError, match=r"start='buffer' needs the replay buffer"):
        model.sample(3, start="buffer")
    with pytest.raises(bdl.ConfigError, match=r"x has shape \(3, 5\); expected \(n, \*\(2,\)\)"):
        model.energy(np.zeros((3, 5)))
    with pytest.raises(bdl.ConfigError, match=r"n must be an int >= 1, got 0"):
        model.sample(0)


# -- the docs page and the shipped example ---------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~20 s: the page's 1000 updates and 1000-step chains
def test_docs_page_example_runs_as_written():
    page = (ROOT / "docs" / "ebm.md").read_text()
    namespace: dict = {}
    exec(
        compile(re.search(r"```python\n(.*?)```", page, re.S).group(1), "docs/ebm.md", "exec"),
        namespace,
    )
    mean_err, cov_err = moment_errors(namespace["x"], namespace["X"])
    assert mean_err < 0.15 and cov_err < 0.15, (mean_err, cov_err)
    model = namespace["model"]
    low, high = model.energy(np.array([[1.5, 0.0], [0.0, -1.5]]))
    assert low < high


def test_shipped_2d_example_runs_from_models(backend, capsys):
    quick = ["--steps", "5", "--chain-steps", "2", "--draws", "50", "--sample-steps", "5"]
    ebm_models.main(["--data", "rings", "--backend", backend, *quick])
    out = capsys.readouterr().out
    assert "samples from noise, 5 steps: {'mean_error_sd':" in out


@pytest.mark.parametrize("backend", SMOKE_BACKENDS)
def test_shipped_image_example_runs(backend):
    X = ebm_models.stroke_images(n=40, size=8)
    assert X.shape == (40, 1, 8, 8)
    img = bdl.ebm.fit(
        ebm_models.energy_cnn(size=8, width=4),
        X,
        backend=backend,
        **{**ebm_models.SETTINGS_STROKES, "num_steps": 2, "batch_size": 8, "chain_steps": 2},
    )
    assert img.sample(3).shape == (3, 1, 8, 8)
