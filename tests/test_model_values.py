"""The same model text runs, or fails with the same ModelError, on every backend.

* NumPy values mix with a model's values on either side of an operator (arithmetic, ``@``,
  comparisons, indexing), as JAX arrays do: ``np.log(w) - (y - mu) ** 2`` with ``mu`` latent.
* A model value used as a Python value (``if mu > 0:``, ``float(mu)``, ``np.exp(mu)``, a NumPy
  array indexed with a plate's indices, a branch on the data) raises one ModelError, the same text
  on every backend, naming the model, the site and the line, and what to use instead.
* Python numbers as observed values and integer data work on every backend (found by the fuzzer).

Every shipped model and the docs' models run rewritten with NumPy values on both sides of their
operators: tests/test_model_values_rewrite.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from potentials import VI, assert_fits, assert_same_potential, potential

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.errors import ModelError

BACKENDS = bdl.backends.available()
NUTS = dict(num_warmup=15, num_samples=10, num_chains=1, max_tree_depth=3, progress=False)


# -- NumPy values on either side --------------------------------------------------------------------
A = np.array([0.5, 1.0, 2.0])
M = np.array([[1.0, 0.5, 0.0], [0.0, 1.0, -0.5]])
PICK = np.array([0, 2])
MASK = np.array([True, False, True])


@bdl.model
def mixing(y, side: str):
    """The same density three ways: NumPy constants on the left, on the right, or none."""
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    s = bdl.sample("s", dist.HalfNormal(1.0))
    if side == "left":
        terms = [
            np.float64(2.0) * w,
            A - w,
            A / (np.ones(3) + w**2),
            np.float64(0.5) ** s * A + s**2.0,
            np.log(A) - (y[:3] - w) ** 2,
            M @ w,
            bm.where(np.zeros(3) < w, w, -w),
            np.array(1.5) + w[PICK],
            np.int64(1) + w[MASK],
            np.arange(3) * w,
        ]
        lik = np.log(A) + dist.Normal(w, s).log_prob(y[:3])
    elif side == "right":
        terms = [
            w * np.float64(2.0),
            -(w - A),
            (w**2 + np.ones(3)) ** -1.0 * A,
            0.5**s * A + s ** np.array(2.0),
            (y[:3] - w) ** 2 * -1.0 + np.log(A),
            -(-w @ M.T),
            bm.where(w > np.zeros(3), w, -w),
            w[PICK] + np.array(1.5),
            w[MASK] + np.int64(1),
            w * np.arange(3),
        ]
        lik = dist.Normal(w, s).log_prob(y[:3]) + np.log(A)
    else:
        a, pick = bm.asarray(A), bm.asarray(PICK)
        terms = [
            2.0 * w,
            a - w,
            a / (1.0 + w**2),
            0.5**s * a + s**2.0,
            bm.log(a) - (y[:3] - w) ** 2,
            bm.matmul(bm.asarray(M), w),
            bm.where(w > 0.0, w, -w),
            1.5 + w[pick],
            1 + w[pick],
            bm.arange(3) * w,
        ]
        lik = bm.log(a) + dist.Normal(w, s).log_prob(y[:3])
    bdl.factor("terms", -0.1 * sum(bm.sum(t**2) for t in terms))
    bdl.factor("lik", lik)


Y = np.array([0.3, -0.2, 1.1, 0.4])


@pytest.mark.parametrize("side", ["left", "right"])
def test_numpy_values_mix_with_model_values_on_either_side(backend, side):
    assert_same_potential(mixing(Y, side), mixing(Y, "python"), backend, dim=4)


W = np.array([1.0, 2.0, 3.0])


@bdl.model
def issue_example(y):
    """The issue's example: a NumPy constant on the left of an operator with a latent value."""
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    bdl.factor("lik", np.log(W) - (y - mu) ** 2)


@bdl.model
def issue_example_reference(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    bdl.factor("lik", bm.log(bm.asarray(W)) - (y - mu) ** 2)


def test_the_issues_example_runs_on_every_backend(backend):
    y = np.array([0.1, 0.5, -0.3])
    assert_same_potential(issue_example(y), issue_example_reference(y), backend, dim=1)


def test_lowered_models_take_numpy_values_too(backend):
    bound = mixing(Y, "left")
    native = bound.lower(backend)
    if backend == "pyro":
        import pyro

        trace = pyro.poutine.trace(native).get_trace()
    else:
        import numpyro

        trace = numpyro.handlers.trace(numpyro.handlers.seed(native, 0)).get_trace()
    assert {"w", "s", "terms", "lik"} <= set(trace)


# -- a model value used as a Python value ---------------------------------------------------------
SCALES = np.linspace(0.5, 1.5, 5)


@bdl.model
def branch_on_latent(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    if mu > 0:
        scale = 1.0
    else:
        scale = 2.0
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, scale), obs=y[idx])


@bdl.model
def number_of_latent(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0 + float(mu) ** 2), obs=y[idx])


@bdl.model
def numpy_of_latent(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(np.exp(mu), 1.0), obs=y[idx])


@bdl.model
def numpy_indexed_by_plate(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, SCALES[idx]), obs=y[idx])


@bdl.model
def branch_on_data(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    scale = 1.0 if y.sum() > 0 else 2.0
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, scale), obs=y[idx])


@bdl.model
def loop_on_latent(y):
    tau = bdl.sample("tau", dist.HalfNormal(1.0))
    n = 1
    while tau > 2.0**n:
        n += 1
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(0.0, tau * n), obs=y[idx])


