"""``bdl.scan``: one stacked site per name, the same log density on every runtime, lowering to
NumPyro's scan and to a Pyro loop under ``pyro.markov``, clear errors; the AR(K) written with it
agrees with the vectorised arK (exactly, and with posteriordb's reference under -m slow), and the
stochastic-volatility model with a native NumPyro run (-m slow)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ModelError
from ppl_bdl.inference.common import prepare, site_dims
from ppl_bdl.models import posteriordb as pdb
from ppl_bdl.models import timeseries
from ppl_bdl.trace.layout import ModelDensity, trace_model

Y = np.array([0.3, -0.2, 0.5, 0.9, 0.4, -0.1])


@bdl.model
def ar1(y):
    rho = bdl.sample("rho", dist.Uniform(-1.0, 1.0))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))

    def step(prev, t):
        bdl.sample("y", dist.Normal(rho * prev, sigma), obs=y[t])
        return y[t], None

    bdl.scan(step, y[0], np.arange(1, len(y)))


def _potential(bound, backend, flat):
    setup = prepare(bound, backend, "float64", 0)
    density = ModelDensity(setup.bound, setup.backend, setup.layout, setup.params)
    be = setup.backend
    with be.scope(), be.activate():
        return float(be.to_numpy(density.potential(be.asarray(flat))))


def test_log_density_is_the_sum_over_steps(backend):
    u_rho, u_sigma = 0.4, -0.3
    rho, sigma = np.tanh(u_rho / 2), np.exp(u_sigma)  # Uniform(-1, 1): 2 sigmoid(u) - 1
    expected = (
        np.log(0.5)
        + np.log((1 - rho**2) / 2)  # prior and Jacobian d rho / d u
        + stats.halfnorm.logpdf(sigma)
        + u_sigma
        + stats.norm.logpdf(Y[1:], rho * Y[:-1], sigma).sum()
    )
    assert -_potential(ar1(Y), backend, [u_rho, u_sigma]) == pytest.approx(expected, rel=1e-6)


def test_ar_k_with_scan_is_the_vectorised_arK(backend):
    y = timeseries.simulate_ar(25, 0.1, [0.5, -0.3, 0.1], 0.2, seed=4)
    rng = np.random.default_rng(0)
    for _ in range(2):
        flat = rng.normal(size=5)  # alpha, beta (3), log sigma
        scan_u = _potential(timeseries.ar_k(y, 3), backend, flat)
        assert scan_u == pytest.approx(_potential(pdb.arK(y, 3), backend, flat), rel=1e-6)


def test_sites_in_a_scan_are_stacked_over_time(backend):
    y = timeseries.simulate_volatility(7, -1.0, 0.9, 0.3, seed=0)
    sites = trace_model(timeseries.stochastic_volatility(y), bdl.backends.get(backend))
    assert {n: np.shape(s.value) for n, s in sites.items() if s.extra.get("scan")} == {
        "h_std": (7,),
        "h": (7,),
        "y": (7,),
    }
    assert np.shape(sites["y"].log_prob) == (7,)
    dims = site_dims(sites)
    assert dims["h_std"] == ["time"] and dims["h"] == ["time"] and dims["y"] == ["time"]


@bdl.model
def running_sum(xs):
    carry, ys = bdl.scan(lambda c, x: (c + x, 2.0 * c), 0.0, xs, name="step")
    bdl.deterministic("carry", carry)
    bdl.deterministic("ys", ys)
    bdl.sample("obs", dist.Normal(carry, 1.0), obs=np.array(0.0))


def test_carry_and_outputs_like_lax_scan(backend):
    sites = trace_model(running_sum(np.arange(4.0)), bdl.backends.get(backend))
    assert float(np.asarray(sites["carry"].value)) == 6.0
    np.testing.assert_allclose(np.asarray(sites["ys"].value), [0.0, 0.0, 2.0, 6.0])


def test_lowered_scan_is_the_backends_own():
    import jax
    from numpyro import handlers

    native = ar1(Y).lower("numpyro")
    trace = handlers.trace(handlers.seed(native, jax.random.PRNGKey(0))).get_trace()
    assert trace["y"]["value"].shape == (len(Y) - 1,)  # numpyro's scan stacks the site

    from pyro import poutine

    trace = poutine.trace(ar1(Y).lower("pyro")).get_trace()
    names = [n for n, s in trace.nodes.items() if s["type"] == "sample"]
    assert names == ["rho", "sigma"] + [f"y_{t}" for t in range(len(Y) - 1)]  # pyro.markov loop


@bdl.model
def bad_scan(kind):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))

    def step(c, t):
        if kind == "some_steps" and t > 0:
            return c, None
        if kind == "param":
            bdl.param("p", 1.0)
        if kind == "nested":
            bdl.scan(lambda c2, x: (c2, None), 0.0, np.arange(2))
        if kind == "pair":
            return c
        bdl.sample("y", dist.Normal(mu, 1.0), obs=np.array(0.1))
        return c, None

    bdl.scan(step, 0.0, np.arange(3) if kind != "mismatch" else np.arange(3), length=None)
    if kind == "twice":
        bdl.sample("y", dist.Normal(mu, 1.0), obs=np.array(0.0))
    if kind == "mismatch":
        bdl.scan(step, 0.0, {"a": np.zeros(3), "b": np.zeros(4)})


@pytest.mark.parametrize(
    "kind, message",
    [
        ("some_steps", r"'y' is sampled at 1 of the 3 steps of bdl.scan 'time'"),
        ("param", r"param\('p'\) inside bdl.scan: declare parameters before the loop"),
        ("nested", "bdl.scan inside another bdl.scan is not supported"),
        ("pair", "the step function must return a pair"),
        ("twice", r"'y' is used twice in model"),
        ("mismatch", r"the arrays in xs have different lengths \[3, 4\]"),
    ],
)
def test_clear_errors(kind, message):
    with pytest.raises(ModelError, match=message):
        trace_model(bad_scan(kind), bdl.backends.get("numpyro"))


def test_scan_outside_a_model_and_bad_arguments():
    with pytest.raises(ModelError, match="outside a model run"):
        bdl.scan(lambda c, x: (c, None), 0.0, np.arange(3))

    @bdl.model
    def no_length():
        bdl.sample("mu", dist.Normal(0.0, 1.0))
        bdl.scan(lambda c, x: (c, None), 0.0)

    with pytest.raises(ModelError, match="give xs"):
        trace_model(no_length(), bdl.backends.get("numpyro"))


# -- against references (slow) -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_ar_k_with_scan_matches_posteriordb_reference(backend):
    from test_reference_posteriors import check_against_reference

    data = pdb.load_data("arK-arK")
    reference = pdb.load_reference("arK-arK")
    settings = dict(
        num_warmup=500 if backend == "pyro" else 1000,
        num_samples=1000,
        num_chains=4,
        dense_mass=True,
    )
    post = bdl.fit(
        timeseries.ar_k(data["y"], data["K"]), backend=backend, seed=0, progress=False, **settings
    )
    failures = check_against_reference(post, reference)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_stochastic_volatility_matches_a_native_numpyro_run():
    """Our scan model's posterior means of mu, phi, sigma against NumPyro's own NUTS on the same
    model written with numpyro.contrib.control_flow.scan: within 4 combined MCSEs."""
    import arviz as az
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from numpyro.contrib.control_flow import scan

    y = timeseries.simulate_volatility(60, -1.0, 0.9, 0.3, seed=5)

    def native(y):
        mu = numpyro.sample("mu", nd.Cauchy(0.0, 10.0))
        phi = numpyro.sample("phi", nd.Uniform(-1.0, 1.0))
        sigma = numpyro.sample("sigma", nd.HalfCauchy(5.0))

        def step(h_prev, t):
            h_std = numpyro.sample("h_std", nd.Normal(0.0, 1.0))
            scale = jnp.where(t == 0, sigma / jnp.sqrt(1.0 - phi**2), sigma)
            h = mu + phi * (h_prev - mu) + scale * h_std
            numpyro.sample("y", nd.Normal(0.0, jnp.exp(h / 2.0)), obs=y[t])
            return h, None

        scan(step, mu, jnp.arange(len(y)))

    mcmc = numpyro.infer.MCMC(
        numpyro.infer.NUTS(native, target_accept_prob=0.9),
        num_warmup=1000,
        num_samples=1000,
        num_chains=4,
        progress_bar=False,
        chain_method="sequential",
    )
    mcmc.run(jax.random.PRNGKey(1), jnp.asarray(y))
    theirs = mcmc.get_samples(group_by_chain=True)
    ours = bdl.fit(
        timeseries.stochastic_volatility(y),
        backend="numpyro",
        seed=0,
        progress=False,
        num_warmup=1000,
        num_samples=1000,
        num_chains=4,
        target_accept=0.9,
    ).samples
    for name in ("mu", "phi", "sigma"):
        a, b = np.asarray(ours[name]), np.asarray(theirs[name])
        mcse = np.hypot(float(az.mcse(a)), float(az.mcse(b)))
        assert abs(a.mean() - b.mean()) < 4 * mcse, (name, a.mean(), b.mean(), mcse)


# -- the compiled loop against the Python loop --------------------------------------------------
@pytest.fixture
def python_loop(monkeypatch):
    """Run bdl.scan as the Python loop (the reference) inside the block."""
    from contextlib import contextmanager

    from ppl_bdl.trace.interpreter import Evaluator

    @contextmanager
    def block():
        with monkeypatch.context() as patch:
            patch.setattr(Evaluator, "compile_scan", False)
            yield

    return block


def _density(bound, backend_name):
    setup = prepare(bound, bdl.backends.get(backend_name), "float64", 0)
    return ModelDensity(setup.bound, setup.backend, setup.layout, setup.params), setup


def _value_and_grad(density, flat):
    be = density.backend
    with be.scope(), be.activate():
        value, grad = density.value_and_grad(be.asarray(flat))
        return float(be.to_numpy(value)), be.to_numpy(grad)


SV_Y = timeseries.simulate_volatility(12, -1.0, 0.9, 0.3, seed=1)
COMPILED_CASES = {"ar1": lambda: ar1(Y), "sv": lambda: timeseries.stochastic_volatility(SV_Y)}


@pytest.mark.parametrize("case", sorted(COMPILED_CASES))
def test_compiled_log_density_and_gradient_are_the_python_loops(backend, case, python_loop):
    density, setup = _density(COMPILED_CASES[case](), backend)
    flat = np.random.default_rng(3).normal(size=setup.layout.dim) * 0.5
    value, grad = _value_and_grad(density, flat)
    with python_loop():
        expected_value, expected_grad = _value_and_grad(density, flat)
    assert value == pytest.approx(expected_value, rel=1e-10)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-9, atol=1e-12)


def _native_sv(y):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from numpyro.contrib.control_flow import scan

    mu = numpyro.sample("mu", nd.Cauchy(0.0, 10.0))
    phi = numpyro.sample("phi", nd.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", nd.HalfCauchy(5.0))

    def step(h_prev, t):
        h_std = numpyro.sample("h_std", nd.Normal(0.0, 1.0))
        scale = jnp.where(t == 0, sigma / jnp.sqrt(1.0 - phi**2), sigma)
        h = mu + phi * (h_prev - mu) + scale * h_std
        numpyro.sample("y", nd.Normal(0.0, jnp.exp(h / 2.0)), obs=y[t])
        return h, None

    scan(step, mu, jnp.arange(len(y)))


def test_compiled_log_density_is_native_numpyros_scan():
    import jax
    from numpyro.infer.util import potential_energy

    density, setup = _density(timeseries.stochastic_volatility(SV_Y), "numpyro")
    flat = np.random.default_rng(4).normal(size=setup.layout.dim) * 0.5
    value, grad = _value_and_grad(density, flat)
    with setup.backend.scope():
        sites = setup.layout.unflatten(setup.backend.asarray(flat), setup.backend)

        def theirs(sites):
            return potential_energy(_native_sv, (jax.numpy.asarray(SV_Y),), {}, sites)

        their_value, their_grads = jax.value_and_grad(theirs)(sites)
        their_grad = setup.layout.flatten(their_grads, setup.backend)
    assert value == pytest.approx(float(their_value), rel=1e-10)
    np.testing.assert_allclose(grad, np.asarray(their_grad), rtol=1e-9, atol=1e-12)


STEP_CALLS = []


@bdl.model
def counted_ar1(y):
    rho = bdl.sample("rho", dist.Uniform(-1.0, 1.0))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))

    def step(prev, t):
        STEP_CALLS.append(1)
        bdl.sample("y", dist.Normal(rho * prev, sigma), obs=y[t])
        return y[t], None

    bdl.scan(step, y[0], np.arange(1, y.shape[0]))


def test_the_log_density_traces_the_step_once():
    import jax

    y = timeseries.simulate_ar(1000, 0.0, [0.5], 0.3, seed=0)
    STEP_CALLS.clear()
    density, setup = _density(counted_ar1(y), "numpyro")
    assert len(STEP_CALLS) <= 3  # the validating run: step 0 in Python, the loop, its bounds
    STEP_CALLS.clear()
    with setup.backend.scope(), setup.backend.activate():
        jax.jit(density.value_and_grad).lower(setup.backend.asarray([0.1, -0.2]))
    assert len(STEP_CALLS) == 1


@bdl.model
def branching_walk(y):
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))

    def step(prev, t):
        # Python control flow on the step index: the step cannot be compiled.
        loc = 0.0 if t == 0 else prev
        bdl.sample("y", dist.Normal(loc, sigma), obs=y[t])
        return y[t], None

    bdl.scan(step, 0.0, np.arange(y.shape[0]))


def test_a_step_that_cannot_be_compiled_runs_as_the_python_loop(backend):
    y = np.array([0.2, -0.1, 0.4, 0.3])
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        density, _ = _density(branching_walk(y), backend)
    fell_back = any("runs as a Python loop" in str(w.message) for w in caught)
    assert fell_back == (backend == "numpyro")  # torch's loop is a Python loop: t stays NumPy
    value, grad = _value_and_grad(density, [0.3])
    sigma = np.exp(0.3)
    expected = (
        stats.halfnorm.logpdf(sigma)
        + 0.3
        + stats.norm.logpdf(y, np.concatenate([[0.0], y[:-1]]), sigma).sum()
    )
    assert -value == pytest.approx(expected, rel=1e-6)


def test_pointwise_log_likelihood_is_the_python_loops(python_loop):
    density, setup = _density(timeseries.stochastic_volatility(SV_Y), "numpyro")
    flat = np.random.default_rng(5).normal(size=setup.layout.dim) * 0.5
    with setup.backend.scope(), setup.backend.activate():
        values, loglik = density.replay(setup.backend.asarray(flat))
        with python_loop():
            expected_values, expected_loglik = density.replay(setup.backend.asarray(flat))
    assert loglik["y"].shape == (len(SV_Y),)
    np.testing.assert_allclose(np.asarray(loglik["y"]), np.asarray(expected_loglik["y"]))
    np.testing.assert_allclose(np.asarray(values["h"]), np.asarray(expected_values["h"]))


@bdl.model
def drifting_walk(y):
    drift = bdl.sample("drift", dist.Normal(1.0, 1e-3))

    def step(prev, t):
        y_t = bdl.sample("y", dist.Normal(prev + drift, 1e-3), obs=y[t])
        return y_t, None  # the carry is the draw when predicting

    bdl.scan(step, 0.0, np.arange(y.shape[0]))


def test_prediction_draws_each_step_from_the_step_before(backend):
    """As the predictive runs a model: drawn observed sites, compiled; the carry is the draw."""
    from ppl_bdl.trace.interpreter import Evaluator

    be = bdl.backends.get(backend)
    bound = drifting_walk(np.zeros(5))

    def predict(drift, key):
        ev = Evaluator(
            be, values={"drift": drift}, key=key, predictive=True, missing="prior", record=True
        )
        bound.run_with(ev)
        return ev.sites["y"].value, ev.sites["y"].native.mean

    with be.scope(), be.activate():
        draws, means = be.jit(predict)(be.asarray(2.0), be.random.key(0))
    np.testing.assert_allclose(be.to_numpy(draws), 2.0 * np.arange(1.0, 6.0), atol=0.02)
    np.testing.assert_allclose(be.to_numpy(means)[1:], be.to_numpy(draws)[:-1] + 2.0, atol=1e-5)


# -- Pyro: the step traced once, its graph called at every step ----------------------------------
@pytest.fixture
def fresh_programs(monkeypatch):
    """``fresh(backend)``: a new, empty store of the backend's traced steps (for this test)."""
    from ppl_bdl.backends.pyro.scan import StepPrograms

    def fresh(backend):
        programs = StepPrograms()
        monkeypatch.setattr(backend, "step_programs", programs)
        return programs

    return fresh


