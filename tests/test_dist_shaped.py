"""``expand``, ``to_event`` and ``mask`` on DSL distributions: the same densities and shapes as
NumPyro's and Pyro's own methods, in a model (sites, layout, pointwise log-likelihood) and outside."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import DistributionError
from ppl_bdl.trace.layout import LatentLayout, trace_model

A = np.array
MASK = A([[True, False, True], [False, True, True]])


def _numpyro_cases():
    import numpyro.distributions as nd

    return [
        (
            dist.Normal(0.5, 2.0).expand([2, 3]).to_event(1),
            nd.Normal(0.5, 2.0).expand([2, 3]).to_event(1),
            np.linspace(-1, 1, 6).reshape(2, 3),
        ),
        (
            dist.Gamma(A([1.0, 2.0, 3.0]), 2.0).expand([2, 3]).mask(MASK),
            nd.Gamma(A([1.0, 2.0, 3.0]), 2.0).expand([2, 3]).mask(MASK),
            np.full((2, 3), 0.7),
        ),
        (
            dist.Dirichlet(A([1.0, 2.0, 3.0])).expand([2]).to_event(1),
            nd.Dirichlet(A([1.0, 2.0, 3.0])).expand([2]).to_event(1),
            A([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]]),
        ),
        (
            dist.Bernoulli(probs=0.3).expand([2, 3]).mask(MASK).to_event(2),
            nd.Bernoulli(probs=0.3).expand([2, 3]).mask(MASK).to_event(2),
            A([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]),
        ),
    ]


def _pyro_cases():
    import pyro.distributions as pd
    import torch

    t = torch.as_tensor
    mask = t(MASK)
    return [
        (
            dist.Normal(0.5, 2.0).expand([2, 3]).to_event(1),
            pd.Normal(0.5, 2.0).expand([2, 3]).to_event(1),
            np.linspace(-1, 1, 6).reshape(2, 3),
        ),
        (
            dist.Gamma(A([1.0, 2.0, 3.0]), 2.0).expand([2, 3]).mask(MASK),
            pd.Gamma(t([1.0, 2.0, 3.0]).double(), 2.0).expand([2, 3]).mask(mask),
            np.full((2, 3), 0.7),
        ),
        (
            dist.Dirichlet(A([1.0, 2.0, 3.0])).expand([2]).to_event(1),
            pd.Dirichlet(t([1.0, 2.0, 3.0]).double()).expand([2]).to_event(1),
            A([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]]),
        ),
        (
            dist.Bernoulli(probs=0.3).expand([2, 3]).mask(MASK).to_event(2),
            pd.Bernoulli(probs=0.3).expand([2, 3]).mask(mask).to_event(2),
            A([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]),
        ),
    ]


@pytest.mark.parametrize("backend_name", ["numpyro", "pyro"])
def test_log_density_and_shapes_match_the_native_methods(backend_name):
    backend = bdl.backends.get(backend_name, "float64")
    cases = _numpyro_cases() if backend_name == "numpyro" else _pyro_cases()
    with backend.scope(), backend.activate():
        for spec, native, value in cases:
            ours = backend.distribution(spec)
            assert tuple(ours.batch_shape) == spec.batch_shape == tuple(native.batch_shape)
            assert tuple(ours.event_shape) == spec.event_shape == tuple(native.event_shape)
            x = backend.asarray(value)
            got = backend.to_numpy(ours.log_prob(x))
            want = backend.to_numpy(native.log_prob(x))
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=repr(spec))
            # outside a model: NumPy in, NumPy out, the same numbers
            np.testing.assert_allclose(spec.log_prob(value), want, rtol=1e-6)


def test_to_event_all_and_zero_follow_numpyro():
    d = dist.Normal(0.0, 1.0).expand([2, 3])
    assert d.to_event().event_shape == (2, 3) and d.to_event().batch_shape == ()
    assert d.to_event(0) is d
    assert repr(d.to_event(1)) == "Normal(loc=0, scale=1).expand([2, 3]).to_event(1)"


@bdl.model
def _reshaped_model(y, seen):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    scale = bdl.sample("scale", dist.HalfNormal(1.0).expand([2, 3]))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, scale[0]).to_event(1).mask(seen[idx]), obs=y[idx])


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(5, 3)), A([True, True, False, True, False])


@pytest.mark.parametrize("backend_name", ["numpyro", "pyro"])
def test_sites_layout_and_pointwise_log_likelihood(backend_name):
    backend = bdl.backends.get(backend_name, "float64")
    y, seen = _data()
    values = {"mu": A([0.1, -0.2, 0.3]), "scale": np.full((2, 3), 1.5)}
    with backend.scope():
        values = {k: backend.asarray(v) for k, v in values.items()}
        sites = trace_model(_reshaped_model(y, seen), backend, values=values)
        layout = LatentLayout.from_sites(sites, backend)
        point = backend.to_numpy(sites["y"].log_prob)
    assert sites["mu"].shape.value == (3,) and sites["scale"].shape.value == (2, 3)
    assert {s.name: s.shape for s in layout.slots} == {"mu": (3,), "scale": (2, 3)}
    # one log density per point, zero where masked, the event's sum elsewhere
    from scipy import stats

    want = stats.norm([0.1, -0.2, 0.3], 1.5).logpdf(y).sum(-1) * seen
    np.testing.assert_allclose(point, want, rtol=1e-8)


def test_lowered_model_matches_the_core_evaluator():
    from numpyro.infer.util import log_density

    backend = bdl.backends.get("numpyro", "float64")
    y, seen = _data()
    values = {"mu": A([0.1, -0.2, 0.3]), "scale": np.full((2, 3), 1.5)}
    bound = _reshaped_model(y, seen)
    with backend.scope():
        sites = trace_model(bound, backend, values=values)
        ours = sum(float(np.sum(backend.to_numpy(s.log_prob))) for s in sites.values())
        native, _ = log_density(bound.lower("numpyro", "float64"), (), {}, values)
    np.testing.assert_allclose(ours, float(native), rtol=1e-8)


@bdl.model
def _bad_expand():
    bdl.sample("w", dist.Normal(A([0.0, 1.0]), 1.0).expand([3]))


@bdl.model
def _bad_to_event():
    bdl.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(2))


@bdl.model
def _bad_mask():
    bdl.sample("w", dist.Normal(0.0, 1.0).expand([2]).mask(A([True, False, True])))


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (_bad_expand, ["site 'w'", "batch shape (2,)", "(3,)"]),
        (_bad_to_event, ["site 'w'", "to_event(2)", "batch shape (2,)"]),
        (_bad_mask, ["site 'w'", "mask of shape (3,)", "batch shape (2,)"]),
    ],
)
def test_bad_reshapes_name_the_site_and_the_shapes(model, words):
    with pytest.raises(DistributionError) as error:
        trace_model(model(), bdl.backends.get("numpyro"))
    for word in words:
        assert word in str(error.value)


def test_bad_arguments_outside_a_model():
    with pytest.raises(DistributionError, match="tuple of ints"):
        dist.Normal(0.0, 1.0).expand("3")
    with pytest.raises(DistributionError, match="int >= 0"):
        dist.Normal(0.0, 1.0).to_event(-1)
    with pytest.raises(DistributionError, match="boolean array, got float64"):
        dist.Normal(0.0, 1.0).mask(A([1.0, 0.0]))


@bdl.model
def _masked_classifier(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0).expand((2, 3)).to_event(2))
    with bdl.plate("data", X.shape[0]) as idx:
        logits = bdl.math.matmul(X[idx], w)
        bdl.sample("y", dist.Categorical(logits=logits).mask(True), obs=y)


def test_a_masked_categorical_is_predicted_as_a_classifier():
    """A masked (or reshaped) Categorical is still a classifier: its predictive has class
    probabilities, each the mean over draws of the softmax of that draw's logits."""
    X = np.random.default_rng(0).normal(size=(30, 2))
    y = (X[:, 0] > 0).astype(int)
    post = bdl.fit(
        _masked_classifier(X, y),
        backend="numpyro",
        method="vi",
        num_steps=30,
        num_samples=20,
        progress=False,
    )
    pred = post.predict(_masked_classifier(X), seed=0)
    w = np.asarray(post.samples["w"]).reshape(-1, 2, 3)
    logits = X @ w  # (draws, points, classes)
    softmax = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (softmax / softmax.sum(-1, keepdims=True)).mean(0)
    np.testing.assert_allclose(pred.probs, expected, rtol=1e-4, atol=1e-6)
