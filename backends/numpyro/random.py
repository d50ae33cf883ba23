"""``fold_in`` and ``normal`` for the NumPyro backend: the same bits as ``jax.random``'s, at a
fraction of their cost on the CPU.

Every step of a fit derives its key from its chain's key and its number (``fold_in(key, t)``).
``jax.random.fold_in`` hashes the pair ``(0, t)`` with Threefry-2x32 (Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3", 20 rounds); on the CPU JAX lowers the hash's
rounds as a rolled loop of five iterations, each a few tiny kernels, which cost about 1.4 µs a
step against the toy network's 15 µs step (benchmarks/dl_scale.py, docs/benchmarks.md). Here the
same hash is written out round by round with public ``jax.numpy`` operations on the two words, so
XLA fuses it into one scalar kernel (0.6 µs). The result is bit for bit ``jax.random.fold_in``'s
for a raw ``uint32[2]`` key (tested); any other key falls back to JAX's own function.

Each step's Gaussian noise (SG-MCMC's, a guide's draws) hashes one counter per element with
the same rolled loop, five passes over the whole array. :func:`normal`, written out the same
way, is one elementwise kernel: per draw of 751 normals (the UCI net) 11.8-14.0 → 6.1 µs, of
2.4 M (784-1200-1200-10) 30 → 14.5-14.9 ms, bit for bit ``jax.random.normal`` (tested).

The backend calls these while its ``cpu_tricks`` setting is on (the default;
``PPL_BDL_CPU_TRICKS=0`` turns it off, and the backend calls ``jax.random``'s own).

Example
-------
>>> import jax, numpy as np
>>> from ppl_bdl.backends.numpyro.random import fold_in, normal
>>> key = jax.random.PRNGKey(0)
>>> bool((np.asarray(fold_in(key, 7)) == np.asarray(jax.random.fold_in(key, 7))).all())
True
>>> draw = normal(key, (3, 4), np.float32)
>>> bool((np.asarray(draw) == np.asarray(jax.random.normal(key, (3, 4), np.float32))).all())
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
    if _eager(key, data):
        return _fold_in_compiled(key, data)
    key = jnp.asarray(key)
    if key.dtype != jnp.uint32 or key.shape != (2,):
        return jax.random.fold_in(key, data)
    data = jnp.asarray(data).astype(jnp.uint32)
    y0, y1 = threefry2x32(key[0], key[1], jnp.zeros_like(data), data)
    return jnp.stack([y0, y1])


def normal(key, shape, dtype):
    """``jax.random.normal(key, shape, dtype)``, bit for bit, for a raw ``uint32[2]`` key and
    a 32- or 64-bit float; other keys and floats go to JAX's own function.

    JAX's recipe (its default, "partitionable" Threefry): each element's counter is its flat
    index as a 64-bit number split in two words, hashed under the key; a 32-bit draw is the
    two output words' xor, a 64-bit one the two words side by side. The bits' top mantissa
    bits under a unit exponent make a uniform on [1, 2), shifted to (-1, 1); the normal is
    √2 erf⁻¹ of it. Written out, the hash and the transform fuse into one elementwise kernel
    instead of a rolled loop of five iterations over the whole array."""
    if _eager(key):
        return _normal_compiled(key, tuple(shape), np.dtype(dtype))
    key, dtype = jnp.asarray(key), np.dtype(dtype)
    if (
        key.dtype != jnp.uint32
        or key.shape != (2,)
        or dtype not in _UNIT_BITS
        or not jax.config.jax_threefry_partitionable
        or (dtype.itemsize == 8 and not jax.config.jax_enable_x64)
    ):
        return jax.random.normal(key, shape, dtype)
    shape = tuple(shape)
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 2**32:
        return jax.random.normal(key, shape, dtype)
    count = jax.lax.iota(jnp.uint32, size).reshape(shape)
    high, low = threefry2x32(key[0], key[1], jnp.zeros_like(count), count)
    if dtype == np.float32:
        bits, uint = high ^ low, jnp.uint32
    else:
        uint = jnp.uint64
        bits = (high.astype(uint) << np.uint64(32)) | low.astype(uint)
    shift, one = _UNIT_BITS[dtype]
    unit = jax.lax.bitcast_convert_type((bits >> uint(shift)) | uint(one), dtype) - dtype.type(1)
    lowest = np.nextafter(dtype.type(-1), dtype.type(0), dtype=dtype)
    uniform = jnp.maximum(lowest, unit * (dtype.type(1) - lowest) + lowest)
    draw = dtype.type(np.sqrt(2)) * jax.lax.erf_inv(uniform)
    # Made once: left to itself XLA fuses the cheap hash into every consumer of the draw (a
    # guide's noise feeds a dozen kernels, some broadcast over the batch) and hashes each
    # element many times. XLA never duplicates a floating division into several consumers,
    # so the draw is divided by ones it cannot see are ones (an exact identity: 0 times a
    # counter, a float XLA does not fold, plus 1).
    ones = count.astype(dtype) * dtype.type(0) + dtype.type(1)
    return draw / ones


#: Per float: how far to shift the random bits to keep its mantissa's, and the bits of 1.0.
_UNIT_BITS = {
    np.dtype(np.float32): (32 - 23, np.float32(1).view(np.uint32)),
    np.dtype(np.float64): (64 - 52, np.float64(1).view(np.uint64)),
}


def _eager(*values) -> bool:
    """Whether a call is outside any trace: called eagerly, the written-out hash would run (and
    compile) each of its few dozen operations on its own, so it runs as one compiled call."""
    return not any(isinstance(v, jax.core.Tracer) for v in values)


_fold_in_compiled = jax.jit(fold_in)
_normal_compiled = jax.jit(normal, static_argnums=(1, 2))
