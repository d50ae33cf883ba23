"""Minibatch rows gathered for a whole chunk before the loop (JAX, large data): the split of the
step is exact, and a fit draws the same chains with it as without it."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.inference import sgmcmc

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytest.importorskip("numpyro")

from ppl_bdl.backends._jax_index_work import split_index_work  # noqa: E402


@bdl.model
def tanh_net(X, y):
    w1 = bdl.sample("w1", dist.Normal(0.0, 1.0), shape=(X.shape[1], 5))
    w2 = bdl.sample("w2", dist.Normal(0.0, 1.0), shape=(5,))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(bdl.math.tanh(X[idx] @ w1) @ w2, 0.5), obs=y[idx])


def _data(n=300, d=3):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d)).astype(np.float32)
    return X, np.sin(X[:, 0]).astype(np.float32)


def test_the_split_gradient_equals_the_whole_one():
    X, y = jnp.asarray(_data()[0]), jnp.asarray(_data()[1])

    def grad(w, idx):
        return jax.grad(lambda w: jnp.sum((y[idx] - jnp.tanh(X[idx] @ w["a"]) @ w["b"]) ** 2))(w)

    rng = np.random.default_rng(1)
    w = {"a": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32), "b": jnp.ones(5)}
    work = split_index_work(grad, w, jnp.zeros(20, jnp.int32))
    assert work is not None and work.size == 20 * (3 + 1)  # the rows of X and y
    assert work.data_bytes >= X.nbytes + y.nbytes
    for seed in range(3):
        idx = jnp.asarray(np.random.default_rng(seed).integers(0, 300, 20), jnp.int32)
        whole, split = grad(w, idx), work.rest(w, work.gather(idx))
        for name in w:
            np.testing.assert_allclose(split[name], whole[name], rtol=1e-6)


def test_nothing_to_split_when_the_indices_select_latents():
    def grad(w, idx):  # the gather reads the state: only the indices could be precomputed
        return jax.grad(lambda w: jnp.sum(w[idx] ** 2))(w)

    assert split_index_work(grad, jnp.ones(10), jnp.zeros(4, jnp.int32)) is None


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_a_fit_draws_the_same_chains_with_bulk_gathers(monkeypatch, method):
    X, y = _data()
    used = []
    split = sgmcmc._Driver._split_index_work

    def spy(self, *args):
        work = split(self, *args)
        used.append(work is not None)
        return work

    monkeypatch.setattr(sgmcmc._Driver, "_split_index_work", spy)

    def draws(threshold):
        monkeypatch.setattr(sgmcmc, "GATHER_IN_BULK_BYTES", threshold)
        post = bdl.fit(
            tanh_net(X, y), backend="numpyro", method=method, step_size=1e-3, batch_size=30,
            num_warmup=50, num_samples=40, thinning=2, num_chains=2, chunk_size=20, seed=3,
            progress=False,
        )  # fmt: skip
        return post.samples

    in_loop, in_bulk = draws(10**12), draws(0)
    assert used == [False, True]
    for name in ("w1", "w2"):
        np.testing.assert_allclose(in_bulk[name], in_loop[name], rtol=1e-4, atol=1e-5)
