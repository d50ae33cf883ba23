"""``fold_in`` for the NumPyro backend's loop: the same bits as ``jax.random.fold_in``, at a
fraction of its cost on the CPU.

Every step of a fit derives its key from its chain's key and its number (``fold_in(key, t)``).
``jax.random.fold_in`` hashes the pair ``(0, t)`` with Threefry-2x32 (Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3", 20 rounds); on the CPU JAX lowers the hash's
rounds as a rolled loop of five iterations, each a few tiny kernels, which cost about 1.4 µs a
step against the toy network's 15 µs step (benchmarks/dl_scale.py, docs/benchmarks.md). Here the
same hash is written out round by round with public ``jax.numpy`` operations on the two words, so
XLA fuses it into one scalar kernel (0.6 µs). The result is bit for bit ``jax.random.fold_in``'s
for a raw ``uint32[2]`` key (tested); any other key falls back to JAX's own function.

Example
-------
>>> import jax, numpy as np
>>> from ppl_bdl.backends._jax_random import fold_in
>>> key = jax.random.PRNGKey(0)
>>> bool((np.asarray(fold_in(key, 7)) == np.asarray(jax.random.fold_in(key, 7))).all())
True
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: Threefry-2x32's rotation distances, the two alternating groups of four rounds (Salmon et
#: al. 2011, Table 4).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: The key schedule's parity constant (Salmon et al. 2011; the Skein specification's C240).
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x, distance: int):
    return (x << np.uint32(distance)) | (x >> np.uint32(32 - distance))


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds of the words ``(x0, x1)`` under the key ``(k0, k1)`` (all
    ``uint32`` arrays of one shape): the hash ``jax.random`` is built on, written out."""
    schedule = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + k0, x1 + k1
    for block in range(5):
        for distance in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, distance) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def fold_in(key, data):
    """``jax.random.fold_in(key, data)``, bit for bit, for a raw ``uint32[2]`` key (the
    backend's keys); other keys go to JAX's own function."""
    key = jnp.asarray(key)
    if key.dtype != jnp.uint32 or key.shape != (2,):
        return jax.random.fold_in(key, data)
    data = jnp.asarray(data).astype(jnp.uint32)
    y0, y1 = threefry2x32(key[0], key[1], jnp.zeros_like(data), data)
    return jnp.stack([y0, y1])
