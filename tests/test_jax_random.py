"""The NumPyro backend's ``fold_in`` and ``normal`` (backends/numpyro/random.py) draw JAX's own bits."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from ppl_bdl.backends.numpyro.random import fold_in, normal, threefry2x32  # noqa: E402


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1])
def test_fold_in_is_jax_fold_in_bit_for_bit(seed):
    key = jax.random.PRNGKey(seed)
    steps = jnp.asarray([0, 1, 5, 999_999, 2**31 - 1], jnp.int32)
    ours = jax.jit(jax.vmap(fold_in, (None, 0)))(key, steps)
    theirs = jax.vmap(jax.random.fold_in, (None, 0))(key, steps)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    keys = jax.random.split(key, 3)  # a batch of chains' keys, as the loop vmaps them
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(fold_in, (0, None))(keys, 17)),
        np.asarray(jax.vmap(jax.random.fold_in, (0, None))(keys, 17)),
    )


def test_threefry_matches_the_published_known_answers():
    """Random123's known-answer vectors for Threefry-2x32 with 20 rounds (kat_vectors)."""
    u32 = np.uint32
    cases = [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for (k0, k1), (x0, x1), expected in cases:
        got = threefry2x32(*(jnp.asarray(u32(v)) for v in (k0, k1, x0, x1)))
        assert tuple(int(v) for v in got) == expected


def test_other_keys_fall_back_to_jax():
    key = jax.random.key(0)  # a typed key: JAX's own function
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(fold_in(key, 3))),
        np.asarray(jax.random.key_data(jax.random.fold_in(key, 3))),
    )


def _same_bits(a, b):
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("shape", [(), (1,), (3,), (751,), (13, 50), (2, 3, 5)])
@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1])
def test_normal_is_jax_normal_bit_for_bit(shape, seed):
    key = jax.random.PRNGKey(seed)
    ours = jax.jit(lambda k: normal(k, shape, np.float32))(key)
    _same_bits(ours, jax.random.normal(key, shape, np.float32))
    keys = jax.random.split(key, 3)  # chains' keys, vmapped as the loop does
    _same_bits(
        jax.vmap(lambda k: normal(k, shape, np.float32))(keys),
        jax.vmap(lambda k: jax.random.normal(k, shape, np.float32))(keys),
    )


def test_normal_in_float64_is_jax_normal_bit_for_bit():
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(3)
        for shape in [(), (5,), (4, 7)]:
            _same_bits(normal(key, shape, np.float64), jax.random.normal(key, shape, np.float64))


def test_normal_falls_back_where_it_would_differ():
    """A typed key, a float it does not write out, and JAX's older (non-partitionable) Threefry
    all go to ``jax.random.normal``."""
    _same_bits(
        normal(jax.random.key(1), (4,), np.float32),
        jax.random.normal(jax.random.key(1), (4,), np.float32),
    )
    key = jax.random.PRNGKey(1)
    _same_bits(normal(key, (4,), jnp.bfloat16), jax.random.normal(key, (4,), jnp.bfloat16))
    with jax.threefry_partitionable(False):
        _same_bits(normal(key, (5,), np.float32), jax.random.normal(key, (5,), np.float32))
    with jax.enable_x64(False):  # float64 asked for without 64-bit JAX: JAX's float32 draw
        _same_bits(normal(key, (5,), np.float64), jax.random.normal(key, (5,), np.float64))