def _pyro_eager_loop(monkeypatch):
    """Run Pyro's bdl.scan as its Python loop (the step run once per step)."""
    from ppl_bdl.backends.pyro.backend import PyroBackend
    from ppl_bdl.backends.pyro.scan import eager_scan

    monkeypatch.setattr(
        PyroBackend, "scan", lambda self, f, init, xs, n: eager_scan(f, init, xs, n)
    )


def _autograd_value_and_grad(density, flat):
    """The potential's gradient by plain autograd (as Pyro's NUTS takes it)."""
    import torch

    be = density.backend
    with be.scope(), be.activate():
        z = be.asarray(flat).requires_grad_(True)
        value = density.potential(z)
        (grad,) = torch.autograd.grad(value, z)
        return float(value.detach()), grad.numpy()


def test_pyro_traced_step_gives_the_eager_loops_potential_and_gradients(
    fresh_programs, monkeypatch
):
    """The SV step closes over mu, phi and sigma: their gradients come through the graph."""
    density, setup = _density(timeseries.stochastic_volatility(SV_Y), "pyro")
    pyro_programs = fresh_programs(setup.backend)
    flat = np.random.default_rng(6).normal(size=setup.layout.dim) * 0.5
    traced = [_value_and_grad(density, flat), _autograd_value_and_grad(density, flat)]
    assert pyro_programs.traces == 1 and pyro_programs.failures == 0  # the graph ran
    with monkeypatch.context() as patch:
        _pyro_eager_loop(patch)
        eager = [_value_and_grad(density, flat), _autograd_value_and_grad(density, flat)]
    for (value, grad), (expected_value, expected_grad) in zip(traced, eager, strict=True):
        assert value == pytest.approx(expected_value, rel=1e-12)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert np.all(eager[0][1][:3] != 0.0)  # the latents the step closes over have gradients


