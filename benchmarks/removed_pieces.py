"""What the pieces removed from the hot loop could still buy, at toy and at deep-learning scale.

An earlier version removed four speed-ups of the SG-MCMC/VI loop on JAX (pre-drawn noise, minibatch
rows gathered in bulk, a private layout of the normals, the first epoch's shuffle on a thread): the
rule is that a piece stays only if it gains at least 10% at both scales. Each piece made one part
of a step cheaper, so the most it can gain is that part's share of the step. This script measures
those shares in one process with hand-written JAX steps (``jax.jit`` of ``lax.scan``), for the
toy network of ``sgmcmc_step.py`` (8-50-1, B = 100) and the network of ``dl_scale.py``
(784-400-400-10, B = 128):

- the SGLD step, its noise (``jax.random.normal`` of every weight) and the step without it;
- JAX's non-partitionable Threefry layout (what the private layout did) for that noise;
- the minibatch gather alone (``X[idx]``), against the step.

Usage::

    python benchmarks/removed_pieces.py [--steps-toy 20000 --steps-dl 100]
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np


def timed(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def network(sizes, n, batch, seed=0):
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        params[f"w{i}"] = jnp.asarray(rng.normal(size=(a, b)) * 0.05, jnp.float32)
        params[f"b{i}"] = jnp.zeros(b, jnp.float32)
    X = jnp.asarray(rng.normal(size=(n, sizes[0])), jnp.float32)
    y = jnp.asarray(rng.normal(size=(n, sizes[-1])), jnp.float32)

    def potential(p, idx):
        x = X[idx]
        for i in range(len(sizes) - 1):
            x = x @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(sizes) - 2:
                x = jnp.tanh(x)
        return 0.5 * jnp.sum((x - y[idx]) ** 2) * (n / batch) + 0.5 * sum(
            jnp.sum(v * v) for v in jax.tree_util.tree_leaves(p)
        )

    return params, X, potential


def measure(name: str, sizes, n: int, batch: int, steps: int) -> None:
    params, X, potential = network(sizes, n, batch)
    idxs = jnp.asarray(np.random.default_rng(1).integers(0, n, size=(steps, batch)), jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), steps)
    step = 1e-7

    def noise_of(key, p):
        leaves, tree = jax.tree_util.tree_flatten(p)
        parts = jax.random.split(key, len(leaves))
        return jax.tree_util.tree_unflatten(
            tree, [jax.random.normal(k, v.shape) for k, v in zip(parts, leaves, strict=True)]
        )

    @jax.jit
    def sgld(p, idxs, keys):
        def body(p, x):
            idx, key = x
            g = jax.grad(potential)(p, idx)
            e = noise_of(key, p)
            return jax.tree_util.tree_map(lambda a, b, c: a - step * b + 1e-3 * c, p, g, e), None

        return jax.lax.scan(body, p, (idxs, keys))[0]

    @jax.jit
    def sgd(p, idxs):
        def body(p, idx):
            g = jax.grad(potential)(p, idx)
            return jax.tree_util.tree_map(lambda a, b: a - step * b, p, g), None

        return jax.lax.scan(body, p, idxs)[0]

    @jax.jit
    def noise_only(p, keys):
        def body(p, key):
            e = noise_of(key, p)
            return jax.tree_util.tree_map(lambda a, c: a + 1e-3 * c, p, e), None

        return jax.lax.scan(body, p, keys)[0]

    @jax.jit
    def gather_only(acc, idxs):
        def body(acc, idx):
            return acc + X[idx].sum(), None

        return jax.lax.scan(body, acc, idxs)[0]

    per = {
        "sgld step": timed(sgld, params, idxs, keys),
        "sgd step (no noise)": timed(sgd, params, idxs),
        "noise alone": timed(noise_only, params, keys),
        "gather alone": timed(gather_only, jnp.zeros(()), idxs),
    }
    with jax.threefry_partitionable(False):
        per["noise alone, original layout"] = timed(jax.jit(noise_only.__wrapped__), params, keys)
    print(f"\n== {name}: {sizes}, N={n}, B={batch}, {steps} steps (us/step) ==")
    for key, value in per.items():
        print(f"  {key:<30} {1e6 * value / steps:10.1f}")
    total = per["sgld step"]
    print(
        f"  noise share of the SGLD step   {per['noise alone'] / total:9.0%}  (pre-drawing it, or the "
        f"original layout, can save at most this)"
    )
    saved = (per["noise alone"] - per["noise alone, original layout"]) / total
    print(f"  original layout saves          {saved:9.0%}")
    print(
        f"  gather share of the SGLD step  {per['gather alone'] / total:9.0%}  (gathering in bulk "
        "can save at most this)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-toy", type=int, default=20_000)
    parser.add_argument("--steps-dl", type=int, default=100)
    args = parser.parse_args()
    measure("toy", [8, 50, 1], 1_000_000, 100, args.steps_toy)
    measure("deep-learning scale", [784, 400, 400, 10], 60_000, 128, args.steps_dl)


if __name__ == "__main__":
    main()
