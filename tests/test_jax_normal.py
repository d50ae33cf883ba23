"""The JAX backend's standard normals: exactly JAX's own under its original Threefry counter
layout (both words of every block used), under jit and vmap, without changing the layout of other
draws."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.backends._jax_normal import standard_normal


@pytest.mark.parametrize("shape", [(1,), (7,), (501,), (3, 2), (40, 25)])
@pytest.mark.parametrize("seed", [0, 17, 2**31 - 1])
def test_equals_jax_normal_under_the_original_layout(shape, seed):
    key = jax.random.PRNGKey(seed)
    with jax.threefry_partitionable(False):
        expected = np.asarray(jax.random.normal(key, shape))
    np.testing.assert_array_equal(np.asarray(standard_normal(key, shape)), expected)
    jitted = jax.jit(standard_normal, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(jitted(key, shape)), expected)


def test_equals_jax_normal_per_key_under_vmap():
    keys = jax.random.split(jax.random.PRNGKey(3), 6)
    with jax.threefry_partitionable(False):
        expected = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (4, 5)))(keys))
    drawn = jax.vmap(lambda k: standard_normal(k, (4, 5)))(keys)
    np.testing.assert_array_equal(np.asarray(drawn), expected)


def test_typed_keys_draw_under_the_original_layout_too():
    key = jax.random.key(5)
    with jax.threefry_partitionable(False):
        expected = np.asarray(jax.random.normal(key, (9,)))
    np.testing.assert_array_equal(np.asarray(standard_normal(key, (9,))), expected)


def test_draws_elsewhere_keep_jax_default_layout():
    key = jax.random.PRNGKey(2)
    default = np.asarray(jax.random.normal(key, (50,)))
    mixed = jax.jit(lambda k: (standard_normal(k, (50,)), jax.random.normal(k, (50,))))(key)
    np.testing.assert_array_equal(np.asarray(mixed[1]), default)
    with jax.threefry_partitionable(True):  # the process-wide default is untouched
        np.testing.assert_array_equal(np.asarray(jax.random.normal(key, (50,))), default)


def test_the_numpyro_backend_draws_with_it():
    be = bdl.backends.get("numpyro")
    key = jax.random.PRNGKey(11)
    with be.activate():
        drawn = be.random.normal(key, (300,))
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(standard_normal(key, (300,))))


def test_a_large_draw_is_standard_normal():
    """Moments of 10^6 draws within 5 Monte Carlo standard errors (mean, variance, kurtosis)."""
    z = np.asarray(standard_normal(jax.random.PRNGKey(0), (1_000_000,)), dtype=np.float64)
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * np.sqrt(2.0 / n)
    assert abs(np.mean(z**4) - 3.0) < 5 * np.sqrt(96.0 / n)
