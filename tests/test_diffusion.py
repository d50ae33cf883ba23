"""Score-based and diffusion models (``bdl.diffusion``): the SDEs' perturbation kernels, the
denoising objective and every sampler at the exact score of Gaussian data (closed forms), a
trained model on a mixture, exact score matching of a linear score, both backends, the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

import ppl_bdl as bdl
from ppl_bdl import nn
from ppl_bdl.errors import ConfigError, DataError, ModelError
from ppl_bdl.inference.diffusion import VESDE, VPSDE
from ppl_bdl.inference.diffusion.samplers import SamplerSpec, expected_noise_norm, step_arrays

M, S = 1.5, 0.7  # the data N(M, S²) of the oracle cases
SDES = {"ve": VESDE(sigma_max=20.0), "vp": VPSDE()}


# -- the SDEs ---------------------------------------------------------------------------------
def test_marginals_match_their_closed_forms():
    t = np.linspace(0.0, 1.0, 11)
    ve = VESDE(sigma_min=0.02, sigma_max=30.0)
    np.testing.assert_allclose(ve.std(t), 0.02 * (30.0 / 0.02) ** t, rtol=1e-12)
    np.testing.assert_allclose(ve.mean_coef(t), 1.0)
    dt = 1e-6  # g(t)² = dσ(t)²/dt, the VE SDE's defining property
    np.testing.assert_allclose(
        ve.diffusion2(t[1:-1]),
        (ve.std(t[1:-1] + dt) ** 2 - ve.std(t[1:-1] - dt) ** 2) / (2 * dt),
        rtol=1e-5,
    )
    vp = VPSDE(beta_min=0.1, beta_max=20.0)
    for ti in t:  # a(t) = exp(−½ ∫_0^t β), σ(t)² = 1 − a(t)²
        integral, _ = integrate.quad(vp.beta, 0.0, ti)
        assert vp.mean_coef(ti) == pytest.approx(math.exp(-0.5 * integral), rel=1e-10)
        assert vp.std(ti) ** 2 == pytest.approx(1.0 - math.exp(-integral), rel=1e-8, abs=1e-15)
    assert float(vp.std(1e-9)) == pytest.approx(math.sqrt(0.1 * 1e-9), rel=1e-3)  # no cancellation


@pytest.mark.parametrize("name", ["ve", "vp"])
def test_forward_sde_reaches_the_perturbation_kernel(name):
    """Euler-Maruyama on dx = f dt + g dw from x_0 = 1 (NumPy) against N(a(t), σ(t)²) at t = ½:
    n = 20000 paths, 4 standard errors."""
    sde, n, steps, t_end = SDES[name], 20000, 2000, 0.5
    rng = np.random.default_rng(0)
    x, h = np.ones(n), t_end / steps
    for k in range(steps):
        t = k * h
        x = x + sde.drift(x, t) * h + math.sqrt(sde.diffusion2(t) * h) * rng.normal(size=n)
    mean, std = float(sde.mean_coef(t_end)), float(sde.std(t_end))
    assert abs(x.mean() - mean) < 4 * std / math.sqrt(n) + 2e-3
    assert abs(x.std() - std) < 4 * std / math.sqrt(2 * n) + 2e-3 * std


# -- the oracle: the exact score of N(M, S²) perturbed ---------------------------------------
def oracle(sde, scale: float = 1.0) -> bdl.diffusion.ScoreModel:
    """ScoreModel of ∇ log p_t for p_0 = N(M, S²): p_t = N(a M, a² S² + σ²) (``scale``: a
    score multiplied by it, off the optimum)."""

    def score(x, t):
        a, s = sde.mean_coef(t, bdl.math), sde.std(t, bdl.math)
        return -scale * (x - M * a) / (S * S * a * a + s * s)

    return bdl.diffusion.ScoreModel(score, dim=1, sde=sde, backend="numpyro", precision="float64")


@pytest.mark.parametrize("name", ["ve", "vp"])
def test_dsm_loss_of_the_exact_score_is_its_analytic_minimum(name):
    """½ E‖σ s + z‖² at the true score is ½ D E_t[a² S² / (a² S² + σ²)], t ~ U(t_min, 1)
    (Eq. 3.11 with λ = σ²); a score off the optimum scores higher (paired, same draws)."""
    sde = SDES[name]
    X = np.random.default_rng(1).normal(M, S, size=(20000, 1))
    terms = oracle(sde).loss_terms(X, seed=2)

    def integrand(t):
        a2 = float(sde.mean_coef(t)) ** 2
        return a2 * S * S / (a2 * S * S + float(sde.std(t)) ** 2)

    expected = 0.5 * integrate.quad(integrand, sde.t_min, 1.0, limit=200)[0] / (1.0 - sde.t_min)
    assert abs(terms.mean() - expected) < 4 * terms.std() / math.sqrt(len(terms))
    worse = oracle(sde, scale=0.8).loss_terms(X, seed=2) - terms
    assert worse.mean() > 4 * worse.std() / math.sqrt(len(worse))


def folded_mean(mu: float, sd: float) -> float:
    """E|Y| for Y ~ N(mu, sd²)."""
    return sd * math.sqrt(2 / math.pi) * math.exp(-(mu**2) / (2 * sd * sd)) + mu * math.erf(
        mu / (sd * math.sqrt(2))
    )


def exact_moments(sde, spec: SamplerSpec) -> tuple[float, float]:
    """Mean and variance of the sampler's output at the oracle score, from the prior N(0, σ_p²):
    each step is linear-Gaussian in x, x' = A x + B + c z, so they propagate exactly (the
    corrector's step size, which reads the draws' mean |s|, at its expectation)."""
    arrays = step_arrays(sde, spec)
    h = (1.0 - sde.t_min) / spec.steps
    mean, var = 0.0, sde.prior_std**2

    def linear(t):  # score(x, t) = k x + offset;  f(x, t) = fc x
        a, s = float(sde.mean_coef(t)), float(sde.std(t))
        v = S * S * a * a + s * s
        return -1.0 / v, M * a / v, float(sde.drift(1.0, t)), float(sde.diffusion2(t))

    for i in range(len(arrays["t"])):
        t, t_next, alpha, extra = (float(arrays[k][i]) for k in ("t", "t_next", "alpha", "noise"))
        k, offset, fc, g2 = linear(t)
        if spec.sampler == "langevin":
            mean, var = extra * mean, extra * extra * var
        if spec.sampler in ("langevin", "pc"):
            for _ in range(1 if spec.sampler == "langevin" else spec.corrector_steps):
                eps = alpha
                if spec.sampler == "pc":
                    grad = folded_mean(k * mean + offset, abs(k) * math.sqrt(var))
                    eps = 2 * alpha * (spec.snr * expected_noise_norm(1) / grad) ** 2
                A, B = 1 + eps * k, eps * offset
                mean, var = A * mean + B, A * A * var + 2 * eps
        if spec.sampler in ("euler", "pc"):
            A, B = 1 - h * (fc - g2 * k), h * g2 * offset
            mean, var = A * mean + B, A * A * var + extra * g2 * h
        if spec.sampler == "ode":
            c1, d1 = fc - 0.5 * g2 * k, -0.5 * g2 * offset
            A, B = 1 - h * c1, -h * d1
            if spec.integrator == "heun":
                k2, offset2, fc2, g22 = linear(t_next)
                c2, d2 = fc2 - 0.5 * g22 * k2, -0.5 * g22 * offset2
                A = 1 - 0.5 * h * (c1 + c2 * (1 - h * c1))
                B = -0.5 * h * (d1 + d2 - c2 * h * d1)
            mean, var = A * mean + B, A * A * var
    return mean, var


#: sampler, options, how far (relative) the discretised law's sd may be from N(M, S²)'s at 200
#: steps: Euler on the VE ODE and annealed Langevin (Song and Ermon's step sizes, 5 steps per
#: level) are far coarser than the rest; the exact recursion is checked tightly for all.
SAMPLER_CASES = [
    ("euler", {}, 0.015),
    ("pc", {"snr": 0.16}, 0.02),
    ("ode", {"integrator": "heun"}, 0.015),
    ("ode", {"integrator": "euler"}, 0.1),
    ("langevin", {"corrector_steps": 5, "step_size": 0.05}, 0.2),
]


@pytest.mark.parametrize("name", ["ve", "vp"])
@pytest.mark.parametrize(("sampler", "options", "sd_tolerance"), SAMPLER_CASES)
def test_samplers_at_the_exact_score(name, sampler, options, sd_tolerance):
    """Each sampler at the true score of N(M, S²): the draws' mean and standard deviation are
    the exact moments of its discretised recursion (n = 10000 independent draws, 4 standard
    errors: sd(mean) = √(V/n), sd(sample var) = V √(2/n)), and those are N(M, S²)'s up to the
    discretisation and the prior's mismatch (the ODE maps the prior's mean error through)."""
    sde, n, steps = SDES[name], 10000, 200
    spec = SamplerSpec.build(sampler, steps=steps, **options)
    x = oracle(sde).sample(n, sampler=sampler, steps=steps, seed=3, **options)[:, 0]
    mean, var = exact_moments(sde, spec)
    assert abs(x.mean() - mean) < 4 * math.sqrt(var / n), (x.mean(), mean)
    assert abs(x.var() - var) < 4 * var * math.sqrt(2 / n), (x.var(), var)
    target_sd = math.sqrt(S * S + float(sde.std(sde.t_min)) ** 2)
    assert abs(mean - M) < (0.06 if sampler == "ode" else 0.01)
    assert abs(math.sqrt(var) / target_sd - 1) < sd_tolerance


# -- training ----------------------------------------------------------------------------------
def test_backends_agree_on_a_network_score():
    """One network at the same parameters: its scores and its probability-flow ODE draws (a
    function of the starts, which both backends draw alike) agree on Pyro and NumPyro; a short
    fit runs on each."""
    X = np.random.default_rng(0).normal(M, S, size=(256, 2))
    net = nn.MLP("s", [2 + 1 + 2, 16, 2], activation="tanh", prior=nn.he_normal())
    fits = {
        b: bdl.diffusion.fit(net, X, sde="vp", backend=b, time_features=1, num_steps=30, seed=0)
        for b in ("numpyro", "pyro")
    }
    for model in fits.values():
        assert model.losses.shape == (30,) and np.isfinite(model.losses).all()
    params = fits["numpyro"].params
    models = {
        b: bdl.diffusion.ScoreModel(net, params, dim=2, sde="vp", backend=b, time_features=1)
        for b in fits
    }
    scores = [m.score(X[:5], 0.3) for m in models.values()]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-4, atol=1e-5)
    draws = [m.sample(64, sampler="ode", steps=50, seed=4) for m in models.values()]
    np.testing.assert_allclose(draws[0], draws[1], rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_trained_model_recovers_the_mixture_weights():
    """A VP model trained on 0.3 N(−2, 0.5²) + 0.7 N(2, 0.5²): the share of draws above 0 is
    0.7 within 0.05 (4 standard errors of 4000 draws are 0.03; the rest is the fit's error)."""
    rng = np.random.default_rng(0)
    n = 4000
    X = np.where(rng.uniform(size=(n, 1)) < 0.3, -2.0, 2.0) + 0.5 * rng.normal(size=(n, 1))
    net = nn.MLP("s", [1 + 1 + 8, 64, 64, 1], activation="silu", prior=nn.he_normal())
    model = bdl.diffusion.fit(
        net, X, sde="vp", backend="numpyro", time_features=4, num_steps=4000, lr=2e-3, seed=0
    )
    for sampler in ("euler", "ode"):
        x = model.sample(4000, sampler=sampler, steps=300, seed=1)[:, 0]
        assert abs((x > 0).mean() - 0.7) < 0.05, (sampler, (x > 0).mean())
        assert abs(np.median(x[x > 0]) - 2.0) < 0.2


def test_exact_score_matching_recovers_a_linear_score():
    """Hyvärinen's objective (Eq. 3.10) for s(x) = x W + b on Gaussian data: its minimiser is
    the score of N(x̄, Ŝ) (Ŝ the data's covariance, divided by N): W = −Ŝ⁻¹, b = x̄ Ŝ⁻¹."""
    rng = np.random.default_rng(0)
    X = rng.multivariate_normal([1.0, -1.0], [[1.0, 0.6], [0.6, 2.0]], size=400)
    model = bdl.diffusion.fit(
        nn.Dense("s", 2, 2, prior_scale=0.1),
        X,
        score_matching="exact",
        backend="numpyro",
        batch_size=400,
        num_steps=1500,
        lr=0.05,
        lr_schedule="constant",
        precision="float64",
    )
    precision = np.linalg.inv(np.cov(X.T, bias=True))
    np.testing.assert_allclose(model.params["s.weight"], -precision, atol=2e-3)
    np.testing.assert_allclose(model.params["s.bias"], X.mean(0) @ precision, atol=2e-3)
    x = model.sample(2000, sampler="langevin", steps=200, step_size=0.05, seed=0)
    assert np.abs(x.mean(0) - X.mean(0)).max() < 0.15


# -- evaluation: the energy distance and the Gaussian baseline --------------------------------
def test_energy_distance_matches_its_closed_form_and_is_unbiased():
    """1-D N(0, 1) against N(1, 1): 2 E|X − Y| − E|X − X'| − E|Y − Y'| = 2 E|N(1, 2)| − 4/√π,
    the mean of 300 estimates (n = 200) within 4 of their standard errors; two samples of one
    law: zero on average (the biased estimate that keeps the zero diagonal is 2 · (2/√π)/200 =
    0.011 too high, over 12 of these standard errors)."""
    rng = np.random.default_rng(0)
    n, reps = 200, 300
    expected = 2 * folded_mean(1.0, math.sqrt(2.0)) - 4 / math.sqrt(math.pi)
    shifted = [
        bdl.diffusion.energy_distance(rng.normal(size=n), 1 + rng.normal(size=n))
        for _ in range(reps)
    ]
    same = [
        bdl.diffusion.energy_distance(rng.normal(size=n), rng.normal(size=n)) for _ in range(reps)
    ]
    for values, target in ((shifted, expected), (same, 0.0)):
        error = 4 * np.std(values) / math.sqrt(reps)
        assert abs(np.mean(values) - target) < error, (np.mean(values), target, error)
    assert 4 * np.std(same) / math.sqrt(reps) < 0.011 / 3


def test_energy_distance_by_blocks_is_the_pairwise_sum(monkeypatch):
    """Blocks of 7 rows (ROWS patched) give the brute-force pairwise value; images are
    flattened; points of different sizes are refused."""
    from ppl_bdl.inference.diffusion import evaluation

    monkeypatch.setattr(evaluation, "ROWS", 7)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 1, 2, 2)), rng.normal(size=(15, 4)) + 0.5
    a, b = x.reshape(20, 4), y

    def mean_distance(p, q, skip_self):
        d = np.linalg.norm(p[:, None] - q[None], axis=-1)
        return d.sum() / (len(p) * (len(q) - 1) if skip_self else len(p) * len(q))

    brute = 2 * mean_distance(a, b, False) - mean_distance(a, a, True) - mean_distance(b, b, True)
    assert bdl.diffusion.energy_distance(x, y) == pytest.approx(brute, rel=1e-10)
    assert bdl.diffusion.energy_distance(y, x) == pytest.approx(brute, rel=1e-10)
    with pytest.raises(DataError, match=r"x has 4 numbers per row, y has 3"):
        bdl.diffusion.energy_distance(x, y[:, :3])


