"""Conformance: every model in ppl_bdl.models runs on every installed backend.

For each (model, backend): the draws have shape (chain, draw, *site_shape) with the site shapes of
a trace of the model; the ArviZ object has the groups posterior, sample_stats, log_likelihood and
observed_data, and ``az.loo`` runs on it; the same seed gives the same draws; prediction at the
training inputs gives draws of the observed site.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import models
from ppl_bdl.trace.layout import trace_model

EXAMPLES = models.examples()
SMALL = dict(num_warmup=20, num_samples=10, num_chains=2, max_tree_depth=4, progress=False)


@pytest.fixture(scope="module")
def fits():
    """Fits are shared by the tests of this module: (model, backend, seed) -> Posterior."""
    cache: dict[tuple[str, str, int], bdl.Posterior] = {}

    def get(name: str, backend: str, seed: int = 0) -> bdl.Posterior:
        key = (name, backend, seed)
        if key not in cache:
            cache[key] = bdl.fit(EXAMPLES[name], backend=backend, seed=seed, **SMALL)
        return cache[key]

    return get


def test_examples_cover_every_model_module():
    expected = {
        "eight_schools_centered",
        "eight_schools_noncentered",
        "kidiq",
        "arK",
        "diamonds",
        "linear_regression",
        "linear_regression_known_noise",
        "logistic_regression",
        "bnn_regression",
        "bnn_classification",
        "gaussian_mixture",
        "gaussian_hmm",
        "ar_k",
        "stochastic_volatility",
    }
    assert expected <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shapes_and_arviz_groups(name, backend, fits):
    bound = EXAMPLES[name]
    post = fits(name, backend)
    be = bdl.backends.get(backend)
    sites = trace_model(bound, be)
    chains, draws = SMALL["num_chains"], SMALL["num_samples"]
    latent = {n for n, s in sites.items() if s.kind == "latent"}
    observed = {n for n, s in sites.items() if s.kind == "observed"}
    assert latent <= set(post.samples), f"missing latent sites {latent - set(post.samples)}"
    for site, draws_ in post.samples.items():
        expected = (chains, draws) + tuple(np.shape(be.to_numpy(sites[site].value)))
        assert draws_.shape == expected, (site, draws_.shape, expected)
        assert np.all(np.isfinite(draws_)), site
    assert set(post.log_likelihood) == observed
    for site in observed:
        n_points = np.shape(be.to_numpy(sites[site].value))
        assert post.log_likelihood[site].shape == (chains, draws) + n_points
        assert np.all(np.isfinite(post.log_likelihood[site]))
    for stat in ("diverging", "step_size", "acceptance_rate", "tree_depth"):
        assert post.sample_stats[stat].shape == (chains, draws), stat

    idata = post.to_arviz()
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(idata.groups())
    assert set(idata.posterior.data_vars) == set(post.samples)
    import arviz as az

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 20 draws: Pareto-k warnings are expected
        loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo)


#: Determinism is one property of the fit, checked by default on a hierarchical model, a BNN and a
#: model with enumerated discrete sites; on every model under -m slow.
SEEDED = {"eight_schools_noncentered", "bnn_regression", "gaussian_mixture"}


@pytest.mark.parametrize(
    "name",
    [n if n in SEEDED else pytest.param(n, marks=pytest.mark.slow) for n in sorted(EXAMPLES)],
)
def test_same_seed_same_draws(name, backend, fits):
    first = fits(name, backend, seed=0)
    again = bdl.fit(EXAMPLES[name], backend=backend, seed=0, **SMALL)
    assert set(first.samples) == set(again.samples)
    for site in first.samples:
        np.testing.assert_array_equal(first.samples[site], again.samples[site], err_msg=site)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_predict_at_training_inputs(name, backend, fits):
    bound = EXAMPLES[name]
    post = fits(name, backend)
    result = post.predict(bound, num_samples=6, seed=1)
    assert result.site in post.observed_data
    observed = post.observed_data[result.site]
    assert result.draws[result.site].shape == (6,) + observed.shape
    assert result.mean.shape == observed.shape
    np.testing.assert_allclose(
        result.total, result.aleatoric + result.epistemic, rtol=1e-4, atol=1e-6
    )


def test_plate_dims_name_arviz_dims(backend, fits):
    idata = fits("eight_schools_noncentered", backend).to_arviz()
    for name in ("theta_trans", "theta"):  # a latent and a deterministic in plate "school"
        assert idata.posterior[name].dims == ("chain", "draw", "school"), name
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "school")
    assert idata.posterior["mu"].dims == ("chain", "draw")
