"""``bdl.reparam`` and ``bdl.LocScale`` (ppl_bdl/dsl/reparam.py).

* Change of variables, exactly: for a location-scale family F, the reparameterised model's log
  joint at ``x_decentered = z`` equals the original's at ``x = loc + scale^(1-c) (z - c loc)``
  plus ``(1 - c) log scale`` per element (the log-Jacobian of x -> z), for c in {0, 0.5, 1}, on
  both backends.
* Eight schools, centred (posteriordb), with ``theta`` non-centred by ``LocScale(0)``: NUTS on
  NumPyro diverges less than on the centred model, and the means of theta, mu and tau are within
  4 Monte Carlo standard errors of posteriordb's reference (as tests/test_reference_posteriors.py).
* The site keeps its name and shape in ``post.samples`` and ArviZ (a deterministic there), the
  model predicts, and each mistake gets an error naming the site.
* ``bdl.TransformReparam``: the log joint at ``x_base = z`` is the original's at ``x = T(z)`` plus
  log|det ∂T/∂z|; the site keeps its name and shape (also under ``.expand``/``.to_event`` and
  for a stick-breaking transform, whose base has one entry fewer); other sites are refused.
* Both strategies see through ``.mask``: masked entries add nothing, before or after.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.models import posteriordb as pdb
from ppl_bdl.models.funnel import funnel_centred, funnel_noncentred
from ppl_bdl.posterior.diagnostics import REPARAM_ADVICE
from ppl_bdl.trace.interpreter import Evaluator

BACKENDS = [b for b in ("numpyro", "pyro") if b in bdl.backends.available()]
SCHOOLS = "eight_schools-eight_schools_centered"
NUTS = dict(num_warmup=500, num_samples=1000, num_chains=4, seed=1, progress=False)


def hierarchical(family):
    @bdl.model
    def model():
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        tau = bdl.sample("tau", dist.HalfNormal(1.0))
        with bdl.plate("group", 3):
            bdl.sample("x", family(mu, tau))

    return model


FAMILIES = {
    "Normal": dist.Normal,
    "StudentT": lambda loc, scale: dist.StudentT(3.0, loc, scale),
    "Cauchy": dist.Cauchy,
    "Laplace": dist.Laplace,
    "Logistic": dist.Logistic,
}


def log_joint(bound, backend, values: dict) -> tuple[float, dict]:
    with backend.scope():
        run = Evaluator(
            backend, values={k: backend.asarray(v) for k, v in values.items()}, record=True
        )
        bound.run_with(run)
        sites = {n: backend.to_numpy(s.value) for n, s in run.sites.items()}
        return float(backend.to_numpy(run.log_joint)), sites


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("centered", [0.0, 0.5, 1.0])
def test_log_density_is_the_change_of_variables(backend_name, family, centered):
    backend = bdl.backends.get(backend_name, precision="float64")
    model = hierarchical(FAMILIES[family])
    mu, tau, z = 0.7, 1.9, np.array([-1.2, 0.3, 2.5])
    new_site = "x" if centered == 1.0 else "x_decentered"
    reparameterised = bdl.reparam(model, {"x": bdl.LocScale(centered)})
    lp_new, sites = log_joint(reparameterised(), backend, {"mu": mu, "tau": tau, new_site: z})
    x = mu + tau ** (1 - centered) * (z - centered * mu)
    lp_old, _ = log_joint(model(), backend, {"mu": mu, "tau": tau, "x": x})
    np.testing.assert_allclose(sites["x"], x, rtol=1e-12)
    np.testing.assert_allclose(lp_new, lp_old + 3 * (1 - centered) * np.log(tau), rtol=1e-12)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_loc_scale_sees_through_expand_and_to_event(backend_name):
    backend = bdl.backends.get(backend_name, precision="float64")

    @bdl.model
    def wrapped():
        tau = bdl.sample("tau", dist.HalfNormal(1.0))
        bdl.sample("x", dist.Normal(0.5, tau).expand([2, 3]).to_event(1))

    z = np.array([[-1.2, 0.3, 2.5], [0.1, -0.4, 1.0]])
    reparameterised = bdl.reparam(wrapped, {"x": bdl.LocScale(0)})
    lp_new, sites = log_joint(reparameterised(), backend, {"tau": 1.9, "x_decentered": z})
    lp_old, _ = log_joint(wrapped(), backend, {"tau": 1.9, "x": 0.5 + 1.9 * z})
    np.testing.assert_allclose(sites["x"], 0.5 + 1.9 * z, rtol=1e-12)
    np.testing.assert_allclose(lp_new, lp_old + 6 * np.log(1.9), rtol=1e-12)


# -- TransformReparam ----------------------------------------------------------------------------
T = dist.transforms


@bdl.model
def transformed():
    """x = exp(mu + z / 2) per group (a LogNormal written as transforms of a standard normal);
    w: three LogNormal(0, 1) as one event; s: four 3-simplexes."""
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("group", 3):
        affine_exp = [T.AffineTransform(mu, 0.5), T.ExpTransform()]
        bdl.sample("x", dist.TransformedDistribution(dist.Normal(0.0, 1.0), affine_exp))
    lognormal = dist.TransformedDistribution(dist.Normal(0.0, 1.0), T.ExpTransform())
    bdl.sample("w", lognormal.expand([3]).to_event(1))
    simplex = dist.TransformedDistribution(
        dist.Normal(0.0, 1.0).expand([2]), T.StickBreakingTransform()
    )
    bdl.sample("s", simplex.expand([4]))


ALL_TRANSFORMED = {site: bdl.TransformReparam() for site in ("x", "w", "s")}


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_transform_reparam_log_density_is_the_change_of_variables(backend_name):
    backend = bdl.backends.get(backend_name, precision="float64")
    mu, z, u = 0.7, np.array([-1.2, 0.3, 2.5]), np.array([0.4, -0.9, 1.3])
    reparameterised = bdl.reparam(
        transformed, {"x": bdl.TransformReparam(), "w": bdl.TransformReparam()}
    )
    s = np.full((4, 3), 1 / 3)
    lp_new, sites = log_joint(
        reparameterised(), backend, {"mu": mu, "x_base": z, "w_base": u, "s": s}
    )
    x, w = np.exp(mu + 0.5 * z), np.exp(u)
    lp_old, _ = log_joint(transformed(), backend, {"mu": mu, "x": x, "w": w, "s": s})
    np.testing.assert_allclose(sites["x"], x, rtol=1e-12)
    np.testing.assert_allclose(sites["w"], w, rtol=1e-12)
    log_jacobian = np.sum(np.log(0.5) + mu + 0.5 * z) + np.sum(u)  # dx/dz = x / 2, dw/du = w
    np.testing.assert_allclose(lp_new, lp_old + log_jacobian, rtol=1e-12)


MASK = np.array([True, False, True])


@bdl.model
def masked():
    """The sites of ``transformed`` with their middle entries masked out of the density: x as a
    plate's batch, w with the mask applied before its entries became one event."""
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    affine_exp = [T.AffineTransform(mu, 0.5), T.ExpTransform()]
    bdl.sample(
        "x", dist.TransformedDistribution(dist.Normal(0.0, 1.0), affine_exp).expand([3]).mask(MASK)
    )
    lognormal = dist.TransformedDistribution(dist.Normal(0.0, 1.0), T.ExpTransform())
    bdl.sample("w", lognormal.expand([3]).mask(MASK).to_event(1))
    bdl.sample("v", dist.Normal(mu, 0.5).expand([3]).mask(MASK))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_reparams_see_through_mask(backend_name):
    """A masked entry adds nothing to the log joint before or after the reparameterisation: the
    change of variables counts the kept entries' Jacobians only."""
    backend = bdl.backends.get(backend_name, precision="float64")
    config = {"x": bdl.TransformReparam(), "w": bdl.TransformReparam(), "v": bdl.LocScale(0)}
    mu, z, u, e = (
        0.7,
        np.array([-1.2, 0.3, 2.5]),
        np.array([0.4, -0.9, 1.3]),
        np.array([0.2, 9.0, -1.0]),
    )
    lp_new, sites = log_joint(
        bdl.reparam(masked, config)(),
        backend,
        {"mu": mu, "x_base": z, "w_base": u, "v_decentered": e},
    )
    x, w, v = np.exp(mu + 0.5 * z), np.exp(u), mu + 0.5 * e
    lp_old, _ = log_joint(masked(), backend, {"mu": mu, "x": x, "w": w, "v": v})
    np.testing.assert_allclose(sites["v"], v, rtol=1e-12)
    kept = MASK
    log_jacobian = np.sum((np.log(0.5) + mu + 0.5 * z)[kept]) + np.sum(u[kept])
    log_jacobian += kept.sum() * np.log(0.5)  # dv/de = 1/2 on the kept entries
    np.testing.assert_allclose(lp_new, lp_old + log_jacobian, rtol=1e-12)