@pytest.mark.parametrize("name", ["ve", "vp"])
def test_gaussian_baseline_loss_is_its_analytic_minimum(name):
    """fit_gaussian on correlated 2-D Gaussian data: its held-out loss is the minimum of Eq. 3.11,
    ½ Σ_i E_t[a² λ_i / (a² λ_i + σ²)] over the covariance's eigenvalues λ_i (4 standard errors,
    plus the O(1/N) of the fitted covariance); its Euler-Maruyama draws have that covariance."""
    sde, rng = SDES[name], np.random.default_rng(2)
    cov = np.array([[1.0, 0.8], [0.8, 0.9]])
    train, held_out = (rng.multivariate_normal([1.0, -2.0], cov, size=10000) for _ in range(2))
    model = bdl.diffusion.fit_gaussian(train, sde=sde, backend="numpyro", precision="float64")
    terms = model.loss_terms(held_out, seed=3)

    def integrand(t):
        a2, s2 = float(sde.mean_coef(t)) ** 2, float(sde.std(t)) ** 2
        return sum(a2 * lam / (a2 * lam + s2) for lam in np.linalg.eigvalsh(cov))

    expected = 0.5 * integrate.quad(integrand, sde.t_min, 1.0, limit=200)[0] / (1.0 - sde.t_min)
    assert abs(terms.mean() - expected) < 4 * terms.std() / math.sqrt(len(terms)) + 1e-3
    x = model.sample(4000, sampler="euler", steps=100, seed=4)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.08)
    np.testing.assert_allclose(x.mean(0), [1.0, -2.0], atol=0.06)


