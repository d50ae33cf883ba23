"""Posterior: shapes, ArviZ groups and dims, LOO, save/load, thinning, reproducibility, predict."""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def linreg(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    bdl.deterministic("w_norm", bm.sqrt(bm.sum(w**2)))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])


@bdl.model
def logistic(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 2.0), shape=(X.shape[1], 3))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=X[idx] @ w), obs=None if y is None else y[idx])


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.3 * rng.normal(size=n)
    return X, y


@pytest.fixture(scope="module", params=bdl.backends.available())
def fitted(request):
    X, y = _data()
    post = bdl.fit(
        linreg(X, y),
        backend=request.param,
        num_warmup=150,
        num_samples=60,
        num_chains=2,
        thinning=2,
        seed=3,
        progress=False,
    )
    return request.param, post, X, y


def test_shapes_thinning_and_stats(fitted):
    _, post, _, _ = fitted
    assert post.samples["w"].shape == (2, 60, 3)
    assert post.samples["sigma"].shape == (2, 60)
    assert post.samples["w_norm"].shape == (2, 60)
    np.testing.assert_allclose(
        post.samples["w_norm"], np.linalg.norm(post.samples["w"], axis=-1), rtol=1e-4
    )
    for key in ("diverging", "tree_depth", "step_size", "acceptance_rate", "lp"):
        assert post.sample_stats[key].shape == (2, 60), key
    assert post.latent_names == ["w", "sigma"]


def test_same_seed_same_draws(fitted):
    backend, post, X, y = fitted
    again = bdl.fit(
        linreg(X, y),
        backend=backend,
        num_warmup=150,
        num_samples=60,
        num_chains=2,
        thinning=2,
        seed=3,
        progress=False,
    )
    np.testing.assert_array_equal(post.samples["w"], again.samples["w"])


def test_arviz_groups_dims_and_loo(fitted):
    _, post, _, _ = fitted
    idata = post.to_arviz()
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(idata.groups())
    assert idata.posterior["w"].dims == ("chain", "draw", "w_dim_0")
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert idata.observed_data["y"].dims == ("data",)
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo)
    summary = post.summary()
    assert "r_hat" in summary.columns and "w[0]" in summary.index


def test_pointwise_log_likelihood_is_exact(fitted):
    _, post, X, y = fitted
    w, s = post.samples["w"], post.samples["sigma"]
    mean = np.einsum("nk,cdk->cdn", X, w)
    expected = -0.5 * np.log(2 * np.pi * s[..., None] ** 2) - 0.5 * ((y - mean) / s[..., None]) ** 2
    np.testing.assert_allclose(post.log_likelihood["y"], expected, rtol=1e-3, atol=1e-3)


def test_posterior_predictive_group(fitted):
    _, post, _, _ = fitted
    idata = post.to_arviz(posterior_predictive=True)
    assert idata.posterior_predictive["y"].shape == (2, 60, 40)


def test_save_and_load_round_trip(fitted, tmp_path):
    _, post, _, _ = fitted
    path = post.save(tmp_path / "post.nc")
    loaded = bdl.load(path)
    for name in post.samples:
        np.testing.assert_array_equal(loaded.samples[name], post.samples[name])
    np.testing.assert_array_equal(loaded.log_likelihood["y"], post.log_likelihood["y"])
    assert loaded.backend == post.backend and loaded.method == "nuts"
    assert loaded.latent_names == post.latent_names


def test_predict_decomposes_variance(fitted):
    _, post, X, _ = fitted
    X_new = np.vstack([X[:3], 10 * X[:1]])
    pred = post.predict(linreg(X_new))
    assert pred.draws["y"].shape == (120, 4)
    np.testing.assert_allclose(pred.total, pred.aleatoric + pred.epistemic, rtol=1e-6)
    # aleatoric = E[sigma^2]; epistemic = Var[x w] exactly, from the same draws
    sigma2 = (post.samples["sigma"] ** 2).reshape(-1).mean()
    np.testing.assert_allclose(pred.aleatoric, sigma2, rtol=1e-4)
    w = post.samples["w"].reshape(-1, 3)
    np.testing.assert_allclose(pred.epistemic, (X_new @ w.T).var(axis=1), rtol=1e-3)
    assert pred.epistemic[3] > 10 * pred.epistemic[0]  # far from the data, more epistemic
    assert pred.rmse(X_new @ w.mean(0)) < 1e-3
    sub = post.predict(linreg(X_new), num_samples=17, seed=1)
    assert sub.draws["y"].shape == (17, 4)


@pytest.mark.parametrize("backend", ["pyro", pytest.param("numpyro", marks=pytest.mark.slow)])
def test_classification_predict_entropies(backend):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = np.digitize(X @ np.array([2.0, -1.0, 0.0]), [-1.0, 1.0]).astype(np.int64)
    post = bdl.fit(
        logistic(X, y),
        backend=backend,
        num_warmup=150,
        num_samples=80,
        num_chains=1,
        progress=False,
    )
    pred = post.predict(logistic(X[:5]))
    assert pred.kind == "classification" and pred.probs.shape == (5, 3)
    np.testing.assert_allclose(pred.probs.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(pred.total, pred.aleatoric + pred.epistemic, rtol=1e-6, atol=1e-9)
    assert np.all(pred.epistemic >= 0)
    assert np.isfinite(pred.log_likelihood(y[:5]))


def test_prior_predictive(backend):
    X, _ = _data(n=7)
    prior = bdl.prior_predictive(linreg(X), backend=backend, num_samples=300, seed=0)
    assert prior.draws["y"].shape == (300, 7)
    assert prior.draws["w"].shape == (300, 3)
    # w ~ N(0, 1): sample variance within 4 standard errors of 1
    var = prior.draws["w"].var(axis=0)
    assert np.all(np.abs(var - 1.0) < 4 * np.sqrt(2 / 300))


def test_datatree_export_matches_inference_data(fitted):
    """The ArviZ 1.x layout (xarray DataTree) holds the same groups, dims and values."""
    _, post, _, _ = fitted
    from ppl_bdl.posterior.arviz_export import to_datatree

    tree = to_datatree(post)
    idata = post.to_arviz()
    for group in ("posterior", "sample_stats", "log_likelihood", "observed_data"):
        ds_tree, ds_idata = tree[group].to_dataset(), getattr(idata, group)
        assert set(ds_tree.data_vars) == set(ds_idata.data_vars), group
        for name in ds_tree.data_vars:
            assert ds_tree[name].dims == ds_idata[name].dims, (group, name)
            np.testing.assert_array_equal(ds_tree[name].values, ds_idata[name].values)
    assert tree["posterior"].attrs["ppl_bdl_backend"] == post.backend


def test_datatree_netcdf_round_trip(fitted, tmp_path):
    import xarray as xr

    from ppl_bdl.posterior.arviz_export import to_datatree
    from ppl_bdl.posterior.posterior import from_arviz_data

    _, post, _, _ = fitted
    to_datatree(post).to_netcdf(tmp_path / "tree.nc")
    loaded = from_arviz_data(xr.open_datatree(tmp_path / "tree.nc"))
    np.testing.assert_array_equal(loaded.samples["w"], post.samples["w"])
    assert loaded.latent_names == post.latent_names
