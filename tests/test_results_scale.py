"""Results that scale with the data: the pointwise log-likelihood computed in chunks only when
read (or never), and prediction compiled once per model and shape, run in chunks of draws and of
points with the same answer as in one piece."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.inference import common
from ppl_bdl.models import bnn, regression
from ppl_bdl.posterior import predictive_runner


@pytest.fixture(scope="module")
def fits():
    X, y = regression.make_sine_data(n=60, seed=2)
    model = bnn.make_bnn_regression(hidden=(8,))
    out = {}
    for backend in bdl.backends.available():
        out[backend] = bdl.fit(
            model(X, y),
            backend=backend,
            method="vi",
            num_steps=300,
            lr=0.02,
            num_samples=40,
            seed=0,
            progress=False,
        )
    return model, X, y, out


def test_log_likelihood_is_computed_when_read_and_in_chunks(backend, fits, monkeypatch):
    model, X, y, posts = fits
    post = posts[backend]
    assert "computed when first read" in repr(post.log_likelihood)
    assert list(post.log_likelihood) == ["y"]
    whole = post.log_likelihood["y"]
    assert whole.shape == (1, 40, 60) and "(computed)" in repr(post.log_likelihood)
    # The same values in chunks of 3 draws (REPLAY_POINTS / 60 points = 3).
    monkeypatch.setattr(common, "REPLAY_POINTS", 180)
    again = bdl.fit(
        model(X, y),
        backend=backend,
        method="vi",
        num_steps=300,
        lr=0.02,
        num_samples=40,
        seed=0,
        progress=False,
    )
    np.testing.assert_allclose(again.log_likelihood["y"], whole, rtol=1e-5, atol=1e-6)
    skipped = bdl.fit(
        model(X, y),
        backend=backend,
        method="vi",
        num_steps=10,
        num_samples=4,
        progress=False,
        log_likelihood=False,
    )
    assert dict(skipped.log_likelihood) == {}
    assert "log_likelihood" not in skipped.to_arviz().groups()


def test_prediction_in_chunks_equals_one_piece(backend, fits, monkeypatch):
    model, X, _, posts = fits
    post = posts[backend]
    whole = post.predict(model(X), seed=3)
    # 7 draws x 5 points per compiled call: draws and points both in several chunks.
    monkeypatch.setattr(predictive_runner, "MAX_DRAWS_PER_CALL", 7)
    monkeypatch.setattr(predictive_runner, "CHUNK_ELEMENTS", 35)
    chunked = post.predict(model(X), seed=3)
    np.testing.assert_allclose(chunked.mean, whole.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chunked.epistemic, whole.epistemic, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(chunked.aleatoric, whole.aleatoric, rtol=1e-4, atol=1e-6)
    assert chunked.draws["y"].shape == whole.draws["y"].shape == (40, 60)


def test_prediction_compiles_once_per_model_and_shape(fits, monkeypatch):
    model, X, y, posts = fits
    post = posts["numpyro"] if "numpyro" in posts else None
    if post is None:
        pytest.skip("needs the numpyro backend")
    calls = {"n": 0}
    original = model.fn

    def counted(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "fn", counted)
    post.predict(model(X[:30]))
    first = calls["n"]
    post.predict(model(X[30:]))  # new inputs, same shape: no new trace of the compiled run
    # only the validating run of the new inputs: the bounds check (JAX clamps gathers) and the
    # prediction are compiled once per shape
    assert calls["n"] - first == 1
    before = calls["n"]
    post.predict(model(X[:10]))  # a new shape traces as much as the first prediction did
    assert calls["n"] - before == first


def test_predict_names_latent_sites_the_posterior_lacks(backend, fits):
    _, X, _, posts = fits
    post = posts[backend]

    @bdl.model
    def other(X, y=None):
        w = bdl.sample("w_other", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=None if y is None else y[idx])

    with pytest.raises(bdl.ModelError, match=r"latent site\(s\) \['w_other'\]"):
        post.predict(other(X))
