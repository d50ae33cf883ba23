"""Constrained latents: ``ImproperUniform(support, shape)`` on every support, moved in the
unconstrained space through each backend's bijection (the log-Jacobian included) by NUTS, the
guides and the SG-MCMC kernels; LKJCholesky covariance models end to end."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.errors import DistributionError
from ppl_bdl.trace.layout import LatentLayout, ModelDensity, trace_model

C = dist.constraints
SUPPORTS = [
    ("real", (2,)),
    ("positive", (2,)),
    ("unit_interval", (2,)),
    ("ordered_vector", (3,)),
    ("positive_ordered_vector", (3,)),
    ("simplex", (3,)),
    ("corr_cholesky", (3, 3)),
    ("lower_cholesky", (3, 3)),
    ("positive_definite", (3, 3)),
    ("corr_matrix", (3, 3)),
    ("interval", (2,)),
    ("greater_than", (2,)),
]


def _support(name):
    if name == "interval":
        return C.between(-1.0, 2.0)
    return C.at_least(1.0) if name == "greater_than" else name


def _free(name: str, x: np.ndarray) -> np.ndarray:
    """The free coordinates of a point of the support (what the bijection's Jacobian maps to)."""
    if name == "simplex":
        return x[:-1]
    if name in ("corr_cholesky", "corr_matrix"):
        return x[np.tril_indices(x.shape[-1], -1)]
    if name in ("lower_cholesky", "positive_definite"):
        return x[np.tril_indices(x.shape[-1])]
    return x.ravel()


def _flat_model(support, shape):
    @bdl.model
    def flat():
        x = bdl.sample("x", dist.ImproperUniform(support, shape=shape))
        bdl.factor("tilt", -0.5 * bm.sum(x * x))

    return flat()


@pytest.mark.parametrize("backend_name", ["numpyro", "pyro"])
@pytest.mark.parametrize(("name", "shape"), SUPPORTS, ids=[s for s, _ in SUPPORTS])
def test_potential_holds_the_log_jacobian_of_the_bijection(backend_name, name, shape):
    """U(u) = -(f(x) + log|det dx/du|), with x = t(u), the Jacobian by central differences."""
    backend = bdl.backends.get(backend_name, "float64")
    bound = _flat_model(_support(name), shape)
    with backend.scope(), backend.activate():
        layout = LatentLayout.from_sites(trace_model(bound, backend), backend)
        u = np.random.default_rng(1).uniform(-1.0, 1.0, layout.dim)
        ours = ModelDensity(bound, backend, layout).potential(backend.asarray(u))
        to_x = backend.biject_to(layout.sites["x"].native.support)

        def x_of(v):
            v = backend.asarray(v)
            return np.asarray(backend.to_numpy(v if to_x is None else to_x(v)), dtype=float)

        x = x_of(u)
        steps = np.eye(layout.dim) * 1e-6
        jac = np.stack(
            [(_free(name, x_of(u + h)) - _free(name, x_of(u - h))) / 2e-6 for h in steps], -1
        )
    assert x.shape == shape
    assert bool(np.all(layout.sites["x"].spec.support.check(x)))
    want = 0.5 * np.sum(x * x) - np.linalg.slogdet(jac)[1]
    np.testing.assert_allclose(float(backend.to_numpy(ours)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("name", "shape"), SUPPORTS, ids=[s for s, _ in SUPPORTS])
def test_potential_matches_numpyro_on_the_lowered_model(name, shape):
    from numpyro.infer.util import potential_energy

    backend = bdl.backends.get("numpyro", "float64")
    bound = _flat_model(_support(name), shape)
    with backend.scope(), backend.activate():
        layout = LatentLayout.from_sites(trace_model(bound, backend), backend)
        u = backend.asarray(np.random.default_rng(2).uniform(-1.0, 1.0, layout.dim))
        ours = ModelDensity(bound, backend, layout).potential(u)
        native = potential_energy(
            bound.lower("numpyro", "float64"), (), {}, layout.unflatten(u, backend)
        )
    np.testing.assert_allclose(float(ours), float(native), rtol=1e-8)


@bdl.model
def ordinal(x, y, num_classes):
    beta = bdl.sample("beta", dist.Normal(0.0, 5.0))
    cutpoints = bdl.sample(
        "cutpoints", dist.ImproperUniform("ordered_vector", shape=(num_classes - 1,))
    )
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.OrderedLogistic(beta * x[idx], cutpoints), obs=y[idx])


@pytest.fixture(scope="module")
def ordinal_fit():
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    cut = np.array([-1.0, 0.5, 2.0])
    latent = 1.5 * x + rng.logistic(size=300)
    y = np.searchsorted(cut, latent).astype(float)
    post = bdl.fit(
        ordinal(x, y, 4),
        method=bdl.NUTS(num_warmup=300, num_samples=300, num_chains=1),
        backend="numpyro",
        seed=0,
        progress=False,
    )
    return post, cut


def test_ordered_cutpoints_under_nuts_are_ordered(ordinal_fit):
    post, cut = ordinal_fit
    draws = post.samples["cutpoints"]
    assert draws.shape == (1, 300, 3)
    assert np.all(np.diff(draws, axis=-1) > 0)
    # the truth within 4 posterior sds (300 points: sds about 0.15-0.25)
    mean, sd = draws.mean((0, 1)), draws.std((0, 1))
    assert np.all(np.abs(mean - cut) < 4 * sd + 0.1), (mean, sd)
    assert post.to_arviz().posterior["cutpoints"].shape == (1, 300, 3)


@bdl.model
def categorical_counts(y):
    probs = bdl.sample("probs", dist.ImproperUniform("simplex", shape=(3,)))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(probs=probs), obs=y[idx])


