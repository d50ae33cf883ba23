"""The NumPyro backend's one switch for its CPU speed-ups (``cpu_tricks``, ``PPL_BDL_CPU_TRICKS``):
it changes the path taken (the written-out Threefry or ``jax.random``; the CPU loop's segments or
a plain scan) and not the draws.

Measured with the fits below: SGLD's kept draws are the same bit for bit with the switch on and
off; VI's (mean-field, the same seed) agree to float rounding (at most 1 unit in the last place
here): the written-out Gaussian draw is bit for bit ``jax.random.normal``'s, but it reaches XLA
as different operations, so XLA fuses the guide's arithmetic after it differently.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn

jax = pytest.importorskip("jax")

from test_driver import _check_loop_contract, _grow  # noqa: E402

from ppl_bdl.backends.numpyro.backend import CPU_TRICKS_ENV, NumPyroBackend  # noqa: E402
from ppl_bdl.errors import BackendError  # noqa: E402


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("", True), ("1", True), ("0", False), ("off", False)]
)
def test_the_environment_variable_sets_the_switch(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(CPU_TRICKS_ENV, raising=False)
    else:
        monkeypatch.setenv(CPU_TRICKS_ENV, value)
    assert NumPyroBackend().cpu_tricks is expected
    assert NumPyroBackend(cpu_tricks=not expected).cpu_tricks is (not expected)  # argument wins


def test_a_value_that_is_not_a_switch_is_refused(monkeypatch):
    monkeypatch.setenv(CPU_TRICKS_ENV, "fast")
    with pytest.raises(BackendError, match=f"{CPU_TRICKS_ENV}='fast'.*expected 0 or 1"):
        NumPyroBackend()


@pytest.mark.parametrize("tricks", [True, False], ids=["on", "off"])
def test_the_switch_picks_the_random_functions(monkeypatch, tricks):
    """Off, the backend calls ``jax.random.fold_in`` and ``jax.random.normal``; on, neither (a
    raw key's hash is written out). The draws are the same bits either way."""
    calls = []

    def spy(name):
        original = getattr(jax.random, name)

        def spied(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return spied

    for name in ("fold_in", "normal"):
        monkeypatch.setattr(jax.random, name, spy(name))
    random = NumPyroBackend(cpu_tricks=tricks).random
    key = jax.random.PRNGKey(11)
    keys = jax.vmap(random.fold_in, (None, 0))(key, np.arange(5, dtype=np.int32))
    draws = jax.jit(jax.vmap(lambda k: random.normal(k, (3, 7))))(keys)
    assert (calls == []) is tricks
    monkeypatch.undo()
    expected = jax.vmap(jax.random.fold_in, (None, 0))(key, np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(keys), np.asarray(expected))
    plain = jax.vmap(lambda k: jax.random.normal(k, (3, 7), np.float32))(expected)
    np.testing.assert_array_equal(
        np.asarray(draws).view(np.uint32), np.asarray(plain).view(np.uint32)
    )


@pytest.mark.parametrize(("tricks", "shape"), [(True, "segments"), (False, "scan")])
def test_the_switch_picks_the_cpu_loop(tricks, shape):
    """The loop's contract holds in both shapes, and only the chosen program is compiled (a
    failed chunk's gated re-run aside)."""
    backend = NumPyroBackend(cpu_tricks=tricks)
    runner = backend.compile_loop(_grow, lambda state: state)
    assert runner.shape == shape
    _check_loop_contract(backend, runner)
    chosen, other = (runner.fast, runner.scan) if tricks else (runner.scan, runner.fast)
    assert chosen._cache_size() > 0 and other._cache_size() == 0


@bdl.model
def mlp(X, y):
    f = nn.MLP("net", [3, 8, 1], activation="tanh", prior=dist.Normal(0.0, 1.0)).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.1), obs=y[idx])


def _fit(tricks: bool, method: str) -> dict:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5])).astype(np.float32)
    common = dict(
        backend=NumPyroBackend(cpu_tricks=tricks),
        batch_size=10,
        progress=False,
        seed=3,
        log_likelihood=False,
    )
    if method == "vi":
        options = dict(method="vi", guide="meanfield", num_steps=200, num_samples=5)
    else:
        options = dict(method="sgld", step_size=1e-5, num_warmup=100, num_samples=20)
        options.update(num_chains=2, thinning=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short fit's convergence warnings
        post = bdl.fit(mlp(X, y), **common, **options)
    return {name: np.asarray(value) for name, value in post.samples.items()}


def test_sgld_draws_are_the_same_bits_with_the_switch_on_and_off():
    on, off = _fit(True, "sgld"), _fit(False, "sgld")
    assert on.keys() == off.keys()
    for name in on:
        np.testing.assert_array_equal(on[name].view(np.uint32), off[name].view(np.uint32))


def test_vi_draws_agree_to_float_rounding_with_the_switch_on_and_off():
    on, off = _fit(True, "vi"), _fit(False, "vi")
    for name in on:
        np.testing.assert_allclose(on[name], off[name], rtol=1e-6, atol=1e-6)
