"""Pre-drawn normals in compiled loops (ppl_bdl.prefetch) and the loop's emit/check contract."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, prefetch
from ppl_bdl import random as br


@pytest.fixture
def numpyro_backend():
    return bdl.backends.get("numpyro")


def _two_draws(key):
    return br.normal(key, (3,)), br.normal(key, (2, 4))


def test_record_and_replay_in_order(numpyro_backend):
    be = numpyro_backend
    with be.activate():
        shapes = prefetch.record_normal_shapes(be, _two_draws, br.key(0))
        assert shapes == [(3,), (2, 4)]
        draws = prefetch.draw_normals(be, be.random.keys(br.key(1), 6), shapes)
        assert [tuple(d.shape) for d in draws] == [(6, 3), (6, 2, 4)]
        with prefetch.replaying(draws[0][2], draws[1][2]):
            a, b = _two_draws(br.key(5))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(draws[0][2]))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(draws[1][2]))


def test_replay_refuses_a_step_that_draws_differently(numpyro_backend):
    be = numpyro_backend
    with be.activate():
        with pytest.raises(RuntimeError, match="shape"), prefetch.replaying(be.asarray([0.0])):
            br.normal(br.key(0), (3,))
        with pytest.raises(RuntimeError, match="drew 2 standard normals"):
            with prefetch.replaying(be.asarray([0.0, 1.0, 2.0])):
                _two_draws(br.key(0))


def test_pre_drawn_normals_are_standard_and_independent(numpyro_backend):
    """Across steps, draws and coordinates the pre-drawn values are iid N(0, 1): mean, variance
    and the correlation between steps and between the two draws of a step, each within 4
    standard errors of its exact value."""
    be = numpyro_backend
    steps, dim = 4000, 50
    with be.activate():
        draws = prefetch.draw_normals(be, be.random.keys(br.key(3), steps), [(dim,), (dim,)])
    first, second = (np.asarray(d, dtype=float) for d in draws)
    n = first.size
    assert abs(first.mean()) < 4 / np.sqrt(n)
    assert abs(first.var() - 1.0) < 4 * np.sqrt(2.0 / n)
    lag = np.mean(first[1:] * first[:-1])
    across = np.mean(first * second)
    assert abs(lag) < 4 / np.sqrt(n) and abs(across) < 4 / np.sqrt(n)


def test_compiled_loop_with_prefetch_matches_per_step_semantics(numpyro_backend):
    """A random walk run through compile_loop with its normals pre-drawn: same seed, same path;
    increments are N(0, 1) (variance within 4 standard errors)."""
    be = numpyro_backend

    def step(carry, key, x):
        new = carry + br.normal(key, (2,))
        return new, new

    with be.activate():
        shapes = prefetch.record_normal_shapes(be, step, be.asarray([0.0, 0.0]), br.key(0), None)
        prologue, replayed = prefetch.prefetching_loop(be, step, shapes)
        runner = be.compile_loop(replayed, prologue=prologue)
        paths = [
            np.asarray(runner(be.asarray([0.0, 0.0]), br.key(7), None, 2000).outputs)
            for _ in range(2)
        ]
    np.testing.assert_array_equal(paths[0], paths[1])
    increments = np.diff(paths[0], axis=0).ravel()
    assert abs(increments.var() - 1.0) < 4 * np.sqrt(2.0 / increments.size)


@pytest.mark.parametrize("every", [1, 5])
def test_compile_loop_emits_every_lth_step_and_stops_at_the_exact_step(backend, every):
    be = bdl.backends.get(backend)

    def step(carry, key, x):
        new = carry + 1.0
        return new, {"value": new, "ok": new < 13.5}

    with be.activate():
        runner = be.compile_loop(step, check=lambda out: out["ok"], emit_every=every)
        done = runner(be.asarray(0.0), br.key(0), None, 10)
        failed = runner(be.asarray(0.0), br.key(0), None, 20)
    values = np.asarray(be.to_numpy(done.outputs["value"]))
    np.testing.assert_array_equal(values, np.arange(every, 11, every))
    assert done.stopped_at is None
    assert failed.stopped_at == 13  # the 14th step (value 14) fails, whatever L is


@bdl.model
def _line(X, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, 0.5), obs=y[idx])


def test_diverging_thinned_chains_keep_their_draws(backend):
    """With thinning (on JAX the outputs leave the loop once per thinning block) a run that
    diverges mid-way keeps exactly the kept draws from before the failed step, all finite."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = X @ np.array([0.5, -0.3]) + 0.5 * rng.normal(size=200)
    with pytest.raises(bdl.InferenceError, match="reached NaN or inf at step") as info:
        bdl.fit(_line(X, y), backend=backend, method="sgld", step_size=0.05, batch_size=50,
                num_warmup=0, num_samples=100, thinning=4, num_chains=1, seed=0,
                chunk_size=40, progress=False, init={"w": np.array([0.45, -0.2])})  # fmt: skip
    step = int(str(info.value).split("at step ")[1].split(" ")[0])
    assert step > 8  # it fails after some draws were kept
    draws = info.value.partial.samples["w"]
    assert draws.shape == (1, step // 4, 2)
    assert np.all(np.isfinite(draws))