#: model -> (where the message says it happened, the model's line it quotes)
CONVERSIONS = {
    branch_on_latent: ("after site 'mu'", "if mu > 0:"),
    number_of_latent: ("in the arguments of site 'y'", "1.0 + float(mu) ** 2"),
    numpy_of_latent: ("in the arguments of site 'y'", "np.exp(mu)"),
    numpy_indexed_by_plate: ("in the arguments of site 'y'", "SCALES[idx]"),
    branch_on_data: ("after site 'mu'", "scale = 1.0 if y.sum() > 0 else 2.0"),
    loop_on_latent: ("after site 'tau'", "while tau > 2.0**n:"),
}


@pytest.mark.parametrize("model", list(CONVERSIONS), ids=lambda m: m.name)
def test_a_model_value_used_as_a_python_value_is_the_same_error_everywhere(model):
    where, line = CONVERSIONS[model]
    messages = {}
    for backend in BACKENDS:
        for options in (NUTS, VI):
            with pytest.raises(ModelError) as info:
                bdl.fit(model(Y + 1.0), backend=backend, seed=0, **options)
            assert info.value.__cause__ is not None  # the array library's own error, kept
            messages[backend, options.get("method", "nuts")] = str(info.value)
    text = next(iter(messages.values()))
    assert all(m == text for m in messages.values()), messages
    assert text.startswith(f"model {model.name!r}: a model value is used as a Python value {where}")
    assert "test_model_values.py:" in text and line in text
    assert "ppl_bdl.dsl.math.where" in text and "mask" in text and "enumeration" in text


@bdl.model
def python_on_shapes_and_settings(X, y, K: int, verbose: bool = False):
    """What a model may do in Python: shapes, bound Python values, printing a value."""
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    if K > 1 and len(y) == X.shape[0]:
        w = w * K / K
    for _ in range(X.ndim - 1):
        w = w + 0.0
    if verbose:
        print(f"w = {w}, {repr(w)}")
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def test_python_on_shapes_and_bound_values_still_works(backend, capsys):
    X = np.random.default_rng(0).normal(size=(6, 2))
    bound = python_on_shapes_and_settings(X, X[:, 0], 2, verbose=True)
    (value, grad), _ = potential(bound, backend, np.zeros((2, 2)))
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    assert "w = " in capsys.readouterr().out


# -- data of any numeric dtype, Python numbers as observed values ---------------------------------
@bdl.model
def python_number_observed():
    s = bdl.sample("s", dist.HalfNormal(1.0))
    bdl.sample("y", dist.HalfNormal(s), obs=0.5)
    bdl.sample("k", dist.Poisson(s), obs=2)


@bdl.model
def array_observed(y, k):
    s = bdl.sample("s", dist.HalfNormal(1.0))
    bdl.sample("y", dist.HalfNormal(s), obs=y)
    bdl.sample("k", dist.Poisson(s), obs=k)


def test_python_numbers_as_observed_values(backend):
    """(fuzz: a Python-number obs reached torch unconverted in the hot loop, and JAX too.)"""
    reference = array_observed(np.array(0.5), np.array(2))
    assert_same_potential(python_number_observed(), reference, backend, dim=1)


@bdl.model
def list_parameters(loc, scale):
    w = bdl.sample("w", dist.Normal(loc, scale))
    bdl.sample("y", dist.Normal(w, [1.0, 2.0]), obs=[0.5, -0.5])


def test_python_lists_as_parameters_and_observed_values(backend):
    """(fuzz: a Python-list parameter reached NumPyro's distributions unconverted.)"""
    bound = list_parameters([0.0, 1.0], [1.0, 1.0])
    reference = list_parameters(np.array([0.0, 1.0]), np.ones(2))
    assert_same_potential(bound, reference, backend, dim=2)


@bdl.model
def regression(X, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    b = bdl.sample("b", dist.Normal(0.0, 1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        mean = X[idx] @ w + bm.matmul(X[idx], w) - bm.dot(X[idx], w) + b
        bdl.sample("y", dist.Normal(mean, 1.0), obs=y[idx])


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool", "float32"])
def test_data_of_any_numeric_dtype(backend, dtype):
    """(fuzz: integer X in ``X[idx] @ w`` failed in torch's addmv on Pyro.)"""
    X = np.random.default_rng(1).integers(0, 2, size=(8, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.2
    assert_same_potential(
        regression(X.astype(dtype), y), regression(X.astype(float), y), backend, dim=4
    )


# -- the models above fit ---------------------------------------------------------------------------
X_INT = np.random.default_rng(1).integers(0, 2, size=(8, 3))
FITS = {
    "numpy-left": lambda: mixing(Y, "left"),
    "numpy-right": lambda: mixing(Y, "right"),
    "issue": lambda: issue_example(np.array([0.1, 0.5, -0.3])),
    "python-number-obs": python_number_observed,
    "int-data": lambda: regression(X_INT, X_INT @ np.array([1.0, -1.0, 0.5])),
}


@pytest.mark.parametrize("case", sorted(FITS))
def test_they_fit_on_pyro(case):
    """A tiny NUTS run and a VI run (on the backend where they failed before; -m slow: all)."""
    assert_fits(FITS[case](), "pyro")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FITS))
def test_they_fit_on_every_backend(backend, case):
    assert_fits(FITS[case](), backend)
