"""Distributions inside models: ``log_prob`` in ``factor``, observed sites of every new family in a
fit, support checks of observed values and observed values of any numeric dtype (both backends)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.trace.interpreter import Evaluator

BACKENDS = bdl.backends.available()
#: A tiny NUTS run: these tests check that fits run and what they are given, not the posterior.
TINY = dict(
    method="nuts", num_warmup=20, num_samples=10, num_chains=1, max_tree_depth=4, progress=False
)


# -- support checks of observed values (the "trust" issue's exact inputs) --------------------
@bdl.model
def coin(y):
    p = bdl.sample("p", dist.Beta(1.0, 1.0))
    with bdl.plate("data", len(y)) as idx:
        bdl.sample("y", dist.Bernoulli(probs=p), obs=y[idx])


@bdl.model
def labels(y):
    logits = bdl.sample("logits", dist.Normal(0.0, 1.0), shape=(3,))
    with bdl.plate("data", len(y)) as idx:
        bdl.sample("y", dist.Categorical(logits=logits), obs=y[idx])


@bdl.model
def counts(y):
    rate = bdl.sample("rate", dist.Gamma(2.0, 1.0))
    with bdl.plate("data", len(y)) as idx:
        bdl.sample("y", dist.Poisson(rate), obs=y[idx])


@bdl.model
def spread(y):
    s = bdl.sample("s", dist.HalfNormal(1.0))
    with bdl.plate("data", len(y)) as idx:
        bdl.sample("y", dist.HalfNormal(s), obs=y[idx])


@bdl.model
def proportions(y):
    a = bdl.sample("a", dist.Gamma(2.0, 1.0))
    with bdl.plate("data", len(y)) as idx:
        bdl.sample("y", dist.Beta(a, a), obs=y[idx])


OUTSIDE_SUPPORT = [  # model, observed values, the offending value and index, words of the support
    (coin, [0.0, 1.0, 0.46], "0.46 at index (2,)", "0 or 1"),
    (coin, [0, 1, 2], "2 at index (2,)", "0 or 1"),
    (labels, [0.0, 1.5, 2.0], "1.5 at index (1,)", r"an integer in \[0, 2\]"),
    (labels, [0, 1, 3], "3 at index (2,)", r"an integer in \[0, 2\]"),
    (labels, [0, -1, 2], "-1 at index (1,)", r"an integer in \[0, 2\]"),
    (counts, [1.0, 2.5, 3.0], "2.5 at index (1,)", "an integer >= 0"),
    (counts, [1, 2, -1], "-1 at index (2,)", "an integer >= 0"),
    (spread, [0.5, -0.3], "-0.3 at index (1,)", "a number > 0"),
    (proportions, [0.3, 1.2], "1.2 at index (1,)", r"\(0, 1\)"),
    (proportions, [0.3, -0.1, 0.5], "-0.1 at index (1,)", r"\(0, 1\)"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model, y, seen, support", OUTSIDE_SUPPORT)
def test_observed_values_outside_the_support_are_data_errors(backend, model, y, seen, support):
    with pytest.raises(bdl.DataError) as info:
        bdl.fit(model(np.asarray(y)), backend=backend, **TINY)
    message = str(info.value)
    assert "observed site 'y'" in message
    assert seen in message.replace("'", "")
    assert re.search(support, message), message


# -- observed values of any numeric dtype -----------------------------------------------------
@bdl.model
def logreg(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=None if y is None else y[idx])


def _logreg_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X @ np.array([1.5, -1.0]) + rng.logistic(size=40) > 0).astype(float)
    return X, y


def _log_joint(backend, bound, values):
    """The model's log joint at ``values`` through the validating path a fit traces first."""
    with backend.scope():
        ev = Evaluator(
            backend, values={k: backend.asarray(v) for k, v in values.items()}, validate=True
        )
        bound.run_with(ev)
    return float(backend.to_numpy(ev.log_joint))


