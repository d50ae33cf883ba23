"""The NumPyro backend's ``fold_in`` (backends/_jax_random.py) draws JAX's own bits."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from ppl_bdl.backends._jax_random import fold_in, threefry2x32  # noqa: E402


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