def test_transform_reparam_keeps_each_site_its_name_and_shape():
    from ppl_bdl.trace.model_trace import trace_model

    bound = bdl.reparam(transformed, ALL_TRANSFORMED)()
    shapes = {"x": ((3,), (3,)), "w": ((3,), (3,)), "s": ((4, 3), (4, 2))}
    for name in BACKENDS:
        sites = trace_model(bound, bdl.backends.get(name))
        for site, (shape, base_shape) in shapes.items():
            assert sites[site].kind == "deterministic" and sites[site].value.shape == shape
            assert sites[f"{site}_base"].kind == "latent"
            assert sites[f"{site}_base"].value.shape == base_shape
        simplexes = bdl.backends.get(name).to_numpy(sites["s"].value)
        np.testing.assert_allclose(simplexes.sum(-1), 1.0, rtol=1e-5)


def test_transform_reparam_refuses_a_site_that_is_not_transformed():
    bound = bdl.reparam(pdb.eight_schools_centered, {"theta": bdl.TransformReparam()})
    with pytest.raises(
        bdl.ModelError,
        match=r"TransformReparam on site 'theta'.*Normal.*is not a "
        r"dist.TransformedDistribution",
    ):
        bdl.prior_predictive(bound(**pdb.eight_schools_data()), backend=BACKENDS[0])