def test_pyro_step_with_python_control_flow_on_a_value_runs_as_the_python_loop(fresh_programs):
    import torch

    from ppl_bdl.backends.pyro.scan import eager_scan, traced_scan

    calls = []
    rate = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def step(carry, x):
        calls.append(1)
        new = carry * rate + x if carry > 0 else carry - rate * x  # a Python branch on a value
        return new, new

    xs = torch.tensor([1.0, -3.0, 0.5, 2.0, -1.0, 0.3], dtype=torch.float64)
    init = torch.tensor(0.2, dtype=torch.float64)
    be = bdl.backends.get("pyro", "float64")
    pyro_programs = fresh_programs(be)
    carry, ys = traced_scan(be, step, init, xs, len(xs))
    assert len(calls) == 1 + len(xs)  # the recorded first step, then the Python loop
    assert pyro_programs.traces == 0  # refused before tracing
    expected_carry, expected_ys = eager_scan(step, init, xs, len(xs))
    np.testing.assert_allclose(ys.detach().numpy(), expected_ys.detach().numpy(), rtol=1e-15)
    grad = torch.autograd.grad(carry + ys.sum(), rate)[0]
    expected = torch.autograd.grad(expected_carry + expected_ys.sum(), rate)[0]
    assert float(grad) == pytest.approx(float(expected), rel=1e-14)