@pytest.mark.filterwarnings("ignore::UserWarning")  # PSIS k̂ of a short fit
@pytest.mark.parametrize("guide", ["meanfield", pytest.param("flow", marks=pytest.mark.slow)])
def test_simplex_latent_under_vi_sums_to_one(guide):
    y = np.repeat([0.0, 1.0, 2.0], [10, 30, 60])
    post = bdl.fit(
        categorical_counts(y),
        method=bdl.VI(guide=guide, num_steps=300, num_samples=200),
        backend="numpyro",
        seed=0,
        progress=False,
    )
    draws = post.samples["probs"]
    assert draws.shape[-1] == 3 and np.all(draws > 0)
    np.testing.assert_allclose(draws.sum(-1), 1.0, atol=1e-5)
    # the posterior is Dirichlet(11, 31, 61): mean (0.107, 0.301, 0.592)
    np.testing.assert_allclose(draws.mean((0, 1)), [11 / 103, 31 / 103, 61 / 103], atol=0.05)


@bdl.model
def correlated(y):
    chol = bdl.sample("chol", dist.ImproperUniform("corr_cholesky", shape=(3, 3)))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.MultivariateNormal(np.zeros(3), scale_tril=chol), obs=y[idx])


@pytest.mark.filterwarnings("ignore::UserWarning")  # R-hat/ESS of a short SG-MCMC run
def test_corr_cholesky_latent_under_sgld_stays_a_cholesky_factor():
    rng = np.random.default_rng(0)
    corr = np.array([[1.0, 0.6, 0.2], [0.6, 1.0, -0.3], [0.2, -0.3, 1.0]])
    y = rng.multivariate_normal(np.zeros(3), corr, size=200)
    post = bdl.fit(
        correlated(y),
        method=bdl.SGLD(step_size=3e-4, num_warmup=200, num_samples=200, num_chains=1),
        backend="numpyro",
        seed=0,
        progress=False,
    )
    draws = post.samples["chol"].reshape(-1, 3, 3)
    assert np.all(np.triu(draws, 1) == 0)
    assert np.all(np.diagonal(draws, axis1=-2, axis2=-1) > 0)
    np.testing.assert_allclose(np.linalg.norm(draws, axis=-1), 1.0, atol=1e-5)
    r = draws @ np.swapaxes(draws, -1, -2)
    np.testing.assert_allclose(r.mean(0)[np.tril_indices(3, -1)], [0.6, 0.2, -0.3], atol=0.15)


