"""Every family of ppl_bdl.dsl.dist on every backend: densities against SciPy, gradients against finite
differences, draws against exact moments, shapes, parameter validation and supports."""

from __future__ import annotations

import numpy as np
import pytest
from dist_cases import CASES, NEW_CASES
from scipy import stats as st

import ppl_bdl as bdl
from ppl_bdl import dist

BACKENDS = bdl.backends.available()
NUM_DRAWS = 4000
Z = 5.0  # Monte Carlo tolerance in standard errors: a false alarm has probability < 1e-6


def _float64(name):
    return bdl.backends.get(name, "float64")


def _run_compiled(backend, fn, *args):
    """``fn(*args)`` as one compiled call (one XLA compile for every family, not one per op)."""
    with backend.scope(), backend.activate():
        out = backend.jit(fn)(*args)
        return [backend.to_numpy(x) for x in out]


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_prob_and_shapes_match_scipy(backend):
    be = _float64(backend)
    failures = []

    def log_probs(values):
        out = []
        for case, value in zip(CASES, values, strict=True):
            spec = case.make(**case.params)
            native = be.distribution(spec)
            shapes = (spec.batch_shape, spec.event_shape)
            if shapes != (tuple(native.batch_shape), tuple(native.event_shape)):
                failures.append(f"{case.id}: spec shapes {shapes}, native {native}")
            out.append(spec.log_prob(value))
        return out

    with be.scope():
        values = [be.asarray(case.values) for case in CASES]
    got = _run_compiled(be, log_probs, values)
    for case, result in zip(CASES, got, strict=True):
        want = case.logpdf(case.values, **case.params)
        if result.shape != np.shape(want) or not np.allclose(result, want, rtol=1e-6, atol=1e-9):
            failures.append(f"{case.id}: got {result}, SciPy {want}")
    assert not failures, "\n".join(failures)


def _finite_difference(fn, x0):
    grad = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        h = 1e-6 * max(1.0, abs(float(x0[i])))
        up, down = x0.copy(), x0.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (fn(up) - fn(down)) / (2 * h)
    return grad


def _with(case, key, x):
    """(params, values) of ``case`` with ``key`` (a parameter name or "value") set to ``x``."""
    if key == "value":
        return case.params, x
    return {**case.params, key: x}, case.values


def _everything_in_the_slow_suite(backends, default=NEW_CASES, compiled=None):
    """(backend, cases) pairs: ``default`` (``compiled`` where a backend compiles, its compile
    being longer than the check) in the default suite, every family with -m slow."""
    fast = [
        pytest.param(b, compiled if compiled is not None and b == "numpyro" else default, id=b)
        for b in backends
    ]
    return fast + [pytest.param(b, CASES, id=f"{b}-all", marks=pytest.mark.slow) for b in backends]


#: Families whose draws go through our own code on NumPyro too (total_count_max, nested specs,
#: event shapes); the draws of the rest are NumPyro's samplers, checked in the slow suite.
_DRAWN_BY_OUR_MAPPING = {"Multinomial", "MixtureSameFamily", "Delta", "GaussianRandomWalk"}


@pytest.mark.parametrize("backend, cases", _everything_in_the_slow_suite(BACKENDS))
def test_gradients_match_finite_differences(backend, cases):
    be = _float64(backend)
    checks = [(c, k) for c in cases for k in list(c.grad) + (["value"] if c.value_grad else [])]
    points = [
        np.array(case.values if key == "value" else case.params[key], dtype=float)
        for case, key in checks
    ]

    def gradients(xs):
        out = []
        for (case, key), x in zip(checks, xs, strict=True):

            def log_density(x, case=case, key=key):
                params, values = _with(case, key, x)
                values = values if be.is_array(values) else be.asarray(values)
                return be.math.sum(case.make(**params).log_prob(values))

            out.append(be.grad(log_density)(x))
        return out

    with be.scope():
        xs = [be.asarray(x) for x in points]
    got = _run_compiled(be, gradients, xs)
    failures = []
    for (case, key), x0, result in zip(checks, points, got, strict=True):

        def reference(x, case=case, key=key):
            params, values = _with(case, key, x)
            return float(np.sum(case.logpdf(values, **params)))

        want = _finite_difference(reference, x0)
        if not np.allclose(result, want, rtol=2e-5, atol=2e-6):
            failures.append(f"{case.id} d/d{key}: got {result}, finite differences {want}")
    assert len(checks) > 40 and not failures, "\n".join(failures)