def test_pyro_traces_the_step_once(fresh_programs):
    y = timeseries.simulate_ar(300, 0.0, [0.5], 0.3, seed=0)
    density, setup = _density(counted_ar1(y), "pyro")
    pyro_programs = fresh_programs(setup.backend)
    STEP_CALLS.clear()
    _value_and_grad(density, [0.1, -0.2])
    # The recorded first step, the trace, the trace's eager check, the step's last eager run.
    assert len(STEP_CALLS) == 4 and pyro_programs.traces == 1
    STEP_CALLS.clear()
    _value_and_grad(density, [0.3, 0.1])
    _autograd_value_and_grad(density, [0.3, 0.1])
    assert len(STEP_CALLS) == 2  # once per evaluation: the other 298 steps ran the graph
    assert pyro_programs.traces == 1 and pyro_programs.failures == 0


def test_pyro_trace_of_the_potential_leaves_a_long_loop_to_the_traced_step(monkeypatch):
    import warnings

    from ppl_bdl.backends.pyro import scan as pyro_scan

    density, setup = _density(ar1(Y), "pyro")
    be, point = setup.backend, setup.backend.asarray([0.1, -0.2])
    monkeypatch.setattr(pyro_scan, "UNROLL_LIMIT", len(Y) - 2)  # the loop has len(Y) - 1 steps
    with be.scope(), be.activate(), warnings.catch_warnings():
        warnings.simplefilter("error")
        value_and_grad = density.value_and_grad
        assert be.trace(value_and_grad, (point,)) is value_and_grad


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_a_long_series_fits_under_nuts_and_vi_and_predicts(backend):
    """T = 10,000 steps: each fit traces the step once (the Python loop would unroll it). On
    Pyro a gradient costs the step's graph at each step: fewer draws, and a uniform start (the
    default start draws from the prior, whose steps run as Python: random draws)."""
    y = timeseries.simulate_volatility(10_000, -1.0, 0.9, 0.3, seed=2)
    bound = timeseries.stochastic_volatility(y)
    draws = {"numpyro": (10, 5, 3, 20, "median"), "pyro": (3, 2, 2, 5, "uniform")}[backend]
    num_warmup, num_samples, depth, vi_steps, init = draws
    post = bdl.fit(
        bound,
        backend=backend,
        seed=0,
        progress=False,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=1,
        max_tree_depth=depth,
        init=init,
    )
    assert post.samples["h_std"].shape == (1, num_samples, 10_000)
    assert post.log_likelihood["y"].shape == (1, num_samples, 10_000)
    pred = post.predict(bound, seed=1)
    assert np.asarray(pred.draws["y"]).shape[-1] == 10_000
    vi = bdl.fit(
        bound,
        backend=backend,
        method="vi",
        num_steps=vi_steps,
        num_samples=num_samples,
        seed=0,
        progress=False,
    )
    assert vi.samples["h"].shape[-1] == 10_000
