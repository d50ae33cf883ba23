"""Bad input gets a clear error at the user's line: site, what was seen, what was expected."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist


def _fit(bound, backend="numpyro", **kw):
    kw = {"num_warmup": 10, "num_samples": 10, "num_chains": 1, "progress": False, **kw}
    return bdl.fit(bound, backend=backend, **kw)


@bdl.model
def simple(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def test_unknown_backend_lists_installed():
    with pytest.raises(bdl.BackendError, match="numpyro"):
        _fit(simple(np.zeros(3)), backend="stan")


def test_unknown_method_lists_valid():
    with pytest.raises(bdl.ConfigError, match="'nuts'"):
        _fit(simple(np.zeros(3)), method="gibbs")


def test_duplicate_site_name(backend):
    @bdl.model
    def twice():
        bdl.sample("a", dist.Normal(0.0, 1.0))
        bdl.sample("a", dist.Normal(0.0, 1.0))

    with pytest.raises(bdl.ModelError, match="'a' is used twice"):
        _fit(twice(), backend=backend)


def test_observed_shape_mismatch_names_site_and_shapes(backend):
    @bdl.model
    def wrong(y):
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        with bdl.plate("data", 5):
            bdl.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(bdl.ModelError, match=r"'y'.*\(3,\).*\(5,\)"):
        _fit(wrong(np.zeros(3)), backend=backend)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_observed_data_names_site_and_index(backend, bad):
    y = np.zeros(4)
    y[2] = bad
    with pytest.raises(bdl.DataError, match=r"'y'.*index \(2,\)"):
        _fit(simple(y), backend=backend)


def test_model_without_sample_sites(backend):
    @bdl.model
    def empty(y):
        return y

    with pytest.raises(bdl.ModelError, match="before sampling anything"):
        _fit(empty(np.zeros(2)), backend=backend)


def test_parameter_out_of_domain_names_site(backend):
    @bdl.model
    def negative_scale():
        bdl.sample("z", dist.Normal(0.0, -2.0))

    with pytest.raises(bdl.DistributionError, match=r"site 'z'.*'scale' must be a number > 0"):
        _fit(negative_scale(), backend=backend)


def test_parameter_out_of_domain_from_data_array(backend):
    @bdl.model
    def from_data(s):
        bdl.sample("z", dist.Normal(0.0, s))

    with pytest.raises(bdl.DistributionError, match=r"site 'z'.*index \(1,\)"):
        _fit(from_data(np.array([1.0, -1.0])), backend=backend)


def test_distribution_errors_outside_a_model():
    with pytest.raises(bdl.DistributionError, match="probability"):
        dist.Bernoulli(probs=1.5)
    with pytest.raises(bdl.DistributionError, match="do not broadcast"):
        dist.Normal(np.zeros(2), np.ones(3))


def test_fit_on_unbound_model():
    with pytest.raises(bdl.ModelError, match=r"bind its data first.*simple\(X, y\)"):
        _fit(simple)


def test_other_backends_array_in_data():
    import torch

    with pytest.raises(bdl.DataError, match="torch array.*numpyro"):
        _fit(simple(torch.zeros(3)), backend="numpyro")


def test_other_backends_array_inside_model():
    import jax.numpy as jnp

    @bdl.model
    def mixed(y):
        mu = bdl.sample("mu", dist.Normal(jnp.zeros(()), 1.0))
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(bdl.DataError, match="site 'mu'.*jax array.*'pyro'"):
        _fit(mixed(np.zeros(2)), backend="pyro")


def test_sample_needs_a_neutral_distribution():
    import numpyro.distributions as nd

    @bdl.model
    def native_dist():
        bdl.sample("z", nd.Normal(0.0, 1.0))

    with pytest.raises(bdl.ModelError, match="ppl_bdl.dsl.dist"):
        _fit(native_dist())


def test_primitive_outside_model():
    with pytest.raises(bdl.ModelError, match="outside a model run"):
        bdl.sample("z", dist.Normal(0.0, 1.0))


def test_plate_shape_mismatch_suggests_indexing(backend):
    @bdl.model
    def unindexed(y):
        mu = bdl.sample("mu", dist.Normal(np.zeros(3), 1.0))
        with bdl.plate("data", 4):
            bdl.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(bdl.ModelError, match="batch shape"):
        _fit(unindexed(np.zeros(4)), backend=backend)


def test_bad_fit_settings():
    with pytest.raises(bdl.ConfigError, match="num_samples"):
        _fit(simple(np.zeros(3)), num_samples=0)
    with pytest.raises(bdl.ConfigError, match="target_accept"):
        _fit(simple(np.zeros(3)), target_accept=1.5)
    with pytest.raises(bdl.ConfigError, match="unknown option"):
        _fit(simple(np.zeros(3)), step_sise=0.1)


def test_predict_validates_the_new_inputs(backend):
    @bdl.model
    def scaled(scale, y=None):
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        with bdl.plate("data", scale.shape[0]) as idx:
            bdl.sample("y", dist.Normal(mu, scale[idx]), obs=None if y is None else y[idx])

    post = _fit(scaled(np.ones(3), np.zeros(3)), backend=backend)
    with pytest.raises(bdl.DistributionError, match=r"site 'y'.*index \(1,\)"):
        post.predict(scaled(np.array([1.0, -1.0])))