def _moments_agree(draws: np.ndarray, mean, var) -> list[str]:
    """Where the draws' mean or variance is more than Z standard errors from the exact one."""
    n = draws.shape[0]
    m, v = draws.mean(0), draws.var(0)
    se_m = draws.std(0) / np.sqrt(n)
    se_v = ((draws - m) ** 2).std(0) / np.sqrt(n)
    out = []
    if not np.all(np.abs(m - mean) <= Z * se_m + 1e-9):
        out.append(f"mean {m} vs exact {mean} (se {se_m})")
    if not np.all(np.abs(v - var) <= Z * se_v + 1e-9):
        out.append(f"variance {v} vs exact {var} (se {se_v})")
    return out


def test_moment_check_can_fail():
    draws = np.random.default_rng(0).normal(size=(NUM_DRAWS, 2))
    assert not _moments_agree(draws, 0.0, 1.0)
    assert _moments_agree(draws, 0.1, 1.0) and _moments_agree(draws, 0.0, 1.2)


@pytest.mark.filterwarnings("ignore:Singular sample detected")  # torch's Wishart redraws them
@pytest.mark.parametrize(
    "backend, cases",
    _everything_in_the_slow_suite(
        BACKENDS, compiled=[c for c in NEW_CASES if c.id in _DRAWN_BY_OUR_MAPPING]
    ),
)
def test_draws_have_the_exact_moments(backend, cases):
    be = _float64(backend)
    cases = [case for case in cases if case.moments is not None]

    def draws(keys):
        return [
            case.make(**(case.moment_params or case.params)).sample(key, (NUM_DRAWS,))
            for case, key in zip(cases, keys, strict=True)
        ]

    with be.scope():
        keys = [be.random.key(seed) for seed in range(len(cases))]
    failures = []
    for case, sample in zip(cases, _run_compiled(be, draws, keys), strict=True):
        params = case.moment_params or case.params
        spec = case.make(**params)
        expected_shape = (NUM_DRAWS,) + spec.batch_shape + spec.event_shape
        if sample.shape != expected_shape:
            failures.append(f"{case.id}: draws of shape {sample.shape}, not {expected_shape}")
            continue
        if case.sample_map is not None:
            sample = case.sample_map(sample)
        mean, var = case.moments(**params)
        failures += [
            f"{case.id}: {p}" for p in _moments_agree(np.asarray(sample, float), mean, var)
        ]
    assert len(cases) >= 4 and not failures, "\n".join(failures)


