"""Hand-written JAX SGLD steps on the toy 8-50-1 tanh BNN that differ only in what each step
also computes: nothing, the gradient norm, the potential, or both (as a NaN check needs).

It shows, without our code in the way, what the toy-scale SGLD step costs on XLA's CPU backend
when the Gaussian noise is drawn in the step (docs/benchmarks.md, "Toy scale"): the variants do
the same arithmetic up to one scalar, yet their times differ by up to 2x, because XLA's CPU
runtime runs a loop body's kernels on the calling thread when they form a chain and hands them
to its thread pool otherwise (see them with ``jax.profiler.trace``: one thread, or two).

Run: ``python benchmarks/toy_sgld_variants.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

D, H, B, N, NOISE = 8, 50, 100, 10_000, 0.1
DIM = D * H + 2 * H + 1
STEP = 1e-3 / N
CHUNK = 1000
VARIANTS = {
    "sgd": "SGD (no noise, no check): the floor",
    "sgld": "SGLD, nothing else",
    "sgld+grad_norm": "SGLD, and the gradient's norm checked finite",
    "sgld+potential": "SGLD, and the potential checked finite",
    "sgld+both": "SGLD, and both checked (what a per-step NaN check needs)",
}


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D)).astype(np.float32)
    y = np.sin(X @ (rng.normal(size=D) / np.sqrt(D))) + NOISE * rng.normal(size=N)
    return jnp.asarray(X), jnp.asarray(y.astype(np.float32))


def _potential(flat, idx, X, y):
    w1, b1 = flat[: D * H].reshape(D, H), flat[D * H : D * H + H]
    w2, b2 = flat[D * H + H : D * H + 2 * H], flat[-1]
    pred = jnp.tanh(X[idx] @ w1 + b1) @ w2 + b2
    return 0.5 * jnp.sum((y[idx] - pred) ** 2) / NOISE**2 * (N / B) + 0.5 * jnp.sum(flat**2)


def make_step(variant: str):
    """A runner of 10 chunks of ``CHUNK`` steps of ``variant`` (one jitted ``lax.scan``)."""
    X, y = _data()

    @jax.jit
    def chunk(flat, keys, idxs):
        def body(carry, inputs):
            flat, ok = carry
            key, idx = inputs
            value, grad = jax.value_and_grad(_potential)(flat, idx, X, y)
            new = flat - STEP * grad
            if variant != "sgd":
                new = new + jnp.sqrt(2 * STEP) * jax.random.normal(key, flat.shape)
            if variant in ("sgld+grad_norm", "sgld+both"):
                ok = ok & jnp.isfinite(jnp.sum(grad * grad))
            if variant in ("sgld+potential", "sgld+both"):
                ok = ok & jnp.isfinite(value)
            return (new, ok), None

        return lax.scan(body, (flat, jnp.asarray(True)), (keys, idxs))[0]

    rng = np.random.default_rng(1)
    flat = jnp.asarray(rng.normal(size=DIM) * 0.1, jnp.float32)
    idxs = jnp.asarray(rng.integers(0, N, size=(CHUNK, B)), jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), CHUNK)

    def run():
        out = None
        for _ in range(10):
            out = chunk(flat, keys, idxs)
        jax.block_until_ready(out)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = {name: make_step(name) for name in VARIANTS}
    for run in runs.values():
        run()  # compile
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeats):  # interleaved: a busy spell slows every variant alike
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    floor = best["sgd"]
    for name, seconds in best.items():
        print(
            f"{name:16s} {1e6 * seconds / (10 * CHUNK):7.2f} us/step  "
            f"{seconds / floor:5.2f}x SGD   {VARIANTS[name]}"
        )


if __name__ == "__main__":
    main()