@pytest.mark.parametrize("backend", BACKENDS)
def test_logistic_regression_takes_int_and_bool_labels(backend):
    X, y = _logreg_data()
    be = bdl.backends.get(backend)
    w = {"w": np.array([0.7, -0.4])}
    reference = _log_joint(be, logreg(X, y), w)
    for dtype in (np.int64, bool):
        assert _log_joint(be, logreg(X, y.astype(dtype)), w) == pytest.approx(reference, rel=1e-6)
    as_float = bdl.fit(logreg(X, y), backend=backend, **TINY).samples["w"]
    as_bool = bdl.fit(logreg(X, y.astype(bool)), backend=backend, **TINY).samples["w"]
    np.testing.assert_allclose(as_bool, as_float, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_categorical_labels_stored_as_floats(backend, monkeypatch):
    calls = []
    original = dist.Categorical.support_violation

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    y = np.array([0, 1, 2, 2, 1, 2, 0, 2])
    be = bdl.backends.get(backend)
    logits = {"logits": np.array([0.2, -0.5, 0.9])}
    reference = _log_joint(be, labels(y), logits)
    assert _log_joint(be, labels(y.astype(float)), logits) == pytest.approx(reference, rel=1e-6)
    monkeypatch.setattr(dist.Categorical, "support_violation", counted)
    post = bdl.fit(labels(y.astype(float)), backend=backend, **TINY)
    assert np.all(np.isfinite(post.samples["logits"]))
    # the support is checked in the validating trace only, never in the 30 NUTS steps
    assert 1 <= len(calls) <= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_lowered_models_take_bool_and_float_labels(backend):
    X, y = _logreg_data()
    be = bdl.backends.get(backend)
    for obs, model in ((y.astype(bool), logreg), (np.array([0.0, 2.0, 1.0]), labels)):
        bound = model(X, obs) if model is logreg else model(obs)
        sites = bdl.trace.layout.trace_model(bound, be, missing="prior")
        native = bound.lower(backend)
        log_density = _native_log_density(backend, native, sites)
        assert np.isfinite(log_density)


def _native_log_density(backend, native, sites):
    """The lowered model's log joint at the traced latent values, with the backend's own tools."""
    values = {name: s.value for name, s in sites.items() if s.kind == "latent"}
    if backend == "pyro":
        import pyro

        trace = pyro.poutine.trace(pyro.poutine.condition(native, values)).get_trace()
        return float(trace.log_prob_sum())
    if backend == "numpyro":
        from numpyro.infer.util import log_density

        return float(log_density(native, (), {}, values)[0])
    pytest.skip(f"no native log density helper for {backend}")


# -- log_prob inside a model ------------------------------------------------------------------
FACTOR_FAMILIES = [  # a family with its observed values, as a factor and as an observed site
    (lambda mu: dist.Logistic(mu, 1.0), np.array([0.1, -0.7, 1.3])),
    (lambda mu: dist.NegativeBinomial(bm.exp(mu), probs=0.3), np.array([0, 3, 1])),
    (
        lambda mu: dist.MixtureSameFamily(
            dist.Categorical(probs=np.array([0.4, 0.6])), dist.Normal(bm.stack([mu, -mu]), 1.0)
        ),
        np.array([0.1, -0.7, 1.3]),
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_prob_in_a_factor_equals_the_observed_site(backend):
    be = bdl.backends.get(backend, "float64")
    for family, y in FACTOR_FAMILIES:

        @bdl.model
        def as_factor(y, family=family):
            mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
            bdl.factor("lik", family(mu).log_prob(y))

        @bdl.model
        def as_observed(y, family=family):
            mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
            with bdl.plate("data", len(y)) as idx:
                bdl.sample("y", family(mu), obs=y[idx])

        for mu in (-0.4, 0.3):
            joint = [_log_joint(be, model(y), {"mu": mu}) for model in (as_factor, as_observed)]
            assert np.isfinite(joint[0]) and joint[0] == pytest.approx(joint[1], rel=1e-9)


@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=[pytest.mark.slow] if b == "numpyro" else []) for b in BACKENDS],
)  # NumPyro's compile takes longer than the check (its factor path is checked above)
def test_fit_with_a_custom_density_in_a_factor(backend):
    # y ~ Logistic(mu, 1) written as a factor; prior mu ~ N(0, 1): the posterior mean is known
    # by quadrature, and the NUTS draws must find it.
    y = np.random.default_rng(1).logistic(0.8, 1.0, size=30)

    @bdl.model
    def custom(y):
        mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
        bdl.factor("lik", dist.Logistic(mu, 1.0).log_prob(y))

    grid = np.linspace(-3, 4, 4001)
    log_post = dist.Normal(0.0, 1.0).log_prob(grid) + np.sum(
        dist.Logistic(grid[:, None], 1.0).log_prob(y[None, :]), axis=1
    )
    weights = np.exp(log_post - log_post.max())
    exact_mean = float(np.sum(grid * weights) / np.sum(weights))
    exact_sd = float(np.sqrt(np.sum((grid - exact_mean) ** 2 * weights) / np.sum(weights)))
    post = bdl.fit(
        custom(y),
        backend=backend,
        method="nuts",
        num_warmup=150,
        num_samples=300,
        num_chains=1,
        progress=False,
    )
    draws = post.samples["mu"].ravel()
    # 300 correlated draws: an effective size of at least 60 makes 5 standard errors this wide
    assert abs(draws.mean() - exact_mean) < 5 * exact_sd / np.sqrt(60)


