"""Guides: the registry, custom DSL guides (fit with ours and with the backends' own SVI),
name mismatches, delta (MAP), constrained sites, and guide.log_prob against the draws."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist

Y = np.random.default_rng(0).normal(1.5, 1.0, size=30)
# Exact posterior of mu: prior N(0, 10^2), unit noise.
POST_VAR = 1.0 / (1.0 / 100.0 + len(Y))
POST_MEAN = POST_VAR * Y.sum()


@bdl.model
def normal_mean(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


@bdl.guide
def normal_guide(y):
    loc = bdl.param("mu_loc", 0.0)
    scale = bdl.param("mu_scale", 1.0, constraint="positive")
    bdl.sample("mu", dist.Normal(loc, scale))


def test_registry_lists_builtin_guides():
    assert {"meanfield", "lowrank", "fullrank", "flow", "delta"} <= set(bdl.guides.available())

    @bdl.guides.register("my_meanfield_test")
    def factory(layout, backend, init, seed=0):
        from ppl_bdl.inference.vi.guides.meanfield import MeanFieldGuide

        return MeanFieldGuide(layout, backend, init, seed, init_scale=0.1)

    post = bdl.fit(
        normal_mean(Y),
        backend="numpyro",
        method="vi",
        guide="my_meanfield_test",
        num_steps=500,
        lr=0.05,
        num_samples=10,
        progress=False,
    )
    assert post.guide.name == "meanfield"


@pytest.mark.slow_on("pyro")  # the same check runs on NumPyro by default
def test_custom_guide_fits_with_ours(backend):
    post = bdl.fit(
        normal_mean(Y),
        backend=backend,
        method="vi",
        guide=normal_guide,
        num_steps=1000,
        lr=0.05,
        schedule="exponential",
        decay=0.01,
        num_particles=4,
        num_samples=1000,
        progress=False,
    )
    params = post.guide.describe()
    sd = np.sqrt(POST_VAR)
    assert abs(params["mu_loc"] - POST_MEAN) < 0.1 * sd
    assert abs(params["mu_scale"] - sd) < 0.1 * sd
    assert abs(post.samples["mu"].mean() - POST_MEAN) < 0.1 * sd + 4 * sd / np.sqrt(1000)
    lp = post.guide.log_prob({"mu": np.array([POST_MEAN])})
    expected = -0.5 * np.log(2 * np.pi * params["mu_scale"] ** 2)
    np.testing.assert_allclose(lp, [expected], atol=0.05)


def test_lowered_guide_works_with_numpyro_svi():
    import jax
    import numpyro
    from numpyro.infer import SVI, Trace_ELBO

    model = normal_mean(Y).lower("numpyro")
    guide = normal_guide(Y).lower("numpyro")
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 2000, progress_bar=False)
    sd = np.sqrt(POST_VAR)
    assert abs(float(result.params["mu_loc"]) - POST_MEAN) < 0.2 * sd
    assert abs(float(result.params["mu_scale"]) - sd) < 0.3 * sd


def test_lowered_guide_works_with_pyro_svi():
    import pyro
    from pyro.infer import SVI, Trace_ELBO

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = normal_mean(Y).lower("pyro")
    guide = normal_guide(Y).lower("pyro")
    # A decaying step size (lrd) so the final parameters are not dominated by gradient noise.
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.05, "lrd": 0.998}), Trace_ELBO())
    for _ in range(2000):
        svi.step()
    sd = np.sqrt(POST_VAR)
    assert abs(float(pyro.param("mu_loc").detach()) - POST_MEAN) < 0.2 * sd
    assert abs(float(pyro.param("mu_scale").detach()) - sd) < 0.3 * sd


def test_guide_with_wrong_sites_lists_both_sets():
    @bdl.guide
    def wrong(y):
        loc = bdl.param("loc", 0.0)
        bdl.sample("nu", dist.Normal(loc, 1.0))

    with pytest.raises(
        bdl.ModelError, match=r"Guide sample sites: \['nu'\].*model latent sites: \['mu'\]"
    ):
        bdl.fit(
            normal_mean(Y),
            backend="numpyro",
            method="vi",
            guide=wrong,
            num_steps=5,
            num_samples=2,
            progress=False,
        )


def test_model_as_guide_is_refused():
    with pytest.raises(bdl.ConfigError, match="@bdl.guide"):
        bdl.fit(
            normal_mean(Y),
            backend="numpyro",
            method="vi",
            guide=normal_mean,
            num_steps=5,
            num_samples=2,
            progress=False,
        )


@bdl.model
def positive_scale(y):
    s = bdl.sample("s", dist.HalfNormal(2.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(0.0, s), obs=y[idx])


def test_delta_is_map_in_unconstrained_space(backend):
    y = np.random.default_rng(1).normal(0.0, 2.0, size=200)
    post = bdl.fit(
        positive_scale(y),
        backend=backend,
        method="vi",
        guide="delta",
        num_steps=1500,
        lr=0.05,
        num_samples=3,
        progress=False,
    )
    s = post.samples["s"]
    assert np.all(s == s.flat[0])
    # The mode of log p(log s | y) + log s: close to the sample standard deviation.
    assert abs(s.flat[0] - y.std()) < 0.1
    # guide.params: the point in the site's own space (s itself, not log s, the raw loc).
    params, raw = post.guide.params, post.guide.raw_params
    assert list(params) == ["s"] and params["s"].shape == () and list(raw) == ["loc"]
    np.testing.assert_allclose(params["s"], s.flat[0], rtol=1e-6)
    np.testing.assert_allclose(np.log(params["s"]), raw["loc"][0], rtol=1e-5)


@pytest.mark.parametrize(
    "guide,kw",
    [
        ("meanfield", {}),
        ("lowrank", {"rank": 1}),
        ("fullrank", {}),
        ("flow", {"num_layers": 2, "hidden": 4}),
    ],
)
def test_guide_log_prob_matches_sampling_density(guide, kw):
    """log q from sample() and from log_prob() agree on the guide's own draws (both backends)."""
    y = np.random.default_rng(1).normal(0.0, 2.0, size=20)
    for backend in bdl.backends.available():
        post = bdl.fit(
            positive_scale(y),
            backend=backend,
            method="vi",
            guide=guide,
            num_steps=50,
            lr=0.05,
            num_samples=3,
            progress=False,
            precision="float64",
            **kw,
        )
        g = post.guide.guide
        be = g.backend
        with be.scope(), be.activate():
            params = g.unpack(be.asarray(post.guide.phi))
            theta, log_q = g.sample(params, be.random.key(0), 5)
            again = g.log_prob(params, theta)
        np.testing.assert_allclose(be.to_numpy(log_q), be.to_numpy(again), rtol=1e-6, atol=1e-6)
        draws = post.guide.sample(4)
        assert np.all(draws["s"] > 0)


@bdl.model
def unknown_noise(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    noise = bdl.param("noise", 1.0, constraint="positive")
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, noise), obs=y[idx])


def test_model_params_are_fitted_as_point_estimates(backend):
    y = np.random.default_rng(0).normal(2.0, 0.3, size=500)
    post = bdl.fit(
        unknown_noise(y),
        backend=backend,
        method="vi",
        num_steps=2000,
        lr=0.02,
        batch_size=100,
        num_samples=200,
        progress=False,
    )
    # The maximum-likelihood noise given mu ~ q is about the sample standard deviation.
    assert abs(float(post.params["noise"]) - y.std()) < 0.03
    assert abs(post.samples["mu"].mean() - y.mean()) < 0.05