# -- eight schools under NUTS ------------------------------------------------------------------
@pytest.fixture(scope="module")
def schools():
    if "numpyro" not in bdl.backends.available():
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    bound, reference = pdb.load(SCHOOLS)
    noncentred = bdl.reparam(bound, {"theta": bdl.LocScale(0)})
    with warnings.catch_warnings():  # the centred fit's divergences are the point
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        fits = {
            "centred": bdl.fit(bound, backend="numpyro", method="nuts", **NUTS),
            "reparam": bdl.fit(noncentred, backend="numpyro", method="nuts", **NUTS),
        }
    return fits, reference


def divergences(post) -> int:
    return int(np.sum(post.sample_stats["diverging"]))


def test_loc_scale_removes_the_divergences_of_eight_schools(schools):
    fits, _ = schools
    assert divergences(fits["reparam"]) < divergences(fits["centred"])
    assert divergences(fits["reparam"]) <= 2  # of 4000 draws; the centred model has dozens


def test_loc_scale_eight_schools_matches_the_reference(schools):
    fits, reference = schools
    post = fits["reparam"]
    n_ref = reference["_run"]["n_chains"] * reference["_run"]["n_draws_per_chain"]
    for stan_name, ref in reference.items():
        if stan_name.startswith("_"):
            continue
        draws = pdb.draws_of(post.samples, stan_name)
        mcse = ref["sd"] * np.sqrt(1.0 / float(az.ess(draws, method="mean")) + 1.0 / n_ref)
        assert abs(draws.mean() - ref["mean"]) < 4 * mcse, (stan_name, draws.mean(), ref)


def test_the_site_keeps_its_name_and_shape(schools):
    fits, _ = schools
    post = fits["reparam"]
    assert post.samples["theta"].shape == (4, 1000, 8)
    assert post.samples["theta_decentered"].shape == (4, 1000, 8)
    assert "theta" in post.deterministic_names and "theta_decentered" in post.latent_names
    idata = post.to_arviz()
    assert idata.posterior["theta"].shape == (4, 1000, 8)
    assert idata.posterior["theta"].dims[2] == idata.posterior["theta_decentered"].dims[2]


def test_divergence_advice_names_the_reparam_tool(schools):
    fits, _ = schools
    advice = [f.advice for f in fits["centred"].diagnostics if f.kind == "divergences"]
    assert advice and "bdl.reparam(model, {site: bdl.LocScale(0)})" in advice[0]
    assert REPARAM_ADVICE in fits["centred"].diagnostics.report()