# -- errors ------------------------------------------------------------------------------------
X2 = np.random.default_rng(0).normal(size=(50, 2))


def test_a_score_network_of_the_wrong_output_shape_is_named():
    with pytest.raises(ModelError, match=r"to shape \(2, 3\).*expected \(2, 2\)"):
        bdl.diffusion.fit(nn.MLP("s", [3, 8, 3]), X2, backend="numpyro", num_steps=1)
    with pytest.raises(ModelError, match=r"its first layer must take 3 inputs"):
        bdl.diffusion.fit(nn.MLP("s", [2, 8, 2]), X2, backend="numpyro", num_steps=1)


def test_unknown_names_list_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"unknown sde 'vx'.*\['ve', 'vp'\]"):
        bdl.diffusion.fit(nn.MLP("s", [3, 8, 2]), X2, sde="vx", backend="numpyro")
    with pytest.raises(ConfigError, match=r"unknown score_matching 'sliced'"):
        bdl.diffusion.fit(nn.MLP("s", [3, 8, 2]), X2, score_matching="sliced", backend="numpyro")
    model = oracle(SDES["vp"])
    with pytest.raises(ConfigError, match=r"unknown sampler 'ddim'.*'euler', 'pc', 'ode'"):
        model.sample(10, sampler="ddim")
    with pytest.raises(ConfigError, match=r"unknown integrator 'rk4'"):
        model.sample(10, sampler="ode", integrator="rk4")


def test_bad_data_and_misused_options_are_named():
    bad = X2.copy()
    bad[3, 1] = np.nan
    with pytest.raises(DataError, match=r"non-finite.*\(3, 1\)"):
        bdl.diffusion.fit(nn.MLP("s", [3, 8, 2]), bad, backend="numpyro")
    with pytest.raises(ConfigError, match="score_matching='exact'.*sde"):
        bdl.diffusion.fit(nn.MLP("s", [2, 2]), X2, sde="vp", score_matching="exact")
    model = bdl.diffusion.ScoreModel(lambda x: -x, dim=2, sde=None, backend="numpyro")
    with pytest.raises(ConfigError, match="sampler='langevin'"):
        model.sample(10, sampler="euler")
    with pytest.raises(ConfigError, match=r"expected \(n, 2\)"):
        model.score(np.zeros((3, 4)))