# -- every new family as an observed site, and as a latent one, in a fit --------------------
def families_model(observed=None, latent=None):
    """A model with one observed site per new family and one latent site per new continuous
    family (``observed``, ``latent``: subsets of their names; None: all)."""

    @bdl.model
    def model(d):
        _observed_sites(d, (lambda name: True) if observed is None else observed.__contains__)
        for name, family in LATENT_FAMILIES.items():
            if latent is None or name in latent:
                bdl.sample(name, family)

    return model


def _observed_sites(d, keep):
    r = bdl.sample("r", dist.Gamma(4.0, 2.0))
    p = bdl.sample("p", dist.Beta(2.0, 2.0))
    loc = bdl.sample("loc", dist.Normal(0.0, 1.0))
    scale = bdl.sample("scale", dist.HalfNormal(1.0))
    q = bdl.sample("q", dist.Dirichlet(np.ones(3)))
    mix = dist.MixtureSameFamily(
        dist.Categorical(probs=q[:2] / bm.sum(q[:2])), dist.Normal(bm.stack([loc, loc + 2.0]), 1.0)
    )
    plated = {  # name: (family, observed values)
        "nb": (lambda: dist.NegativeBinomial(r, probs=p), "counts"),
        "gp": (lambda: dist.GammaPoisson(r, 1.0), "counts"),
        "zip": (lambda: dist.ZeroInflatedPoisson(p, r), "counts"),
        "bb": (lambda: dist.BetaBinomial(r, 2.0, 10), "counts"),
        "geo": (lambda: dist.Geometric(probs=p), "counts"),
        "du": (lambda: dist.DiscreteUniform(0, 10), "counts"),
        "ol": (lambda: dist.OrderedLogistic(loc, np.array([-1.0, 0.0, 1.0])), "ordinal"),
        "tn": (lambda: dist.TruncatedNormal(loc, scale, low=-1.0), "pos"),
        "pareto": (lambda: dist.Pareto(0.1, r), "pos"),
        "weibull": (lambda: dist.Weibull(scale, r), "pos"),
        "logistic": (lambda: dist.Logistic(loc, scale), "pos"),
        "chi2": (lambda: dist.Chi2(r), "pos"),
        "vm": (lambda: dist.VonMises(loc, r), "pos"),
        "mix": (lambda: mix, "pos"),
        "mult": (lambda: dist.Multinomial(5, probs=q), "mult"),
    }
    with bdl.plate("n", d["counts"].shape[0]) as i:
        for name, (family, data) in plated.items():
            if keep(name):
                bdl.sample(name, family(), obs=d[data][i])
        if keep("delta"):
            bdl.sample("delta", dist.Delta(d["pos"][i], log_density=-1.0), obs=d["pos"][i])
    if keep("grw"):
        bdl.sample("grw", dist.GaussianRandomWalk(scale, num_steps=4), obs=d["walk"])
    if keep("lowrank"):
        low_rank = dist.LowRankMultivariateNormal(loc * bm.ones(3), np.ones((3, 1)), np.ones(3))
        bdl.sample("lowrank", low_rank, obs=d["walk"][:3])
    if keep("lkj"):
        bdl.sample("lkj", dist.LKJ(3, r), obs=d["corr"])
    if keep("wishart"):
        bdl.sample("wishart", dist.Wishart(4.0, scale_matrix=scale * bm.eye(2)), obs=d["spd"])


def _family_data():
    return {
        "counts": np.array([0, 3, 1, 2, 5, 0]),  # int counts
        "ordinal": np.array([0.0, 3.0, 1.0, 2.0, 2.0, 1.0]),  # float labels
        "pos": np.array([0.4, 1.2, 0.3, 2.0, 0.9, 0.5]),
        "mult": np.array([[1, 2, 2], [5, 0, 0], [0, 1, 4], [2, 2, 1], [1, 1, 3], [3, 1, 1]]),
        "walk": np.array([0.3, 0.1, -0.4, 0.2]),
        "corr": np.array([[1.0, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 1.0]]),
        "spd": np.array([[2.0, 0.5], [0.5, 1.0]]),
    }


#: The families whose plumbing differs most on NumPyro: float labels, counts under jit, events;
#: and supports whose bijection differs between the backends (interval, circle, a mixture's).
#: The default suite fits these there; the slow suite fits all (their compile takes minutes).
OBSERVED_SUBSET = ("ol", "mult", "grw")
LATENT_SUBSET = ("z_tn", "z_vm", "z_mix")


