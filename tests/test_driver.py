"""The one driver: its compiled loop's contract on every backend, one compilation per fit however
the run is chunked, chunking that changes nothing, and the first non-finite step stopping every
method with its step and chain."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.vi import VIRun


def test_loop_contract(backend):
    """Rows at kept steps, the real steps only, and a stop at the first failed step."""
    be = bdl.backends.get(backend)
    _check_loop_contract(be, be.compile_loop(_grow, lambda carry: carry))


@pytest.mark.parametrize("on_cpu", [True, False], ids=["while-loop", "scan"])
def test_both_shapes_of_the_jax_loop_keep_the_contract(on_cpu):
    """JAX's loop has a CPU shape (a while loop, ungated) and a GPU shape (a gated scan): both run
    here, whatever the device."""
    from ppl_bdl.backends._jax_loop import compile_loop

    be = bdl.backends.get("numpyro")
    runner = compile_loop(_grow, lambda carry: carry, on_cpu=on_cpu)
    assert _check_loop_contract(be, runner).failed_step_applied is on_cpu


def _grow(carry, x, data):
    new = carry + data * x["inc"]
    return new, {"value": new}, bm.isfinite(bm.log(new))


def _check_loop_contract(be, runner):
    with be.scope(), be.activate():
        xs = {"inc": be.asarray(np.array([1.0, 2.0, 3.0, -100.0, 5.0])),
              "keep": be.asarray(np.array([True, False, True, True, True]))}  # fmt: skip
        two = be.asarray(2.0)
        full = runner(be.asarray(0.0), xs, two, 3, 3)  # three real steps: 2, 6, 12
        assert float(full.carry) == 12.0 and int(full.failed_at) == -1 and int(full.kept) == 2
        np.testing.assert_allclose(be.to_numpy(full.rows)[:2], [2.0, 12.0])
        failed = runner(be.asarray(0.0), xs, two, 5, 3)  # step 3 makes it negative: log is NaN
        assert int(failed.failed_at) == 3 and int(failed.kept) == 2
        np.testing.assert_allclose(be.to_numpy(failed.rows)[:2], [2.0, 12.0])
        # The carry: the failed step's (-188) if the runner says it applied it, else the one
        # before (12); no later step (+10) ran either way.
        assert float(failed.carry) == (-188.0 if failed.failed_step_applied else 12.0)
    return failed


@bdl.model
def regression(x, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2))
    return x, x @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=n)


def _vi(backend, num_steps, chunk_size, splits=None):
    setup = prepare(regression(*_data()), backend, "float64", 0)
    vi = VIRun(setup, 0, guide="delta", num_steps=num_steps, batch_size=8, lr=0.05,
               chunk_size=chunk_size)  # fmt: skip
    losses = [vi.steps(n)[0] for n in (splits or [num_steps])]
    params = vi.fitted_guide().params
    return np.concatenate(losses), np.concatenate([np.ravel(params[k]) for k in sorted(params)])


@pytest.mark.parametrize("chunk_size", [7, 25])
def test_chunking_does_not_change_a_deterministic_fit(backend, chunk_size):
    """Chunks of any size (a shorter last one included) give the same MAP trajectory."""
    losses, params = _vi(backend, 25, 5)
    other_losses, other_params = _vi(backend, 25, chunk_size)
    assert losses.shape == (25,)
    np.testing.assert_allclose(other_losses, losses, rtol=1e-10)
    np.testing.assert_allclose(other_params, params, rtol=1e-10)


def test_chunking_does_not_change_sgmcmc_draws(backend):
    kw = dict(backend=backend, method="sghmc", step_size=1e-3, batch_size=16, num_warmup=13,
              num_samples=20, thinning=2, num_chains=2, seed=1, precision="float64",
              progress=False)  # fmt: skip
    a = bdl.fit(regression(*_data()), chunk_size=6, **kw)
    b = bdl.fit(regression(*_data()), chunk_size=1000, **kw)
    np.testing.assert_allclose(a.samples["w"], b.samples["w"], rtol=1e-10)
    np.testing.assert_allclose(a.sample_stats["potential"], b.sample_stats["potential"], rtol=1e-10)


def test_one_compilation_per_fit_whatever_the_chunking(monkeypatch):
    """On JAX the step is traced once per fit: more (and shorter last) chunks add no traces."""
    calls = {"n": 0}
    original = regression.fn

    def counted(x, y):
        calls["n"] += 1
        return original(x, y)

    monkeypatch.setattr(regression, "fn", counted)

    def traces(chunk_size):
        calls["n"] = 0
        bdl.fit(regression(*_data()), backend="numpyro", method="sgld", step_size=1e-3,
                batch_size=16, num_warmup=50, num_samples=53, num_chains=2, chunk_size=chunk_size,
                progress=False, log_likelihood=False, init="uniform")  # fmt: skip
        return calls["n"]

    one_chunk, many_chunks = traces(1000), traces(10)
    # Once per fit: 1 validating run, its bounds-checked rerun (JAX clamps gathers), 1 run on a
    # minibatch (are observed sites indexed by the plate?), 1 trace of the step, 1 replay (and
    # with the default init="median", 25 prior draws, which are runs of the model, not traces).
    assert one_chunk == many_chunks == 5


# -- every method stops at the first non-finite potential or gradient -----------------------
@bdl.model
def cliff():
    """N(0, 1) where x < 1.5; NaN beyond (where the gradient of the factor is 0: finite)."""
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("cliff", bm.where(x < 1.5, 0.0, np.nan))


@pytest.mark.parametrize("method", ["sgld", "sghmc", "psgld", "csgld"])
def test_sgmcmc_stops_at_a_nan_potential(backend, method):
    with pytest.raises(bdl.InferenceError, match=r"chain \d+ reached a non-finite") as info:
        # pSGLD's preconditioner starts large (its gradient average starts at 0): smaller steps
        step_size = 0.01 if method == "psgld" else 0.05
        bdl.fit(cliff(), backend=backend, method=method, step_size=step_size, num_warmup=0,
                num_samples=3000, num_chains=2, seed=0, init={"x": -0.5}, progress=False)  # fmt: skip
    partial = info.value.partial
    assert partial is not None
    assert np.all(partial.samples["x"] < 1.5)  # no draw from the NaN region is kept


def test_vi_stops_at_a_nan_loss(backend):
    with pytest.raises(bdl.InferenceError, match="VI stopped at step") as info:
        bdl.fit(cliff(), backend=backend, method="vi", num_steps=500, lr=0.5, init_scale=2.0,
                num_samples=10, progress=False)  # fmt: skip
    assert info.value.partial is not None


def test_vi_keeps_the_parameters_from_before_the_failed_step(backend):
    """The state a failed run keeps is the one ``failed_at`` steps give from the start (on JAX's
    CPU loop, which applies the failed step, the driver re-runs the chunk up to it)."""

    def run(num_steps):
        setup = prepare(cliff(), backend, "float64", 0)
        vi = VIRun(setup, 0, num_steps=500, lr=0.05, init_scale=0.1, chunk_size=16)
        return vi, vi.steps(num_steps)

    vi, (losses, failure) = run(500)
    assert failure is not None and failure[1] == "nonfinite"
    failed_at = failure[0]
    assert failed_at > 16  # in a later chunk: the re-run starts from that chunk's start
    kept = vi.fitted_guide().params
    assert all(np.all(np.isfinite(v)) for v in kept.values())
    fresh, (_, none) = run(failed_at)
    assert none is None
    expected = fresh.fitted_guide().params
    for name in expected:
        np.testing.assert_array_equal(kept[name], expected[name])


def test_ctrl_c_during_the_re_run_keeps_the_failed_chunk_start(monkeypatch):
    """JAX's CPU loop applies the failed step; if Ctrl-C stops the re-run that recovers the state
    before it, the state the failed chunk started from is kept (an earlier, finite state)."""
    be = bdl.backends.get("numpyro")
    original = type(be).compile_loop

    def compile_loop(self, step, emit):
        runner = original(self, step, emit)

        def interrupting(carry, xs, data, num_steps, num_rows):
            if num_steps != 16:  # the re-run: as many steps as came before the failed one
                raise KeyboardInterrupt
            return runner(carry, xs, data, num_steps, num_rows)

        return interrupting

    def run(num_steps):
        setup = prepare(cliff(), "numpyro", "float64", 0)
        vi = VIRun(setup, 0, num_steps=496, lr=0.05, init_scale=0.1, chunk_size=16)
        return vi, vi.steps(num_steps)

    with monkeypatch.context() as patch:
        patch.setattr(type(be), "compile_loop", compile_loop)
        vi, (_, failure) = run(496)
    assert failure is not None and failure[1] == "nonfinite" and failure[0] % 16 != 0
    chunk_start = failure[0] - failure[0] % 16
    fresh, _ = run(chunk_start)
    fresh_start = fresh.fitted_guide().params
    kept = vi.fitted_guide().params
    for name in fresh_start:
        np.testing.assert_array_equal(kept[name], fresh_start[name])