@bdl.model
def covariance(y):
    d = y.shape[1]
    chol = bdl.sample("chol", dist.LKJCholesky(d, 2.0))
    scale = bdl.sample("scale", dist.HalfCauchy(1.0).expand([d]).to_event(1))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample(
            "y", dist.MultivariateNormal(np.zeros(d), scale_tril=scale[:, None] * chol), obs=y[idx]
        )


def _covariance_data():
    rng = np.random.default_rng(1)
    cov = np.array([[4.0, 1.2, 0.0], [1.2, 1.0, -0.3], [0.0, -0.3, 0.25]])
    return rng.multivariate_normal(np.zeros(3), cov, size=300), cov


@pytest.mark.filterwarnings("ignore::UserWarning")  # convergence of a short run
def test_lkj_covariance_model_runs_under_nuts():
    y, cov = _covariance_data()
    post = bdl.fit(
        covariance(y),
        method=bdl.NUTS(num_warmup=100, num_samples=100, num_chains=1, max_tree_depth=5),
        backend="numpyro",
        seed=0,
        progress=False,
    )
    chol = post.samples["chol"].reshape(-1, 3, 3)
    np.testing.assert_allclose(np.linalg.norm(chol, axis=-1), 1.0, atol=1e-5)
    scale = post.samples["scale"].reshape(-1, 3)
    np.testing.assert_allclose(scale.mean(0), np.sqrt(np.diag(cov)), rtol=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["numpyro", "pyro"])
def test_lkj_covariance_model_recovers_the_correlations(backend_name):
    y, cov = _covariance_data()
    post = bdl.fit(
        covariance(y),
        method=bdl.NUTS(num_warmup=300, num_samples=300, num_chains=2),
        backend=backend_name,
        seed=0,
        progress=False,
    )
    chol = post.samples["chol"].reshape(-1, 3, 3)
    corr = chol @ np.swapaxes(chol, -1, -2)
    want = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    # 300 points: the correlations' posterior sds are about 0.05
    np.testing.assert_allclose(corr.mean(0), want, atol=0.15)