def test_a_reparameterised_model_predicts(schools):
    fits, _ = schools
    data = pdb.eight_schools_data()
    noncentred = bdl.reparam(pdb.eight_schools_centered, {"theta": bdl.LocScale(0)})
    pred = fits["reparam"].predict(noncentred(data["J"], data["sigma"]), num_samples=200)
    assert pred.draws["y"].shape == (200, 8)
    # y[j] ~ N(theta[j], sigma[j]): the predictive mean is the posterior mean of theta.
    theta = fits["reparam"].samples["theta"].reshape(-1, 8)
    sd = np.sqrt(theta.var(0) + data["sigma"] ** 2)
    assert np.all(np.abs(pred.mean - theta.mean(0)) < 4 * sd / np.sqrt(200))


def test_the_lowered_model_has_the_site_as_a_deterministic():
    if "numpyro" not in bdl.backends.available():
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    import numpyro

    bound = bdl.reparam(
        pdb.eight_schools_centered(**pdb.eight_schools_data()), {"theta": bdl.LocScale(0)}
    )
    native = bound.lower("numpyro")
    with numpyro.handlers.trace() as trace, numpyro.handlers.seed(rng_seed=0):
        native()
    assert trace["theta"]["type"] == "deterministic" and trace["theta"]["value"].shape == (8,)
    assert trace["theta_decentered"]["type"] == "sample"
    mu, tau = trace["mu"]["value"], trace["tau"]["value"]
    expected = mu + tau * trace["theta_decentered"]["value"]
    np.testing.assert_allclose(trace["theta"]["value"], expected, rtol=1e-6)


# -- learnable centring, other methods -------------------------------------------------------
@pytest.mark.filterwarnings("ignore::ppl_bdl.ConvergenceWarning")
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_learned_centring_is_a_param_that_vi_fits(backend_name):
    model = bdl.reparam(hierarchical(dist.Normal), {"x": bdl.LocScale(centered=None)})
    post = bdl.fit(model(), backend=backend_name, method="vi", num_steps=30, seed=0, progress=False)
    c = np.asarray(post.params["x_centered"])
    assert c.shape == () and 0.0 <= c <= 1.0 and c != 0.5  # moved from its start, inside [0, 1]
    assert post.samples["x"].shape[-1] == 3


# -- errors ------------------------------------------------------------------------------------
def test_unknown_site_lists_the_latent_sites_and_the_closest():
    bound = bdl.reparam(pdb.eight_schools_centered, {"theat": bdl.LocScale(0)})
    with pytest.raises(
        bdl.ModelError,
        match=r"no latent sample site 'theat'.*'mu', 'tau', 'theta'"
        r".*Did you mean 'theta'\?",
    ):
        bdl.prior_predictive(bound(**pdb.eight_schools_data()), backend=BACKENDS[0])


def test_loc_scale_refuses_a_family_without_location_and_scale():
    bound = bdl.reparam(pdb.eight_schools_centered, {"tau": bdl.LocScale(0)})
    with pytest.raises(
        bdl.ModelError,
        match=r"LocScale on site 'tau'.*HalfCauchy.*not a "
        r"location-scale family \(Normal, StudentT",
    ):
        bdl.prior_predictive(bound(**pdb.eight_schools_data()), backend=BACKENDS[0])


def test_an_observed_site_cannot_be_reparameterised():
    bound = bdl.reparam(pdb.eight_schools_centered, {"y": bdl.LocScale(0)})
    with pytest.raises(bdl.ModelError, match=r"site 'y' is observed.*Remove 'y'"):
        bdl.fit(bound(**pdb.eight_schools_data()), backend=BACKENDS[0], method="vi", num_steps=2)


@pytest.mark.parametrize(
    "config, match",
    [
        ({}, "non-empty dict"),
        ({"theta": "noncentred"}, "should map a site name"),
        ({"theta": dist.Normal(0.0, 1.0)}, "should map a site name"),
    ],
)
def test_a_bad_config_is_refused(config, match):
    with pytest.raises(bdl.ConfigError, match=match):
        bdl.reparam(pdb.eight_schools_centered, config)


@pytest.mark.parametrize("centered", [-0.1, 1.5, "0", True])
def test_centered_must_be_in_the_unit_interval(centered):
    with pytest.raises(bdl.ConfigError, match=r"centered must be a number in \[0, 1\]"):
        bdl.LocScale(centered)


