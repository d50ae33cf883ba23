"""VI runs in compiled chunks: a shorter last chunk runs padded on JAX (one compiled length), and
its padded steps change nothing; the chunks are queued ahead without changing the result."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.vi import VIRun


@bdl.model
def regression(x, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


def _run(backend, guide, num_steps, chunk_size, splits=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 2))
    y = x @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=64)
    setup = prepare(regression(x, y), backend, "float64", 0)
    vi = VIRun(setup, 0, guide=guide, num_steps=num_steps, batch_size=8, lr=0.05,
               chunk_size=chunk_size)  # fmt: skip
    losses = [vi.steps(n)[0] for n in (splits or [num_steps])]
    params = vi.fitted_guide().params
    return np.concatenate(losses), np.concatenate([np.ravel(params[k]) for k in sorted(params)])


def test_padded_last_chunk_changes_nothing(backend):
    """25 steps in chunks of 10 (the last one padded on JAX) give the same MAP fit as 20 steps
    and then 5 (no padding): the same batches, and the padded steps leave the state alone."""
    losses, params = _run(backend, "delta", 25, 10)
    split_losses, split_params = _run(backend, "delta", 25, 10, splits=[20, 5])
    assert losses.shape == (25,)
    np.testing.assert_allclose(losses, split_losses, rtol=1e-12)
    np.testing.assert_allclose(params, split_params, rtol=1e-12)


@pytest.mark.parametrize("chunk_size", [7, 25])
def test_chunking_does_not_change_a_deterministic_fit(chunk_size):
    """Queued-ahead chunks of any size give the same MAP trajectory (no draws, same batches)."""
    losses, params = _run("numpyro", "delta", 25, 5)
    other_losses, other_params = _run("numpyro", "delta", 25, chunk_size)
    np.testing.assert_allclose(other_losses, losses, rtol=1e-12)
    np.testing.assert_allclose(other_params, params, rtol=1e-12)


def test_loop_with_partial_chunk_applies_only_the_active_steps():
    be = bdl.backends.get("numpyro")

    def step(carry, key, x):
        new = carry + x
        return new, new

    runner = be.compile_loop(step, partial=True)
    xs = be.asarray(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert float(runner(be.asarray(0.0), be.random.key(0), xs, 5, active=3).carry) == 6.0
    assert float(runner(be.asarray(0.0), be.random.key(0), xs, 5).carry) == 15.0
    checked = be.compile_loop(step, check=lambda out: out < 100.0, freeze=False, partial=True)
    xs = be.asarray(np.array([1.0, 2.0, 3.0, 200.0, 5.0]))
    result = checked(be.asarray(0.0), be.random.key(0), xs, 5, active=3)
    assert float(result.carry) == 6.0  # steps 0-2 only
    assert result.stopped_at == 3  # a padded step may fail: the caller ignores it (>= active)
    with pytest.raises(ValueError, match="partial=True"):
        be.compile_loop(step)(be.asarray(0.0), be.random.key(0), xs, 5, active=3)
