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
from ppl_bdl.inference.vi.runner import VIRun


def test_loop_contract(backend):
    """Rows at kept steps, the real steps only, and a stop at the first failed step with the
    state from before it."""
    be = bdl.backends.get(backend)
    _check_loop_contract(be, be.compile_loop(_grow, lambda state: state))


@pytest.mark.parametrize("on_cpu", [True, False], ids=["segments", "gated-scan"])
def test_both_shapes_of_the_jax_loop_keep_the_contract(on_cpu):
    """JAX's loop has a CPU shape (segments of ungated steps, a gated re-run after a failure) and
    a GPU shape (a gated scan): both run here, whatever the device."""
    from ppl_bdl.backends.numpyro.loop import compile_loop

    backend = bdl.backends.get("numpyro")
    _check_loop_contract(backend, compile_loop(_grow, lambda state: state, on_cpu=on_cpu))


def _grow(state, x, data, t):
    new = state + data * x["inc"]
    return new, {"value": new, "log": bm.log(new), "t": t}


def _check_loop_contract(backend, runner):
    with backend.scope(), backend.activate():
        xs = {"inc": backend.asarray(np.array([1.0, 2.0, 3.0, -100.0, 5.0, 0.0]))}
        keep = np.array([True, False, True, True, True, False])
        two = backend.asarray(2.0)
        full = runner(backend.asarray(0.0), xs, two, keep, 3, 7, 4)  # three steps: 2, 6, 12
        assert float(full.state) == 12.0 and full.failed_at == -1 and full.failed_info is None
        np.testing.assert_allclose(full.rows, [2.0, 12.0])
        np.testing.assert_allclose(full.infos["value"], [2.0, 6.0, 12.0])
        np.testing.assert_array_equal(full.infos["t"], [7, 8, 9])  # numbered from `first`
        kept_only = runner(backend.asarray(0.0), xs, two, keep, 3, 7, 4, trace=False)
        np.testing.assert_allclose(kept_only.infos["value"], [2.0, 12.0])
        none_kept = runner(backend.asarray(0.0), xs, two, np.zeros(6, bool), 2, 0, 4)
        assert none_kept.rows is None and float(none_kept.state) == 6.0
        failed = runner(backend.asarray(0.0), xs, two, keep, 5, 0, 4)  # step 3 makes it negative
        assert failed.failed_at == 3 and np.isnan(failed.failed_info["log"])
        np.testing.assert_allclose(failed.rows, [2.0, 12.0])
        np.testing.assert_allclose(failed.infos["value"], [2.0, 6.0, 12.0])
        assert float(failed.state) == 12.0  # the state before the failed step; no later step ran


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
    vi = VIRun(
        setup, 0, guide="delta", num_steps=num_steps, batch_size=8, lr=0.05, chunk_size=chunk_size
    )
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
    kw = dict(
        backend=backend,
        method="sghmc",
        step_size=1e-3,
        batch_size=16,
        num_warmup=13,
        num_samples=20,
        thinning=2,
        num_chains=2,
        seed=1,
        precision="float64",
        progress=False,
    )
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
        bdl.fit(
            regression(*_data()),
            backend="numpyro",
            method="sgld",
            step_size=1e-3,
            batch_size=16,
            num_warmup=50,
            num_samples=53,
            num_chains=2,
            chunk_size=chunk_size,
            progress=False,
            log_likelihood=False,
            init="uniform",
        )
        return calls["n"]

    one_chunk, many_chunks = traces(1000), traces(10)
    # Once per fit: 1 validating run, its bounds-checked rerun (JAX clamps gathers), 1 run on a
    # minibatch (are observed sites indexed by the plate?), 1 trace of the step, 1 replay (and
    # with the default init="median", 25 prior draws, which are runs of the model, not traces).
    # The second fit (another chunk length) traces neither the step (its loop is compiled for
    # the new length from the step's trace kept by the program cache) nor the replay: only the
    # 3 validating runs of its set-up.
    assert (one_chunk, many_chunks) == (5, 3)


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
        bdl.fit(
            cliff(),
            backend=backend,
            method=method,
            step_size=step_size,
            num_warmup=0,
            num_samples=3000,
            num_chains=2,
            seed=0,
            init={"x": -0.5},
            progress=False,
        )
    partial = info.value.partial
    assert partial is not None
    assert np.all(partial.samples["x"] < 1.5)  # no draw from the NaN region is kept


