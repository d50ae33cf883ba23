"""save/load keep everything a fit has, and refuse a model or a file that does not match.

The regression tests use the inputs of the "Trust" issue: a VI fit of a regression whose noise
scale is a ``bdl.param`` (lost on save, so ``predict`` after ``load`` used its initial value and
the predictive variance was off by 0.9); loading a VI file with another model of the same
dimension; a truncated and a non-NetCDF file; the plate dim ``data`` (it came back as
``y_dim_0``).
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.run.persistence import EXPECTED


@bdl.model
def noise_param(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    s = bdl.param("s", 1.0, constraint="positive")  # the noise scale, a point estimate under VI
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, s), obs=None if y is None else y[idx])


@bdl.model
def same_dimension(X, y=None):
    v = bdl.sample("v", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ v, 1.0), obs=None if y is None else y[idx])


def _data(n=100):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, X @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=n)


@pytest.fixture(scope="module", params=bdl.backends.available())
def vi_fit(request, tmp_path_factory):
    X, y = _data()
    post = bdl.fit(
        noise_param(X, y),
        backend=request.param,
        method="vi",
        num_steps=600,
        lr=0.05,
        num_samples=100,
        seed=1,
        progress=False,
    )
    post.settings = {"method": "vi", "backend": request.param, "num_steps": 600, "lr": 0.05}
    path = post.save(tmp_path_factory.mktemp("vi") / "vi.nc")
    return post, path, X, y


def test_fitted_param_survives_save_and_load(vi_fit):
    post, path, X, y = vi_fit
    # The fit moved the noise scale from its initial 1.0 to about the true 0.3.
    assert abs(float(post.params["s"]) - 0.3) < 0.1
    back = bdl.load(path, model=noise_param(X, y))
    np.testing.assert_array_equal(back.params["s"], post.params["s"])
    before, after = post.predict(noise_param(X[:3])), back.predict(noise_param(X[:3]))
    # Before the fix the loaded posterior predicted with s = 1: total variance off by ~0.9.
    np.testing.assert_allclose(after.total, before.total, rtol=1e-6)
    np.testing.assert_allclose(after.aleatoric, float(post.params["s"]) ** 2, rtol=1e-5)


def test_vi_round_trip_keeps_everything(vi_fit):
    post, path, X, y = vi_fit
    back = bdl.load(path, model=noise_param(X, y))
    for name in post.samples:
        np.testing.assert_array_equal(back.samples[name], post.samples[name])
    np.testing.assert_array_equal(back.log_likelihood["y"], post.log_likelihood["y"])
    np.testing.assert_array_equal(back.observed_data["y"], post.observed_data["y"])
    np.testing.assert_array_equal(back.losses, post.losses)
    np.testing.assert_array_equal(back.guide.phi, post.guide.phi)
    assert back.guide.name == "meanfield"
    assert back.settings == post.settings
    assert back.dims == post.dims and back.dims["y"] == ["data"]
    assert (back.method, back.backend, back.precision) == ("vi", post.backend, post.precision)
    assert back.latent_names == post.latent_names and back.model_name == "noise_param"


def test_another_model_of_the_same_dimension_is_refused(vi_fit):
    _, path, X, y = vi_fit
    with pytest.raises(bdl.ModelError) as info:
        bdl.load(path, model=same_dimension(X, y))
    message = str(info.value)
    assert str(path) in message
    assert "'noise_param'" in message and "'same_dimension'" in message
    assert "['w']" in message and "['v']" in message and "['s']" in message


def test_a_model_with_other_shapes_is_refused(vi_fit):
    _, path, _, _ = vi_fit
    X3 = np.ones((10, 3))
    with pytest.raises(
        bdl.ModelError, match=r"latent site 'w' has shape \(3,\) in the model but \(2,\)"
    ):
        bdl.load(path, model=noise_param(X3, np.zeros(10)))


def test_truncated_and_foreign_files_raise_data_error(vi_fit, tmp_path):
    _, path, _, _ = vi_fit
    data = path.read_bytes()
    truncated = tmp_path / "truncated.nc"
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "notes.nc"
    text.write_text("not a NetCDF file\n")
    other = tmp_path / "other.nc"
    az.from_dict(posterior={"a": np.zeros((1, 5))}).to_netcdf(str(other))
    for bad in (truncated, text, other):
        with pytest.raises(bdl.DataError) as info:
            bdl.load(bad)
        assert str(bad) in str(info.value) and EXPECTED in str(info.value)
    with pytest.raises(FileNotFoundError, match="no posterior file"):
        bdl.load(tmp_path / "missing.nc")


def test_saved_file_is_an_arviz_file_with_plate_dims(vi_fit):
    _, path, _, _ = vi_fit
    idata = az.from_netcdf(str(path))
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert idata.observed_data["y"].dims == ("data",)
    back = bdl.load(path).to_arviz()
    assert back.log_likelihood["y"].dims == ("chain", "draw", "data")


def test_nuts_round_trip_keeps_sample_stats_and_dims(tmp_path):
    X, y = _data(30)
    post = bdl.fit(
        same_dimension(X, y), num_warmup=30, num_samples=20, num_chains=1, progress=False
    )
    back = bdl.load(post.save(tmp_path / "nuts.nc"), model=same_dimension(X, y))
    assert set(back.sample_stats) == set(post.sample_stats)
    for key, value in post.sample_stats.items():
        np.testing.assert_array_equal(back.sample_stats[key], value)
        assert back.sample_stats[key].dtype == value.dtype, key
    assert back.dims == post.dims and back.params == {} and back.losses is None
    assert back.guide is None and back.model is not None


def test_old_files_without_signature_load(tmp_path, vi_fit):
    """A file from before the signature and params were saved still loads (params unknown)."""
    import xarray as xr

    post, _, X, y = vi_fit
    old = tmp_path / "old.nc"
    idata = post.to_arviz()
    idata.to_netcdf(str(old))
    back = bdl.load(old, model=noise_param(X, y))
    assert back.params == {} and back.dims["y"] == ["data"]
    with pytest.raises(bdl.ModelError, match="'v'"):
        bdl.load(old, model=same_dimension(X, y))
    xr.Dataset().to_netcdf(old, engine="h5netcdf")
    with pytest.raises(bdl.DataError, match="no groups"):
        bdl.load(old)