def test_reparam_wants_a_model():
    with pytest.raises(bdl.ConfigError, match="expected a @bdl.model"):
        bdl.reparam(lambda: None, {"x": bdl.LocScale(0)})


# -- NeuTra --------------------------------------------------------------------------------------
@bdl.model
def conjugate(y):
    """mu | y ~ N(sum(y) / (n + 1), 1 / (n + 1)); sigma has no data: its posterior is its prior."""
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


Y = np.random.default_rng(0).normal(1.0, 1.0, size=10)


@pytest.fixture(scope="module")
def flows():
    """A flow guide fitted to ``conjugate`` on each backend (float64: the Jacobian check)."""
    with warnings.catch_warnings():  # a short fit: its k̂ may be flagged, the flow need not be good
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        return _fit_flows()


def _fit_flows() -> dict:
    return {
        name: bdl.fit(
            conjugate(Y),
            backend=name,
            method="vi",
            guide="flow",
            num_layers=2,
            hidden=8,
            num_steps=150,
            lr=0.01,
            num_samples=10,
            precision="float64",
            seed=0,
            progress=False,
        )
        for name in BACKENDS
    }


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_neutra_potential_is_the_posterior_pulled_back_through_the_flow(flows, backend_name):
    """U_z(z) = U(F(z)) - log|det ∂F/∂z| - (d/2) log 2π, with the Jacobian by central
    differences of the push-forward F, and F⁻¹(F(z)) = z."""
    from ppl_bdl.inference.mcmc.neutra import NeuTraMap
    from ppl_bdl.inference.setup import prepare
    from ppl_bdl.trace.layout import ModelDensity

    setup = prepare(conjugate(Y), backend_name, "float64", seed=0)
    flow = NeuTraMap(flows[backend_name], setup)
    density = ModelDensity(setup.bound, setup.backend, setup.layout, setup.params)
    pulled_back = flow.potential(density.potential)
    backend, h = setup.backend, 1e-6
    for z in np.random.default_rng(1).normal(size=(3, 2)):
        theta = flow.push_forward(z[None])[0]
        jacobian = np.stack(
            [
                (flow.push_forward((z + h * e)[None])[0] - flow.push_forward((z - h * e)[None])[0])
                / (2 * h)
                for e in np.eye(2)
            ],
            axis=1,
        )
        with backend.scope():
            u_theta = density.potential(backend.asarray(theta), density.data)
            u_z = pulled_back(backend.asarray(z), density.data)
            u_theta, u_z = float(backend.to_numpy(u_theta)), float(backend.to_numpy(u_z))
        expected = u_theta - np.log(abs(np.linalg.det(jacobian))) - np.log(2 * np.pi)
        np.testing.assert_allclose(u_z, expected, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(flow.pull_back(theta[None])[0], z, atol=1e-9)


@pytest.mark.parametrize("sampler", [bdl.NUTS, bdl.HMC], ids=["nuts", "hmc"])
def test_neutra_draws_the_exact_posterior(flows, sampler):
    if "numpyro" not in flows:
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    method = sampler(neutra=flows["numpyro"], num_warmup=300, num_samples=1000, num_chains=2)
    with warnings.catch_warnings():  # a few divergences in log sigma's right tail (plain NUTS: 17)
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        post = bdl.fit(conjugate(Y), backend="numpyro", method=method, seed=2, progress=False)
    assert not {"rhat", "ess_bulk", "ess_tail"} & set(post.diagnostics.kinds())
    n = len(Y)
    exact = {
        "mu": (Y.sum() / (n + 1), np.sqrt(1 / (n + 1))),
        "sigma": (np.sqrt(2 / np.pi), np.sqrt(1 - 2 / np.pi)),  # HalfNormal(1)
    }
    for site, (mean, sd) in exact.items():
        draws = post.samples[site]
        mcse = sd / np.sqrt(float(az.ess(draws, method="mean")))
        assert abs(draws.mean() - mean) < 4 * mcse, (site, draws.mean(), mean, mcse)


@pytest.mark.parametrize("given", ["flow", 3.0])
def test_neutra_wants_a_flow_posterior(given):
    with pytest.raises(
        bdl.ConfigError, match=r"NUTS\(neutra=...\): expected the Posterior of one "
    ):
        bdl.NUTS(neutra=given)


def test_neutra_refuses_a_flow_of_another_model(flows):
    other = hierarchical(dist.Normal)
    name = next(iter(flows))
    with pytest.raises(bdl.ConfigError, match=r"the flow was fitted to latent sites \[\('mu'"):
        bdl.fit(
            other(),
            backend=name,
            method=bdl.NUTS(neutra=flows[name], num_warmup=5, num_samples=5, num_chains=1),
        )


# -- Neal's funnel: ESS per gradient (slow) -------------------------------------------------------
def ess_per_gradient(post) -> float:
    """The smallest bulk ESS over v and x's coordinates, per leapfrog step (gradient)."""
    ess = min(
        float(az.ess(post.samples["v"])),
        float(np.min(az.ess(az.convert_to_dataset({"x": post.samples["x"]}))["x"].values)),
    )
    return ess / float(np.sum(post.sample_stats["n_steps"]))


def funnel_fits(seed: int = 0) -> dict:
    nuts = dict(num_warmup=500, num_samples=1000, num_chains=4)
    flow = bdl.fit(
        funnel_centred(),
        backend="numpyro",
        method="vi",
        guide="flow",
        num_layers=4,
        hidden=32,
        num_steps=5000,
        lr=0.003,
        num_samples=10,
        seed=seed,
        progress=False,
    )
    models = {
        "centred": (funnel_centred(), {}),
        "LocScale(0)": (bdl.reparam(funnel_centred(), {"x": bdl.LocScale(0)}), {}),
        "non-centred by hand": (funnel_noncentred(), {}),
        "NeuTra": (funnel_centred(), {"neutra": flow}),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        return {
            name: bdl.fit(
                bound,
                backend="numpyro",
                method=bdl.NUTS(**extra, **nuts),
                seed=seed,
                progress=False,
            )
            for name, (bound, extra) in models.items()
        }


@pytest.mark.slow
def test_funnel_ess_per_gradient():
    if "numpyro" not in bdl.backends.available():
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    fits = funnel_fits()
    rate = {name: ess_per_gradient(post) for name, post in fits.items()}
    for name, post in fits.items():
        print(f"{name}: ESS/gradient {rate[name]:.4f}, divergences {divergences(post)}")
    assert rate["LocScale(0)"] > 5 * rate["centred"]
    assert 0.67 < rate["LocScale(0)"] / rate["non-centred by hand"] < 1.5
    assert rate["NeuTra"] > 2 * rate["centred"]
    v = fits["LocScale(0)"].samples["v"]  # v ~ N(0, 3²) exactly
    assert abs(v.mean()) < 4 * 3.0 / np.sqrt(float(az.ess(v, method="mean")))


def test_a_reparameterised_model_pickles_and_runs_in_a_scan():
    import pickle

    from ppl_bdl.run.process_executor import _dumps
    from ppl_bdl.trace.model_trace import trace_model

    @bdl.model
    def walk(steps=4):
        s = bdl.sample("s", dist.HalfNormal(1.0))
        bdl.scan(lambda x, _: (bdl.sample("x", dist.Normal(x, s)),) * 2, 0.0, None, length=steps)

    bound = bdl.reparam(walk(), {"x": bdl.LocScale(0)})
    again = pickle.loads(
        _dumps(bdl.reparam(pdb.eight_schools_centered, {"theta": bdl.LocScale(0)}))
    )
    assert again.name == "eight_schools_centered" and "theta" in again.fn.config
    for name in BACKENDS:
        sites = trace_model(bound, bdl.backends.get(name))
        assert sites["x"].kind == "deterministic" and sites["x"].value.shape == (4,)
        assert sites["x_decentered"].kind == "latent"


def test_a_shape_error_after_a_reparameterised_site_names_the_model_line():
    @bdl.model
    def linear(X):
        w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
        bdl.deterministic("f", X @ w)

    bound = bdl.reparam(linear, {"w": bdl.LocScale(0)})(np.ones((4, 2)))
    with pytest.raises(bdl.ModelError, match=r"in the arguments of site 'f'.*\n.*X @ w"):
        bdl.prior_predictive(bound, backend=BACKENDS[0], num_samples=2)