def _fit_families(backend, observed, latent):
    post = bdl.fit(families_model(observed, latent)(_family_data()), backend=backend, **TINY)
    for name in ("r", "p", "loc", "scale", "q"):
        assert np.all(np.isfinite(post.samples[name])), name
    assert np.all(post.samples["r"] > 0) and np.all(
        (post.samples["p"] > 0) & (post.samples["p"] < 1)
    )
    _check_latent_draws(post, moments=False)


@pytest.mark.parametrize(
    "backend", [b if b == "pyro" else pytest.param(b, marks=pytest.mark.slow) for b in BACKENDS]
)
def test_the_new_families_as_observed_and_latent_sites_in_a_fit(backend):
    if backend == "numpyro":
        _fit_families(backend, OBSERVED_SUBSET, LATENT_SUBSET)
    else:
        _fit_families(backend, None, None)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_new_family_as_observed_and_latent_sites_in_a_fit(backend):
    _fit_families(backend, None, None)


def test_an_observed_delta_off_its_point_is_a_data_error():
    @bdl.model
    def pinned(y):
        with bdl.plate("n", 2) as i:
            bdl.sample("y", dist.Delta(np.array([1.0, 2.0])[i]), obs=y[i])

    with pytest.raises(bdl.DataError, match=r"2.5 at index \(1,\).*exactly the point"):
        bdl.trace.layout.trace_model(pinned(np.array([1.0, 2.5])), bdl.backends.get("numpyro"))


LATENT_FAMILIES = {  # continuous families the layout maps to R^k through each support's bijection
    "z_tn": dist.TruncatedNormal(0.5, 1.0, low=0.0, high=2.0),
    "z_tn_low": dist.TruncatedNormal(0.0, 1.0, low=0.5),
    "z_pareto": dist.Pareto(1.0, 6.0),
    "z_weibull": dist.Weibull(1.0, 2.0),
    "z_logistic": dist.Logistic(0.5, 0.7),
    "z_chi2": dist.Chi2(4.0),
    "z_vm": dist.VonMises(0.5, 2.0),
    "z_lkj": dist.LKJ(3, 2.0),
    "z_wishart": dist.Wishart(5.0, scale_matrix=np.array([[1.0, 0.3], [0.3, 0.5]])),
    "z_grw": dist.GaussianRandomWalk(0.5, num_steps=3),
    "z_lowrank": dist.LowRankMultivariateNormal(np.zeros(2), np.ones((2, 1)), np.ones(2)),
    "z_mix": dist.MixtureSameFamily(
        dist.Categorical(probs=np.array([0.3, 0.7])), dist.Normal(np.array([-1.0, 1.0]), 0.5)
    ),
}


def _check_latent_draws(post, moments: bool):
    failures = []
    for name, family in LATENT_FAMILIES.items():
        if name not in post.samples:
            continue
        draws = np.asarray(post.samples[name], dtype=float)
        draws = draws.reshape((-1,) + draws.shape[2:])
        error = family.support_violation(draws)
        if error:
            failures.append(f"{name}: {error}")
        if moments:  # the posterior is the prior: compare with the family's own exact draws
            exact = family.sample(0, (20000,))
            flat, ref = draws.reshape(len(draws), -1), exact.reshape(len(exact), -1)
            # NUTS draws are correlated: 5 standard errors at an effective size of n / 10; 1e-5
            # for float32 round-off (a correlation matrix's unit diagonal)
            n_eff = len(flat) / 10
            se_mean = ref.std(0) / np.sqrt(n_eff)
            se_var = ((ref - ref.mean(0)) ** 2).std(0) / np.sqrt(n_eff)
            if np.any(np.abs(flat.mean(0) - ref.mean(0)) > 5 * se_mean + 1e-5):
                failures.append(f"{name}: mean {flat.mean(0)} vs {ref.mean(0)} (se {se_mean})")
            if np.any(np.abs(flat.var(0) - ref.var(0)) > 5 * se_var + 1e-5):
                failures.append(f"{name}: variance {flat.var(0)} vs {ref.var(0)} (se {se_var})")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_latent_families_sampled_by_nuts_have_their_prior_moments(backend):
    post = bdl.fit(
        families_model(observed=())(_family_data()),
        backend=backend,
        method="nuts",
        num_warmup=300,
        num_samples=1500,
        num_chains=1,
        progress=False,
        seed=3,
    )
    _check_latent_draws(post, moments=True)