@bdl.model
def lkj_prior():
    bdl.sample("chol", dist.LKJCholesky(3, 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["numpyro", "pyro"])
def test_lkj_prior_under_nuts_has_the_known_correlation_variance(backend_name):
    """Off-diagonal r of LKJ(η) in d dims: mean 0, variance 1 / (2b + 1), b = η - 1 + d / 2
    (Lewandowski, Kurowicka and Joe 2009, section 3.2): 1/6 for d = 3, η = 2."""
    post = bdl.fit(
        lkj_prior(),
        method=bdl.NUTS(num_warmup=300, num_samples=1000, num_chains=2),
        backend=backend_name,
        seed=0,
        progress=False,
    )
    chol = post.samples["chol"].reshape(-1, 3, 3)
    r = (chol @ np.swapaxes(chol, -1, -2))[:, [1, 2, 2], [0, 0, 1]]
    # 2000 draws (ESS ~ 1000): the variance's Monte Carlo sd is about 0.008
    np.testing.assert_allclose(r.var(0), 1 / 6, atol=0.025)
    np.testing.assert_allclose(r.mean(0), 0.0, atol=0.05)


@bdl.model
def _unknown_support():
    bdl.sample("x", dist.ImproperUniform("circle", shape=(2,)))


@bdl.model
def _simplex_without_shape():
    bdl.sample("p", dist.ImproperUniform("simplex"))


def test_bad_supports_name_the_site_and_the_supported_names():
    backend = bdl.backends.get("numpyro")
    with pytest.raises(DistributionError) as error:
        trace_model(_unknown_support(), backend)
    for word in ("site 'x'", "'circle'", "'ordered_vector'", "'corr_cholesky'", "between"):
        assert word in str(error.value)
    with pytest.raises(DistributionError, match=r"site 'p'.*needs shape= with at least 1"):
        trace_model(_simplex_without_shape(), backend)
    with pytest.raises(DistributionError, match="square"):
        dist.ImproperUniform("corr_cholesky", shape=(2, 3))
    with pytest.raises(DistributionError, match="must be scalars"):
        dist.ImproperUniform(C.between(np.zeros(2), 1.0))


T = dist.transforms
TRANSFORMED = [
    (dist.Normal(0.3, 1.2), [T.ExpTransform()], np.array([0.5, 2.0])),
    (dist.Normal(0.3, 1.2), [T.SigmoidTransform()], np.array([0.2, 0.9])),
    (dist.Gamma(2.0, 1.0), [T.AffineTransform(1.0, 2.0)], np.array([2.0, 5.0])),
    (dist.Normal(0.0, 1.0).expand([3]), [T.OrderedTransform()], np.array([-1.0, 0.5, 2.0])),
    (dist.Normal(0.0, 1.0).expand([2]), [T.StickBreakingTransform()], np.array([0.2, 0.3, 0.5])),
    (
        dist.Normal(0.0, 1.0).expand([3]),
        [T.CorrCholeskyTransform()],
        np.linalg.cholesky(np.array([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]])),
    ),
    (
        dist.Normal(0.0, 1.0).expand([6]),
        [T.LowerCholeskyTransform()],
        np.linalg.cholesky(np.array([[2.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 3.0]])),
    ),
]


@pytest.mark.parametrize(("base", "transforms", "value"), TRANSFORMED)
def test_transformed_distribution_matches_numpyro_and_pyro(base, transforms, value):
    import numpyro.distributions as nd
    import numpyro.distributions.transforms as ndt

    spec = dist.TransformedDistribution(base, transforms)
    numpyro_backend = bdl.backends.get("numpyro", "float64")
    with numpyro_backend.scope():
        native = nd.TransformedDistribution(
            numpyro_backend.distribution(base),
            [getattr(ndt, t.name)(**t.params) for t in transforms],
        )
        want = np.asarray(native.log_prob(value))
        assert spec.batch_shape == native.batch_shape and spec.event_shape == native.event_shape
    np.testing.assert_allclose(spec.log_prob(value), want, rtol=1e-8)
    pyro_backend = bdl.backends.get("pyro", "float64")
    with pyro_backend.scope(), pyro_backend.activate():
        on_pyro = pyro_backend.distribution(spec).log_prob(pyro_backend.asarray(value))
    np.testing.assert_allclose(pyro_backend.to_numpy(on_pyro), want, rtol=1e-8)


def test_transformed_latent_moves_through_its_support():
    from numpyro.infer.util import potential_energy

    @bdl.model
    def weights():
        base = dist.Normal(np.array([0.5, -0.5]), 1.0)
        w = bdl.sample("w", dist.TransformedDistribution(base, T.StickBreakingTransform()))
        bdl.factor("tilt", bm.sum(w * np.array([1.0, 2.0, 3.0])))

    backend = bdl.backends.get("numpyro", "float64")
    with backend.scope(), backend.activate():
        sites = trace_model(weights(), backend)
        layout = LatentLayout.from_sites(sites, backend)
        assert layout.slots[0].shape == (3,) and layout.slots[0].unconstrained_shape == (2,)
        u = backend.asarray([0.3, -0.2])
        ours = ModelDensity(weights(), backend, layout).potential(u)
        native = potential_energy(weights().lower("numpyro", "float64"), (), {}, {"w": u})
    np.testing.assert_allclose(float(ours), float(native), rtol=1e-8)
