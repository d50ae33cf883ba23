"""Regression BNNs with the noise model as an argument: the log density is the one written down
(checked against SciPy), each noise model fits, and a heteroscedastic head learns a noise that
grows where the data's does."""

from __future__ import annotations

import numpy as np
import pytest
from numpyro.infer.util import log_density
from scipy import stats

import ppl_bdl as bdl
from ppl_bdl.errors import ModelError
from ppl_bdl.models import bnn
from ppl_bdl.models.regression import make_sine_data


def weights(outputs: int, rng) -> dict[str, np.ndarray]:
    return {
        "net.0.weight": 0.5 * rng.normal(size=(1, 4)),
        "net.0.bias": 0.5 * rng.normal(size=4),
        "net.1.weight": 0.5 * rng.normal(size=(4, outputs)),
        "net.1.bias": 0.5 * rng.normal(size=outputs),
    }


def softplus(x):
    return np.logaddexp(0.0, x)


@pytest.mark.parametrize("noise", ["halfnormal", "gamma", "fixed", "heteroscedastic"])
def test_log_density_is_the_written_model(noise):
    rng = np.random.default_rng(0)
    X, y = make_sine_data(n=12, seed=0)
    model = bnn.make_bnn_regression(
        hidden=(4,), activation="relu", prior_scale=0.7, noise_scale=0.4, noise=noise
    )
    outputs = 2 if noise == "heteroscedastic" else 1
    values = weights(outputs, rng)
    expected = sum(stats.norm(0.0, 0.7).logpdf(v).sum() for v in values.values())
    out = np.maximum(X @ values["net.0.weight"] + values["net.0.bias"], 0.0)
    out = out @ values["net.1.weight"] + values["net.1.bias"]
    if noise == "halfnormal":
        values["sigma"] = 0.3
        expected += stats.halfnorm(scale=0.4).logpdf(0.3)
        sigma = 0.3
    elif noise == "gamma":
        values["precision"] = 2.5
        expected += stats.gamma(a=6.0, scale=1 / 6.0).logpdf(2.5)
        sigma = 2.5**-0.5
    elif noise == "fixed":
        sigma = 0.4
    else:
        sigma = softplus(out[:, 1]) + 1e-3
    expected += stats.norm(out[:, 0], sigma).logpdf(y).sum()
    got, trace = log_density(model(X, y).lower("numpyro"), (), {}, values)
    assert sorted(k for k in trace if k not in ("data", "y")) == sorted(values)
    assert float(got) == pytest.approx(expected, rel=2e-5)  # float32


@pytest.mark.parametrize(
    "noise, backend",
    [
        ("halfnormal", "pyro"),
        ("gamma", "pyro"),
        ("fixed", "pyro"),
        ("heteroscedastic", "pyro"),
        # on NumPyro the log density above is checked by default; the fits (compile-bound) are slow
        pytest.param("gamma", "numpyro", marks=pytest.mark.slow),
        pytest.param("heteroscedastic", "numpyro", marks=pytest.mark.slow),
        pytest.param("fixed", "numpyro", marks=pytest.mark.slow),
    ],
)
def test_each_noise_model_fits(noise, backend):
    X, y = make_sine_data(n=40, seed=1)
    model = bnn.make_bnn_regression(hidden=(8,), activation="relu", noise=noise)
    post = bdl.fit(
        model(X, y), backend=backend, method="vi", num_steps=20, num_samples=10, progress=False
    )
    assert post.samples["net.1.weight"].shape == (1, 10, 8, 2 if noise == "heteroscedastic" else 1)
    pred = post.predict(model(X[:5]))
    assert pred.mean.shape == (5,) and np.all(np.isfinite(pred.total))


def test_the_uci_builder_is_one_layer_of_50_relu_units_with_a_gamma_precision():
    X, y = make_sine_data(n=20, seed=0)
    post = bdl.fit(
        bnn.make_uci_bnn_regression()(X, y),
        backend="pyro",
        method="vi",
        num_steps=5,
        num_samples=3,
        progress=False,
    )
    assert post.samples["net.0.weight"].shape == (1, 3, 1, 50)
    assert post.samples["precision"].shape == (1, 3)


def test_a_heteroscedastic_head_learns_where_the_noise_is():
    # noise sd 0.05 near x = 0 growing to 0.65 at |x| = 3: the fitted aleatoric sd follows it
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, size=400)
    y = np.sin(x) + (0.05 + 0.2 * np.abs(x)) * rng.normal(size=400)
    model = bnn.make_bnn_regression(hidden=(32,), activation="tanh", noise="heteroscedastic")
    post = bdl.fit(
        model(x[:, None], y),
        backend="pyro",
        method="vi",
        num_steps=3000,
        lr=0.02,
        num_samples=50,
        progress=False,
    )
    probe = np.array([[-2.7], [0.0], [2.7]])
    sd = np.sqrt(post.predict(model(probe)).aleatoric)
    assert sd[1] < 0.25 and sd[0] > 2 * sd[1] and sd[2] > 2 * sd[1]


def test_bad_noise_models_are_refused():
    with pytest.raises(ModelError, match="unknown noise model 'student'"):
        bnn.make_bnn_regression(noise="student")
    with pytest.raises(ModelError, match="concentration must be a positive number"):
        bnn.GammaPrecision(concentration=0.0)
    with pytest.raises(ModelError, match="min_scale must be a positive number"):
        bnn.Heteroscedastic(min_scale=-1.0)