def test_outside_a_model_numpy_in_numpy_out():
    points = np.array([0.1, 1.0])
    out = dist.Logistic(0.5, 2.0).log_prob(points)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, st.logistic(0.5, 2.0).logpdf(points), rtol=1e-10)
    # outside the support: -inf (the native densities do not mask)
    assert np.isneginf(dist.HalfNormal(1.0).log_prob(np.array([0.5, -0.5]))[1])
    assert np.isneginf(dist.Bernoulli(probs=0.3).log_prob(0.46))
    assert np.isneginf(dist.Poisson(2.0).log_prob(np.array([-1, 2]))[0])
    draws = dist.Exponential(3.0).sample(0, (5,))
    assert isinstance(draws, np.ndarray) and draws.shape == (5,) and np.all(draws > 0)
    np.testing.assert_array_equal(draws, dist.Exponential(3.0).sample(0, 5))
    assert dist.Normal(np.zeros(3), 1.0).sample(1, (2,)).shape == (2, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outside_a_model_backend_arrays_stay_backend_arrays(backend):
    be = bdl.backends.get(backend)
    x = be.asarray(np.array([0.1, 1.0]))
    out = dist.Normal(0.0, 1.0).log_prob(x)
    assert be.is_array(out)
    np.testing.assert_allclose(be.to_numpy(out), st.norm.logpdf([0.1, 1.0]), rtol=1e-6)
    draws = dist.Normal(0.0, 1.0).sample(be.random.key(3), (4,))
    assert isinstance(draws, np.ndarray) and draws.shape == (4,)


def test_log_prob_and_sample_refuse_bad_input():
    with pytest.raises(bdl.DistributionError, match="sample_shape"):
        dist.Normal(0.0, 1.0).sample(0, "big")
    with pytest.raises(bdl.DistributionError, match="key"):
        dist.Normal(0.0, 1.0).sample("seed")
    with pytest.raises(bdl.DistributionError, match="key"):
        dist.Normal(0.0, 1.0).sample(None)


BAD_PARAMETERS = [
    (lambda: dist.NegativeBinomial(-1.0, probs=0.5), "total_count"),
    (lambda: dist.NegativeBinomial(2.0, probs=1.0), r"probs.*\[0, 1\)"),
    (lambda: dist.NegativeBinomial(2.0), "exactly one"),
    (lambda: dist.GammaPoisson(0.0, 1.0), "concentration"),
    (lambda: dist.ZeroInflatedPoisson(1.5, 2.0), "gate"),
    (lambda: dist.BetaBinomial(1.0, 1.0, total_count=2.5), "total_count"),
    (lambda: dist.Multinomial(3, probs=[0.5, 0.6]), "probs"),
    (lambda: dist.Geometric(probs=0.0), r"\(0, 1\]"),
    (lambda: dist.DiscreteUniform(3, 1), "low <= high"),
    (lambda: dist.DiscreteUniform(0.5, 3), "'low' must be an integer"),
    (lambda: dist.OrderedLogistic(0.0, [1.0, 0.5]), "increasing"),
    (lambda: dist.TruncatedNormal(0.0, 1.0), "low, high or both"),
    (lambda: dist.TruncatedNormal(0.0, 1.0, low=2.0, high=1.0), "low < high"),
    (lambda: dist.Pareto(1.0, -2.0), "alpha"),
    (lambda: dist.Weibull(0.0, 1.0), "scale"),
    (lambda: dist.Logistic(0.0, -1.0), "scale"),
    (lambda: dist.Chi2(0.0), "df"),
    (lambda: dist.VonMises(0.0, -1.0), "concentration"),
    (lambda: dist.Delta(0.0, event_dim=-1), "event_dim"),
    (lambda: dist.Delta(np.zeros(2), np.zeros(3)), "broadcast"),
    (lambda: dist.GaussianRandomWalk(1.0, num_steps=0), "num_steps"),
    (lambda: dist.GaussianRandomWalk(-1.0, num_steps=3), "scale"),
    (lambda: dist.LowRankMultivariateNormal(np.zeros(3), np.ones((2, 1)), np.ones(3)), "sizes"),
    (lambda: dist.LowRankMultivariateNormal(np.zeros(3), np.ones((3, 1)), -np.ones(3)), "cov_diag"),
    (lambda: dist.MixtureSameFamily(dist.Normal(0.0, 1.0), dist.Normal(np.zeros(2), 1.0)), "Cat"),
    (
        lambda: dist.MixtureSameFamily(
            dist.Categorical(probs=[0.5, 0.5]), dist.Normal(np.zeros(3), 1.0)
        ),
        "number of components 2",
    ),
    (lambda: dist.MixtureSameFamily(dist.Categorical(probs=[0.5, 0.5]), "normal"), "ppl_bdl"),
    (lambda: dist.LKJ(1, 1.0), "dimension"),
    (lambda: dist.LKJ(3, 0.0), "concentration"),
    (lambda: dist.Wishart(1.0, scale_matrix=np.eye(2)), "df must exceed"),
    (lambda: dist.Wishart(3.0, scale_matrix=[[1.0, 2.0], [2.0, 1.0]]), "positive-definite"),
    (lambda: dist.Wishart(3.0), "exactly one"),
]


@pytest.mark.parametrize("make, match", BAD_PARAMETERS)
def test_bad_parameters_raise(make, match):
    with pytest.raises(bdl.DistributionError, match=match):
        make()


SUPPORTS = [  # spec, values inside its support, a batch of values with one outside, its index
    (dist.Bernoulli(probs=0.3), [0, 1, True], [0, 1, 2], (2,)),
    (dist.Binomial(np.array([3, 5]), probs=0.5), [[3, 5]], [[3, 4], [4, 4]], (1, 0)),
    (dist.Categorical(probs=[0.2, 0.8]), [0, 1], [1, 0.5], (1,)),
    (dist.Poisson(2.0), [0, 7], [3, -1], (1,)),
    (dist.NegativeBinomial(2.0, probs=0.3), [0, 9], [1.5], (0,)),
    (dist.ZeroInflatedPoisson(0.2, 2.0), [0, 4], [0, -2], (1,)),
    (dist.BetaBinomial(1.0, 1.0, 4), [0, 4], [5], (0,)),
    (dist.Geometric(probs=0.5), [0, 3], [0.5], (0,)),
    (dist.DiscreteUniform(-2, 2), [-2, 2], [0, 3], (1,)),
    (dist.OrderedLogistic(0.0, [-1.0, 1.0]), [0, 2], [3], (0,)),
    (dist.Multinomial(3, probs=[0.5, 0.5]), [[1, 2], [3, 0]], [[1, 2], [2, 2]], (1,)),
    (dist.HalfNormal(1.0), [0.1], [1.0, -0.5], (1,)),
    (dist.Beta(2.0, 2.0), [0.5], [0.5, 1.0], (1,)),
    (dist.Pareto(2.0, 3.0), [2.0, 5.0], [1.9], (0,)),
    (dist.TruncatedNormal(0.0, 1.0, low=-1.0), [-1.0, 9.0], [-2.0], (0,)),
    (dist.Uniform(0.0, np.array([1.0, 2.0])), [[0.5, 1.5]], [[0.5, 1.5], [1.5, 1.5]], (1, 0)),
    (dist.VonMises(0.0, 1.0), [3.0], [4.0], (0,)),
    (dist.Dirichlet(np.ones(3)), [[0.2, 0.3, 0.5]], [[0.2, 0.3, 0.6]], (0,)),
    (dist.LKJ(2, 1.0), [[[1.0, 0.3], [0.3, 1.0]]], [[[1.0, 0.3], [0.3, 2.0]]], (0,)),
    (dist.Wishart(3.0, scale_matrix=np.eye(2)), [np.eye(2)], [-np.eye(2)], (0,)),
    (dist.Delta(1.5), [1.5], [1.5, 2.0], (1,)),
    (
        dist.MixtureSameFamily(
            dist.Categorical(probs=[0.5, 0.5]), dist.Uniform(np.array([0.0, 5.0]), 6.0)
        ),
        [0.5, 5.5],
        [-1.0],
        (0,),
    ),
]


@pytest.mark.parametrize("spec, good, bad, index", SUPPORTS, ids=[s[0].name for s in SUPPORTS])
def test_support_violation_names_the_first_bad_point(spec, good, bad, index):
    assert spec.support_violation(np.asarray(good)) is None
    message = spec.support_violation(np.asarray(bad))
    assert f"at index {index}" in message and spec.name in message


def test_positive_definite_bijection_of_the_pyro_backend():
    torch = pytest.importorskip("torch")
    from ppl_bdl.backends.pyro.families import PositiveDefiniteTransform

    t = PositiveDefiniteTransform()
    x = torch.tensor([0.3, -0.5, 0.2, 0.7, 0.1, -0.4], dtype=torch.float64)
    y = t(x)
    assert y.shape == (3, 3) and bool(torch.all(torch.linalg.eigvalsh(y) > 0))
    torch.testing.assert_close(t.inv(y), x)
    assert tuple(t.inverse_shape((3, 3))) == (6,) and tuple(t.forward_shape((6,))) == (3, 3)
    # log |J| against the Jacobian of x -> the lower triangle of y, by autograd
    rows, cols = torch.tril_indices(3, 3)
    jac = torch.autograd.functional.jacobian(lambda v: t(v)[rows, cols], x)
    torch.testing.assert_close(t.log_abs_det_jacobian(x, y), torch.linalg.slogdet(jac)[1])
