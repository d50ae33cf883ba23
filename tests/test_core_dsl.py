"""The DSL, the backends registry, lowering to native tools, and import hygiene."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def linreg(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.3 * rng.normal(size=n)
    return X, y


def test_import_loads_no_backend_library():
    code = "import sys, ppl_bdl; print(sorted(m for m in ('torch','jax','pyro','numpyro') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_backends_available_and_unknown():
    assert set(bdl.backends.available()) >= {"pyro", "numpyro"}
    with pytest.raises(bdl.BackendError, match="installed"):
        bdl.backends.get("tensorflow")


def test_binding_does_not_run_the_model():
    calls = []

    @bdl.model
    def counted(y):
        calls.append(1)
        bdl.sample("mu", dist.Normal(0.0, 1.0))

    bound = counted(np.zeros(3))
    assert isinstance(bound, bdl.BoundModel) and calls == []


def test_data_types_bind(backend):
    import pandas as pd

    X, y = _data()
    frame = pd.DataFrame(X)
    series = pd.Series(y)
    sites = bdl.trace.layout.trace_model(linreg(frame, series), bdl.backends.get(backend))
    assert tuple(sites["y"].value.shape) == (40,)
    sites = bdl.trace.layout.trace_model(linreg(X.tolist(), list(y)), bdl.backends.get(backend))
    assert tuple(sites["w"].value.shape) == (3,)


def test_event_shapes_outside_and_inside_plates(backend):
    @bdl.model
    def shapes():
        bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2, 3))
        bdl.sample("v", dist.Normal(np.zeros(4), 1.0))
        with bdl.plate("data", 5):
            bdl.sample("z", dist.Normal(0.0, 1.0), shape=(2,))
            bdl.sample("u", dist.Normal(0.0, 1.0))

    sites = bdl.trace.layout.trace_model(shapes(), bdl.backends.get(backend), missing="prior")
    assert sites["w"].shape.value == (2, 3) and sites["w"].shape.event_ndims == 2
    assert sites["v"].shape.value == (4,) and sites["v"].shape.event_ndims == 1
    assert sites["z"].shape.value == (5, 2) and sites["z"].shape.batch == (5,)
    assert sites["u"].shape.value == (5,) and sites["u"].shape.event_ndims == 0


@pytest.mark.parametrize("name", ["pyro", "numpyro"])
def test_lowered_model_runs_in_native_mcmc_and_predictive(name):
    X, y = _data()
    native = linreg(X, y).lower(name)
    if name == "numpyro":
        import jax
        from numpyro.infer import MCMC, NUTS, Predictive

        mcmc = MCMC(NUTS(native), num_warmup=100, num_samples=100, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0))
        w = np.asarray(mcmc.get_samples()["w"])
        pred = Predictive(linreg(X).lower(name), mcmc.get_samples())(jax.random.PRNGKey(1))
        assert pred["y"].shape == (100, 40)
    else:
        import pyro
        from pyro.infer import MCMC, NUTS, Predictive

        pyro.set_rng_seed(0)
        mcmc = MCMC(NUTS(native), num_samples=100, warmup_steps=100, disable_progbar=True)
        mcmc.run()
        w = mcmc.get_samples()["w"].numpy()
        pred = Predictive(linreg(X).lower(name), mcmc.get_samples())()
        assert tuple(pred["y"].shape) == (100, 40)
    assert w.shape == (100, 3)
    np.testing.assert_allclose(w.mean(0), [1.0, -1.0, 0.5], atol=0.2)


def test_lowered_model_native_trace_shapes():
    import numpyro
    from numpyro import handlers

    X, y = _data()
    native = linreg(X, y).lower("numpyro")
    with numpyro.handlers.seed(rng_seed=0):
        trace = handlers.trace(native).get_trace()
    assert trace["w"]["fn"].event_shape == (3,)
    assert trace["y"]["fn"].batch_shape == (40,)
    assert trace["data"]["type"] == "plate"


def test_math_dispatches_to_each_backend(backend):
    be = bdl.backends.get(backend)
    with be.activate():
        x = be.asarray(np.array([0.0, 1.0, 2.0]))
        np.testing.assert_allclose(
            be.to_numpy(bm.logsumexp(x)), np.log(np.exp([0, 1, 2]).sum()), rtol=1e-5
        )
        np.testing.assert_allclose(be.to_numpy(bm.softmax(x)).sum(), 1.0, rtol=1e-5)
        np.testing.assert_allclose(
            be.to_numpy(bm.sum(bm.exp(x))), np.exp([0, 1, 2]).sum(), rtol=1e-5
        )


def test_math_outside_a_run_is_a_clear_error():
    with pytest.raises(bdl.ModelError, match="outside a model run"):
        bm.exp(1.0)


def test_float64_precision(backend):
    X, y = _data()
    post = bdl.fit(
        linreg(X, y),
        backend=backend,
        num_warmup=50,
        num_samples=20,
        num_chains=1,
        precision="float64",
        progress=False,
    )
    assert post.samples["w"].dtype == np.float64


def test_uninstalled_backend_names_the_extra(monkeypatch):
    from ppl_bdl import backends

    monkeypatch.setattr(backends, "_installed", lambda name: name != "pyro")
    assert backends.available() == ["numpyro"]
    with pytest.raises(bdl.BackendError, match=r"pip install 'ppl_bdl\[pyro\]'"):
        backends.get("pyro", precision="float64")


def test_backends_are_found_through_entry_points():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="ppl_bdl.backends")}
    assert {"pyro", "numpyro"} <= names


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_factor_target_and_hmc(backend):
    """A standard normal written as a flat prior plus a factor: NUTS and HMC recover it."""

    @bdl.model
    def by_factor():
        x = bdl.sample("x", dist.ImproperUniform(), shape=(2,))
        bdl.factor("target", -0.5 * bm.sum(x**2))

    for method, extra in (("nuts", {}), ("hmc", {"num_steps": 8})):
        post = bdl.fit(
            by_factor(),
            backend=backend,
            method=method,
            num_warmup=300,
            num_samples=500,
            num_chains=2,
            seed=1,
            progress=False,
            **extra,
        )
        x = post.samples["x"].reshape(-1, 2)
        ess = float(np.min(__import__("arviz").ess(post.to_arviz(), var_names=["x"])["x"].values))
        # mean within 4 MCSE (sd 1 / sqrt(ESS)); variance within 4 of its MC error sqrt(2 / ESS)
        assert np.all(np.abs(x.mean(0)) < 4 / np.sqrt(ess)), (method, x.mean(0), ess)
        assert np.all(np.abs(x.var(0) - 1.0) < 4 * np.sqrt(2 / ess)), (method, x.var(0), ess)
        if method == "hmc":
            assert "tree_depth" not in post.sample_stats


def test_param_is_refused_by_nuts_unless_held(backend):
    """MCMC samples latent sites only: a ``bdl.param`` is refused, naming it, unless
    ``hold_params=True`` holds it at its initial value."""

    @bdl.model
    def with_param(y):
        scale = bdl.param("noise", 2.0, constraint="positive")
        mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
        with bdl.plate("data", y.shape[0]) as idx:
            bdl.sample("y", dist.Normal(mu, scale), obs=y[idx])

    y = np.array([1.0, 3.0])
    with pytest.raises(bdl.ConfigError, match=r"bdl.param site\(s\) \['noise'\].*hold_params=True"):
        bdl.fit(with_param(y), backend=backend, num_warmup=10, num_samples=10, progress=False)
    post = bdl.fit(
        with_param(y),
        backend=backend,
        num_warmup=300,
        num_samples=400,
        num_chains=1,
        seed=0,
        progress=False,
        hold_params=True,
    )
    np.testing.assert_allclose(post.params["noise"], 2.0)
    # conjugate: posterior sd of mu = 1 / sqrt(1/100 + 2/4)
    sd = 1 / np.sqrt(1 / 100 + 2 / 4)
    assert abs(post.samples["mu"].std() - sd) < 0.15 * sd


def test_local_latents_in_a_plate(backend):
    """Eight schools, centered, with theta as a plate-local latent: shapes and dims."""
    y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
    sigma = np.array([15.0, 10, 16, 11, 9, 11, 10, 18])

    @bdl.model
    def centered(y, sigma):
        mu = bdl.sample("mu", dist.Normal(0.0, 5.0))
        tau = bdl.sample("tau", dist.HalfCauchy(5.0))
        with bdl.plate("school", 8) as idx:
            theta = bdl.sample("theta", dist.Normal(mu, tau))
            bdl.sample("y", dist.Normal(theta, sigma[idx]), obs=y[idx])

    post = bdl.fit(
        centered(y, sigma),
        backend=backend,
        num_warmup=100,
        num_samples=50,
        num_chains=1,
        progress=False,
    )
    assert post.samples["theta"].shape == (1, 50, 8)
    assert post.to_arviz().posterior["theta"].dims == ("chain", "draw", "school")


def test_numpyro_vectorized_chains_match_their_own_settings():
    X, y = _data()
    kw = dict(
        backend="numpyro", num_warmup=100, num_samples=50, num_chains=2, seed=0, progress=False
    )
    vec = bdl.fit(linreg(X, y), chain_method="vectorized", **kw)
    assert vec.samples["w"].shape == (2, 50, 3)
    np.testing.assert_allclose(vec.samples["w"].mean((0, 1)), [1.0, -1.0, 0.5], atol=0.2)
    with pytest.raises(bdl.ConfigError, match="chain_method"):
        bdl.fit(linreg(X, y), chain_method="threads", **kw)