@bdl.model
def steep_cliff():
    """N(0, 1) where x < 1.5; beyond, a factor whose gradient is NaN: the update that lands
    there makes the position NaN, and it stays NaN."""
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("cliff", bm.where(x < 1.5, 0.0, bm.sqrt(1.5 - x)))


def _failed_step(backend, num_warmup):
    with pytest.raises(bdl.InferenceError, match="non-finite") as info:
        bdl.fit(
            steep_cliff(),
            backend=backend,
            method="sgld",
            step_size=0.05,
            num_warmup=num_warmup,
            num_samples=4000 - num_warmup,
            seed=0,
            init={"x": -0.5},
            progress=False,
        )
    message = str(info.value)
    return int(message.split("at step ")[1].split()[0].rstrip(".,;:")), info.value.partial


def test_a_failure_between_kept_steps_stops_at_its_own_step(backend):
    """Warmup steps are kept by nobody, so they run lean (on JAX's CPU loop: nothing checked in
    them; the state is checked at kept steps and at each chunk's end): a run whose position
    breaks in warmup still stops at the step that broke it, the same step as when every step is
    kept and checked."""
    every, partial = _failed_step(backend, num_warmup=0)
    lean, none = _failed_step(backend, num_warmup=3990)
    assert lean == every < 3990 and none is None
    assert partial is not None and np.all(partial.samples["x"] < 1.5)


def test_vi_stops_at_a_nan_loss(backend):
    with pytest.raises(bdl.InferenceError, match="VI stopped at step") as info:
        bdl.fit(
            cliff(),
            backend=backend,
            method="vi",
            num_steps=500,
            lr=0.5,
            init_scale=2.0,
            num_samples=10,
            progress=False,
        )
    assert info.value.partial is not None


def test_vi_keeps_the_parameters_from_before_the_failed_step(backend):
    """The state a failed run keeps is the one ``failed_at`` steps give from the start (on JAX's
    CPU loop, which runs its steps ungated, the loop re-runs the chunk gated up to it)."""

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


@pytest.mark.parametrize("method", ["sghmc", "nuts"])
def test_a_subset_of_chains_draws_what_those_chains_draw_in_the_whole_run(backend, method):
    """``chain_ids`` (what an executor's task runs): a chain's draws depend on the seed and its
    number only, never on which chains run beside it."""
    kw = dict(
        backend=backend,
        method=method,
        num_warmup=30,
        num_samples=20,
        num_chains=4,
        seed=3,
        progress=False,
        log_likelihood=False,
    )
    if method == "sghmc":
        kw.update(step_size=1e-3, batch_size=16)
    whole = bdl.fit(regression(*_data()), **kw)
    part = bdl.fit(regression(*_data()), chain_ids=[3, 1], **kw)
    np.testing.assert_array_equal(part.samples["w"], whole.samples["w"][[3, 1]])
    with pytest.raises(bdl.ConfigError, match="chain_ids must be"):
        bdl.fit(regression(*_data()), chain_ids=[4], **kw)


def test_the_progress_bar_shows_acceptance_step_size_and_divergences(backend, monkeypatch):
    """NUTS with ``progress=True``: once draws are kept, the bar's postfix holds the mean
    acceptance rate, the step size and the divergences so far."""
    from ppl_bdl.inference.loop import driver

    shown = []
    update = driver.ProgressBar.update

    def record(self, steps, infos=None):
        update(self, steps, infos)
        shown.append(dict(self.postfix))

    monkeypatch.setattr(driver.ProgressBar, "update", record)

    @bdl.model
    def normal():
        bdl.sample("x", dist.Normal(0.0, 1.0))

    post = bdl.fit(
        normal(),
        backend=backend,
        method="nuts",
        num_warmup=50,
        num_samples=50,
        num_chains=1,
        chunk_size=25,
        progress=True,
    )
    assert set(shown[-1]) == {"accept", "step size", "divergences"}
    last_chunk = post.sample_stats["acceptance_rate"][0, -25:]  # the last chunk's draws
    assert float(shown[-1]["accept"]) == pytest.approx(last_chunk.mean(), abs=0.006)
    assert shown[-1]["divergences"] == str(int(post.sample_stats["diverging"].sum()))
