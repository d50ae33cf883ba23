"""Compiled programs are kept per model structure: a second fit of the same model (another seed,
other data of the same shapes, another step size) traces nothing again; another model of the
same shapes never reuses them; repeated fits do not grow the process's memory maps."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.trace.programs import ProgramCache, structure_key

jax = pytest.importorskip("jax")

TRACES = {"count": 0}


@bdl.model
def counted_mean(y, shift: float = 0.0):
    """y ~ N(mu + shift, 1); counts the times it is traced (a Python side effect under jit)."""
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    if isinstance(mu, jax.core.Tracer):
        TRACES["count"] += 1
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu + shift, 1.0), obs=y[idx])


@bdl.model
def shifted_mean(y, shift: float = 0.0):
    """The same shapes as :func:`counted_mean`, other code: y ~ N(mu - 3, 1)."""
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu - 3.0 + shift, 1.0), obs=y[idx])


def _fit(model, y, seed, step_size=1e-2, method="sgld", **options):
    options = {"step_size": step_size, **options} if method == "sgld" else options
    return bdl.fit(
        model(y),
        backend="numpyro",
        method=method,
        seed=seed,
        num_warmup=100,
        num_samples=200,
        num_chains=1,
        progress=False,
        **options,
    )


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("method", ["sgld", "nuts"])
def test_second_fit_traces_nothing(method):
    rng = np.random.default_rng(0)
    first, other = rng.normal(1.0, 1.0, 50), rng.normal(-1.0, 1.0, 50)
    _fit(counted_mean, first, seed=0, method=method)
    traced = TRACES["count"]
    assert traced > 0
    post = _fit(counted_mean, other, seed=1, step_size=5e-3, method=method)
    assert TRACES["count"] == traced
    # the second fit ran on its own data: the conjugate posterior mean of mu
    exact = other.sum() / (len(other) + 1 / 100)
    assert abs(post.samples["mu"].mean() - exact) < 0.3


@pytest.mark.filterwarnings("ignore")
def test_vi_second_fit_traces_nothing():
    y = np.random.default_rng(1).normal(size=50)
    options = dict(backend="numpyro", method="vi", num_steps=50, progress=False)
    bdl.fit(counted_mean(y), seed=0, lr=0.05, **options)
    traced = TRACES["count"]
    bdl.fit(counted_mean(y + 1.0), seed=1, lr=0.01, **options)
    # the loop is not traced again; the PSIS check of the fit (its guide's draws) still is
    assert TRACES["count"] - traced <= 1


@pytest.mark.filterwarnings("ignore")
def test_other_model_of_the_same_shapes_gets_its_own_program():
    y = np.random.default_rng(2).normal(size=50)
    plain = _fit(counted_mean, y, seed=0).samples["mu"].mean()
    shifted = _fit(shifted_mean, y, seed=0).samples["mu"].mean()
    # y ~ N(mu - 3, 1): the posterior of mu sits 3 above that of y ~ N(mu, 1) (prior sd 10)
    assert abs(shifted - plain - 3.0) < 0.3
    # a bound value that is not a data array (shift) is part of the key
    moved = bdl.fit(
        counted_mean(y, shift=2.0),
        backend="numpyro",
        method="sgld",
        step_size=1e-2,
        seed=0,
        num_warmup=100,
        num_samples=200,
        num_chains=1,
        progress=False,
    )
    assert abs(plain - moved.samples["mu"].mean() - 2.0) < 0.3


def _memory_maps() -> int:
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.filterwarnings("ignore")
def test_repeated_fits_do_not_grow_memory_maps():
    y = np.random.default_rng(3).normal(size=50)
    _fit(counted_mean, y, seed=0)
    _fit(counted_mean, y, seed=1)
    before = _memory_maps()
    for seed in range(2, 12):
        _fit(counted_mean, y + seed, seed=seed, step_size=1e-2 / seed)
    # a compiled program maps a few regions of its own; ten of them would add ~100
    assert _memory_maps() - before < 20


def test_program_cache_is_bounded_and_least_recently_used():
    cache = ProgramCache(maxsize=2)
    cache.get("a", lambda: 1)
    cache.get("b", lambda: 2)
    cache.get("a", lambda: 0)  # a is now the most recent
    cache.get("c", lambda: 3)
    assert "a" in cache and "c" in cache and "b" not in cache
    assert (cache.hits, cache.misses, len(cache)) == (1, 3, 2)


def test_structure_keys_are_exact():
    assert structure_key((1, 2.0, "a")) == structure_key((1, 2.0, "a"))
    assert structure_key(1) != structure_key(1.0)  # an int and a float trace differently
    assert structure_key(np.arange(3)) != structure_key(np.arange(3) + 1)
    assert structure_key(len) == structure_key(len)
    with pytest.raises(Exception, match="no exact key"):
        structure_key(object())
