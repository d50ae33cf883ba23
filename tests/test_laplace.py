"""The Laplace approximation (method="laplace"): exact on a linear-Gaussian model on both
backends (mean, covariance, diagonal, GGN = Hessian), the GGN against Jᵀ Λ J on a network, the
draws, the last layer, the linearised predictive, export and saving, and the errors."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ConfigError, InferenceError, ModelError
from ppl_bdl.inference.laplace import method as laplace_method
from ppl_bdl.inference.laplace.approximation import checked_precision
from ppl_bdl.inference.laplace.curvature import curvature
from ppl_bdl.inference.setup import prepare
from ppl_bdl.posterior.diagnostics import ConvergenceWarning

NOISE, PRIOR = 0.3, 2.0
RNG = np.random.default_rng(0)
X = RNG.normal(size=(20, 3))
Y = X @ np.array([1.0, -2.0, 0.5]) + NOISE * RNG.normal(size=20)
#: The exact posterior of the linear-Gaussian model: precision A, mean A⁻¹ Xᵀy / σ².
A = X.T @ X / NOISE**2 + np.eye(3) / PRIOR**2
MEAN = np.linalg.solve(A, X.T @ Y / NOISE**2)


@bdl.model
def linear(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, PRIOR), shape=(3,))
    with bdl.plate("data", X.shape[0]) as idx:
        obs = None if y is None else y[idx]
        bdl.sample("y", dist.Normal(bdl.math.matmul(X[idx], w), NOISE), obs=obs)


@bdl.model
def classifier(X, y=None):
    logits = nn.MLP("net", [2, 4, 3], activation="tanh").sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=logits(X[idx])), obs=None if y is None else y[idx])


def _fit(bound, backend="numpyro", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(bound, backend=backend, method="laplace", progress=False, **options)


@pytest.fixture(scope="module", params=["numpyro", "pyro"])
def linear_fit(request):
    return _fit(
        linear(X, Y),
        request.param,
        precision="float64",
        num_steps=2000,
        lr=0.05,
        schedule="cosine",
    )


def test_backends_agree_on_hessian_and_jvp():
    def fn(x):
        m = backend.math
        return m.sum(m.tanh(x) * x**2) + x[0] * x[1]

    x = np.array([0.3, -0.7, 1.1])
    results = []
    for name in ("numpyro", "pyro"):
        backend = bdl.backends.get(name, precision="float64")
        with backend.scope(), backend.activate():
            hess = backend.to_numpy(backend.hessian(fn)(backend.asarray(x)))
            value, tangent = backend.jvp(fn, (backend.asarray(x),), (backend.asarray(x),))
            results.append((hess, float(value), float(tangent)))
    (h0, v0, t0), (h1, v1, t1) = results
    np.testing.assert_allclose(h0, h1, rtol=1e-12)
    np.testing.assert_allclose([v0, t0], [v1, t1], rtol=1e-12)
    # d²/dx² [tanh(x) x²] = 2 tanh + 4x sech² − 2x² tanh sech²
    sech2 = 1 - np.tanh(x) ** 2
    diag = 2 * np.tanh(x) + 4 * x * sech2 - 2 * x**2 * np.tanh(x) * sech2
    np.testing.assert_allclose(np.diag(h0), diag, rtol=1e-12)
    assert h0[0, 1] == pytest.approx(1.0)


def test_full_laplace_is_exact_on_a_linear_gaussian_model(linear_fit):
    approx = linear_fit.guide
    np.testing.assert_allclose(approx.mode, MEAN, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(approx.precision, A, rtol=1e-10)
    np.testing.assert_allclose(approx.covariance(), np.linalg.inv(A), rtol=1e-10)
    # the draws: mean and covariance within Monte Carlo error (1000 draws)
    draws = linear_fit.samples["w"][0]
    cov = np.linalg.inv(A)
    n = len(draws)
    se_mean = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(draws.mean(0) - MEAN) < 4 * se_mean)
    se_cov = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    assert np.all(np.abs(np.cov(draws.T) - cov) < 4 * se_cov)


def test_diag_ggn_and_hessian_at_a_given_map(linear_fit):
    backend = linear_fit.backend
    given = {"w": MEAN}
    diag = _fit(linear(X, Y), backend, precision="float64", num_steps=0, init=given, hessian="diag")
    np.testing.assert_allclose(diag.guide.precision, np.diag(A), rtol=1e-10)
    np.testing.assert_allclose(diag.guide.mode, MEAN, rtol=1e-12)
    exact = _fit(
        linear(X, Y), backend, precision="float64", num_steps=0, init=given, curvature="hessian"
    )
    np.testing.assert_allclose(exact.guide.precision, A, rtol=1e-10)  # GGN = Hessian here
    # the curvature summed over chunks of the data is the same (minibatch scaling)
    setup = prepare(linear(X, Y), backend, "float64", 0)
    chunked = curvature(setup, MEAN, "full", "ggn", batch_size=7)
    np.testing.assert_allclose(chunked, A, rtol=1e-10)


def test_posterior_exports_predicts_and_saves(linear_fit, tmp_path):
    idata = linear_fit.to_arviz()
    assert "w" in idata["posterior"] and "y" in idata["log_likelihood"]
    pred = linear_fit.predict(linear(X[:5]))
    # the predictive sd: the noise and the weights' spread x A⁻¹ x
    exact = np.sqrt(NOISE**2 + np.einsum("ni,ij,nj->n", X[:5], np.linalg.inv(A), X[:5]))
    np.testing.assert_allclose(pred.sd, exact, rtol=0.1)
    back = bdl.load(linear_fit.save(tmp_path / "laplace.nc"), model=linear(X, Y))
    assert back.method == "laplace"
    np.testing.assert_allclose(back.samples["w"], linear_fit.samples["w"])
    np.testing.assert_allclose(back.predict(linear(X[:5])).mean, pred.mean)
    with pytest.raises(ConfigError, match="refit"):
        back.predict(linear(X[:5]), pred_type="glm")


def test_glm_predictive_equals_nn_for_a_linear_model(linear_fit):
    glm = linear_fit.predict(linear(X[:6]), pred_type="glm")
    plain = linear_fit.predict(linear(X[:6]))
    np.testing.assert_allclose(glm.per_draw["mean"], plain.per_draw["mean"], rtol=1e-10)
    np.testing.assert_allclose(glm.sd, plain.sd, rtol=1e-10)
    ensemble = dataclasses.replace(linear_fit, guide=None, method="ensemble")
    with pytest.raises(ConfigError, match="method='laplace'"):
        ensemble.predict(linear(X[:6]), pred_type="glm")
    with pytest.raises(ConfigError, match="pred_type must be"):
        linear_fit.predict(linear(X[:6]), pred_type="lin")


@bdl.model
def any_width(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, PRIOR), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        obs = None if y is None else y[idx]
        bdl.sample("y", dist.Normal(bdl.math.matmul(X[idx], w), NOISE), obs=obs)


def test_glm_predictive_of_one_model_at_two_widths():
    """The compiled linearised predictive is kept per model, keyed by the latents' and the
    data's shapes: a second fit of the same model on wider inputs does not reuse the first's."""
    means = []
    for width in (2, 3):
        post = _fit(any_width(X[:, :width], Y), precision="float64", num_steps=1500, lr=0.05)
        glm = post.predict(any_width(X[:4, :width]), pred_type="glm")
        w = post.samples["w"].reshape(-1, width)
        np.testing.assert_allclose(glm.mean, (X[:4, :width] @ w.T).mean(axis=1), rtol=1e-8)
        means.append(glm.mean)
    assert not np.allclose(means[0], means[1])


def test_ggn_is_jacobian_lambda_jacobian_on_a_network():
    """GGN = Σ_n J_nᵀ (diag p_n − p_n p_nᵀ) J_n + the prior's precision, J_n = ∂ logits_n / ∂θ,
    computed here with an explicit Jacobian (Immer et al. 2021, Eq. 4)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    Xc, yc = rng.normal(size=(12, 2)), rng.integers(0, 3, size=12)
    setup = prepare(classifier(Xc, yc), "numpyro", "float64", 0)
    theta = rng.normal(size=setup.layout.dim) * 0.5
    ggn = curvature(setup, theta, "full", "ggn")
    net = nn.MLP("net", [2, 4, 3], activation="tanh")
    backend = setup.backend

    def logits(flat):
        return net.apply(setup.layout.unflatten(flat), jnp.asarray(Xc))

    with backend.scope(), backend.activate():
        jac = np.asarray(jax.jacobian(logits)(jnp.asarray(theta)))  # (n, 3, d)
        p = np.asarray(jax.nn.softmax(logits(jnp.asarray(theta))))
    lam = np.stack([np.diag(q) - np.outer(q, q) for q in p])
    expected = np.einsum("nkd,nkl,nle->de", jac, lam, jac) + np.eye(setup.layout.dim)
    np.testing.assert_allclose(ggn, expected, rtol=1e-9, atol=1e-9)
    diag = curvature(setup, theta, "diag", "ggn", chunk=5)
    np.testing.assert_allclose(diag, np.diag(expected), rtol=1e-9, atol=1e-9)
    # the last layer's block is the block of the whole network's
    index = np.arange(setup.layout.dim)[-15:]  # net.1.weight (4, 3) and net.1.bias (3,)
    block = curvature(setup, theta, "full", "ggn", index)
    np.testing.assert_allclose(block, expected[np.ix_(index, index)], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_the_curvature_is_compiled_once_for_every_chunk(monkeypatch, structure):
    """The chunk's indices are an argument of the compiled curvature: 4 chunks of 3 points
    trace the model once (a compile per chunk made a last-layer Laplace fit on UCI's boston,
    29 chunks of 16 points, 5x slower), and the sum over the chunks is the whole data's."""
    from ppl_bdl.inference.laplace.curvature import Potentials

    rng = np.random.default_rng(2)
    Xc, yc = rng.normal(size=(12, 2)), rng.integers(0, 3, size=12)
    setup = prepare(classifier(Xc, yc), "numpyro", "float64", 0)
    theta = rng.normal(size=setup.layout.dim) * 0.5
    # the diagonal: all but the last coordinate, so the last layer's bias is not whole and its
    # coordinates take the Hessian-vector products (the first layer, the per-layer pass)
    index = None if structure == "full" else np.arange(setup.layout.dim - 1)
    whole = curvature(setup, theta, structure, "ggn", index)
    traces = []
    linearised = Potentials.linearised
    monkeypatch.setattr(
        Potentials, "linearised", lambda self, *a: traces.append(1) or linearised(self, *a)
    )
    chunked = curvature(setup, theta, structure, "ggn", index, batch_size=3)
    assert len(traces) == 1
    np.testing.assert_allclose(chunked, whole, rtol=1e-9, atol=1e-9)


def test_last_layer_holds_the_other_weights_at_the_map():
    rng = np.random.default_rng(2)
    Xc, yc = rng.normal(size=(30, 2)), rng.integers(0, 3, size=30)
    post = _fit(classifier(Xc, yc), num_steps=200, lr=0.05, subset="last_layer", num_samples=50)
    approx = post.guide
    assert approx.sites == ("net.1.weight", "net.1.bias")
    assert approx.precision.shape == (15, 15)
    first = post.samples["net.0.weight"][0]
    assert np.all(first == first[0])  # held at the MAP
    assert np.std(post.samples["net.1.weight"][0], axis=0).min() > 0
    np.testing.assert_allclose(approx.mode[:8], first[0].ravel(), rtol=1e-6)
    glm = post.predict(classifier(Xc[:4]), pred_type="glm")
    assert glm.probs.shape == (4, 3) and np.allclose(glm.probs.sum(-1), 1.0)


# -- errors -----------------------------------------------------------------------------------
@bdl.model
def saddle():
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("bump", 2.0 * x**2)  # U = x²/2 − 2x²: a maximum at 0, U'' = −3


def test_not_positive_definite_is_reported_and_damped_on_request():
    with pytest.raises(InferenceError, match=r"1 eigenvalue\(s\) <= 0.*smallest -3.*damping="):
        _fit(saddle(), num_steps=0, init={"x": 0.0}, curvature="hessian", precision="float64")
    post = _fit(
        saddle(),
        num_steps=0,
        init={"x": 0.0},
        curvature="hessian",
        damping=4.0,
        precision="float64",
    )
    np.testing.assert_allclose(post.guide.precision, [[1.0]])


def test_an_indefinite_ggn_names_the_terms_it_keeps_exact():
    """The GGN is already the curvature the Hessian's message points to: its own message names
    what can make it indefinite (a scale output of the network) instead."""
    with pytest.raises(InferenceError, match="noise scale that the network outputs") as info:
        checked_precision(np.diag([1.0, -1.0]), "full", None, "ggn")
    assert "use curvature='ggn'" not in str(info.value) and "damping=1.1" in str(info.value)


def test_errors_name_what_is_missing(monkeypatch):
    @bdl.model
    def mixture(y):
        z = bdl.sample("z", dist.Bernoulli(probs=0.5))
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        bdl.sample("y", dist.Normal(mu + z, 1.0), obs=y)

    with pytest.raises(ModelError, match=r"discrete latent site\(s\) \['z'\]"):
        _fit(mixture(np.array(0.5)), num_steps=5)
    with pytest.raises(ConfigError, match="subset='last_layer' needs an nn layer.*'w'"):
        _fit(linear(X, Y), num_steps=5, subset="last_layer")
    monkeypatch.setattr(laplace_method, "FULL_LIMIT", 2)
    with pytest.raises(ConfigError, match="over 3 weights.*Use hessian='diag' or subset"):
        _fit(linear(X, Y), num_steps=5)
    with pytest.raises(ConfigError, match="num_steps=0 takes init as the MAP"):
        _fit(linear(X, Y), num_steps=0, hessian="diag")
    with pytest.raises(ConfigError, match="hessian must be one of"):
        bdl.Laplace(hessian="block")

    @bdl.model
    def robust(y):
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        bdl.sample("y", dist.StudentT(3.0, mu, 1.0), obs=y)

    with pytest.raises(ConfigError, match=r"\{'y': 'StudentT'\}.*curvature='hessian'"):
        _fit(robust(np.array(0.5)), num_steps=5)


def test_marglik_prior_precision_meets_mackays_fixed_point():
    post = _fit(
        linear(X, Y),
        num_steps=0,
        init={"w": MEAN},
        prior_precision="marglik",
        precision="float64",
    )
    c = post.guide.settings["prior_precision_scale"]
    assert post.settings["prior_precision_scale"] == c
    lam = np.full(3, 1 / PRIOR**2)
    precision = X.T @ X / NOISE**2 + c * np.diag(lam)
    np.testing.assert_allclose(post.guide.precision, precision, rtol=1e-10)
    # MacKay (1992): c = γ / Σ λ₀ θ*², γ = k − c tr(P⁻¹ Λ₀)
    gamma = 3 - c * np.trace(np.linalg.solve(precision, np.diag(lam)))
    assert c == pytest.approx(gamma / np.sum(lam * MEAN**2), rel=1e-5)

    @bdl.model
    def scale_only():
        bdl.sample("s", dist.HalfNormal(1.0))

    with pytest.raises(ConfigError, match="none of the Gaussian sites has one"):
        _fit(scale_only(), num_steps=0, init={"s": 1.0}, prior_precision="marglik")
