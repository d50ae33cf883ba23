"""A long run interrupted (Ctrl-C) keeps what it had: the error (a RunInterrupted) carries the
partial result, for NUTS, HMC, SG-MCMC, VI, CAVI and ensembles, wherever the Ctrl-C lands (in a
compiled chunk, inside a chunk where the backend steps in Python, as a chain starts, in the
step-size pilot), and through every executor (the worker processes' and Ray's in
tests/test_executor.py and tests/test_ray_executor.py). Ctrl-C is simulated: a KeyboardInterrupt
raised by a wrapped step, chunk or sweep after a fixed count (no timing)."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import RunInterrupted
from ppl_bdl.run.executor import ExecutorInterrupted
from ppl_bdl.trace.programs import clear_programs


@pytest.fixture(autouse=True)
def _fresh_programs():
    """The tests here stand in for a backend's loop or sampler: no program cached by an earlier
    fit of the same model may skip them."""
    clear_programs()
    yield
    clear_programs()


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _interrupt_second_chunk(monkeypatch, backend_name, chunk: int = 2):
    """Make the backend's compiled loops raise KeyboardInterrupt (Ctrl-C) while their second (or
    ``chunk``-th) chunk runs."""
    backend = bdl.backends.get(backend_name)
    original = type(backend).compile_loop

    def compile_loop(self, step, emit):
        runner = original(self, step, emit)
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == chunk:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return interrupted

    monkeypatch.setattr(type(backend), "compile_loop", compile_loop)


Y = np.random.default_rng(0).normal(1.0, 1.0, size=50)


def test_sgmcmc_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(RunInterrupted, match="interrupted at step 40") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="sgld",
            step_size=1e-3,
            num_warmup=20,
            num_samples=100,
            num_chains=1,
            chunk_size=40,
            progress=False,
        )
    assert info.value.partial.samples["mu"].shape == (1, 20)  # steps 20..39 of the first chunk


def test_vi_interrupted_keeps_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(RunInterrupted, match="interrupted at step 200") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="vi",
            num_steps=1000,
            lr=0.05,
            chunk_size=200,
            num_samples=10,
            progress=False,
        )
    partial = info.value.partial
    assert partial.losses.shape == (200,)
    assert partial.samples["mu"].shape == (1, 10)


def test_vi_interrupted_in_its_first_chunk_keeps_the_initial_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend, chunk=1)
    with pytest.raises(RunInterrupted, match="interrupted at step 0") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="vi",
            num_steps=1000,
            lr=0.05,
            chunk_size=200,
            num_samples=10,
            progress=False,
        )
    partial = info.value.partial
    assert partial.losses.shape == (0,)
    assert partial.samples["mu"].shape == (1, 10) and np.all(np.isfinite(partial.samples["mu"]))


def test_nuts_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(RunInterrupted, match="NUTS was interrupted at step 60") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="nuts",
            num_warmup=30,
            num_samples=100,
            num_chains=1,
            chunk_size=60,
            progress=False,
        )
    partial = info.value.partial
    assert partial.samples["mu"].shape == (1, 30)  # draws 30..59 of the first chunk
    assert partial.sample_stats["diverging"].shape == (1, 30)
    assert abs(partial.samples["mu"].mean() - Y.mean()) < 0.5


def _interrupt_step(monkeypatch, at: int, where: str = "step"):
    """Make NUTS's and HMC's transitions raise KeyboardInterrupt at their ``at``-th ``step``
    (counted over every chain; on Pyro's loop, which steps in Python, inside a chunk) or
    ``init`` (a chain starting)."""
    from ppl_bdl.inference.mcmc import native

    original, calls = native._transition, {"n": 0}

    def made(*args, **kwargs):
        transition = original(*args, **kwargs)

        def counted(*args):
            calls["n"] += 1
            if calls["n"] == at:
                raise KeyboardInterrupt
            return getattr(transition, where)(*args)

        # No program key: a loop compiled for the unwrapped transition would skip the count.
        return transition._replace(**{where: counted}, key=None)

    monkeypatch.setattr(native, "_transition", made)


def _interrupt_chunks(monkeypatch, backend_name, at: int):
    """Ctrl-C in the ``at``-th chunk of every compiled loop together (the fits of an executor's
    groups count on)."""
    backend = bdl.backends.get(backend_name)
    original, calls = type(backend).compile_loop, {"n": 0}

    def compile_loop(self, step, emit):
        runner = original(self, step, emit)

        def counted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == at:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return counted

    monkeypatch.setattr(type(backend), "compile_loop", compile_loop)


NUTS = dict(num_warmup=50, num_samples=100, num_chains=1, progress=False)


def test_a_held_ctrl_c_lets_the_block_finish_and_a_second_one_raises():
    """The NumPyro loop holds a Ctrl-C pressed during a compiled chunk (which cannot stop
    part-way) until the chunk returns; a second Ctrl-C is not held."""
    import signal

    from ppl_bdl.backends.numpyro.loop import held_interrupt

    # Python's own handler, as in a fresh process (a library loaded earlier may have its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        finished = False
        with held_interrupt() as pressed:
            signal.raise_signal(signal.SIGINT)
            finished = True
        assert finished and pressed == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt), held_interrupt():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_compiled_chunk_keeps_that_chunk(monkeypatch):
    """One compiled chunk of all 120 steps (``progress=False``): a Ctrl-C pressed while it runs
    keeps its 100 draws (the chunk in flight used to be lost with it, here the whole run)."""
    import contextlib
    import signal

    import ppl_bdl.backends.numpyro.loop as loop

    @contextlib.contextmanager
    def pressed_during_the_chunk():
        yield [signal.SIGINT]

    monkeypatch.setattr(loop, "held_interrupt", pressed_during_the_chunk)
    with pytest.raises(RunInterrupted, match="interrupted at step 120") as info:
        bdl.fit(
            mean_model(Y),
            backend="numpyro",
            method="sgld",
            step_size=1e-3,
            num_warmup=20,
            num_samples=100,
            num_chains=1,
            progress=False,
        )
    assert info.value.partial.samples["mu"].shape == (1, 100)


@pytest.mark.parametrize("method", ["nuts", "hmc"])
def test_ctrl_c_inside_a_chunk_keeps_the_steps_before_it(monkeypatch, method):
    """Pyro's loop steps in Python: Ctrl-C at step 119 of the run's one chunk (steps 0-149)
    keeps the 69 draws of steps 50-118 (a chunk used to be lost whole: all 100 draws here)."""
    _interrupt_step(monkeypatch, at=120)
    with pytest.raises(RunInterrupted, match=f"{method.upper()} was interrupted at step 119"):
        try:
            bdl.fit(mean_model(Y), backend="pyro", method=method, **NUTS)
        except RunInterrupted as err:
            assert err.partial.samples["mu"].shape == (1, 69)
            assert err.partial.sample_stats["diverging"].shape == (1, 69)
            raise


def test_ctrl_c_as_a_chain_starts_keeps_the_chains_before(monkeypatch):
    """Chains one after another: Ctrl-C while the second chain starts keeps the first whole."""
    _interrupt_step(monkeypatch, at=2, where="init")
    with pytest.raises(RunInterrupted, match="interrupted at step 0 of chain 1") as info:
        bdl.fit(mean_model(Y), backend="pyro", method="nuts", **dict(NUTS, num_chains=2))
    assert info.value.partial.samples["mu"].shape == (1, 100)


def test_ctrl_c_in_the_step_size_pilot_is_not_swallowed(monkeypatch):
    """step_size='auto' runs pilots first: Ctrl-C there stops the fit (it used to count as an
    unstable pilot, and the fit went on)."""
    _interrupt_chunks(monkeypatch, "pyro", at=1)
    with pytest.raises(RunInterrupted, match="step-size pilot") as info:
        bdl.fit(mean_model(Y), backend="pyro", method="sgld", step_size="auto", **NUTS)
    assert info.value.partial is None


@bdl.model
def normal_gamma(y):
    prec = bdl.sample("prec", dist.Gamma(2.0, 2.0))
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0 / bdl.math.sqrt(prec)), obs=y[idx])


def test_cavi_interrupted_keeps_its_factors(monkeypatch):
    """Ctrl-C at CAVI's third sweep: the factors after the second, drawn from, in partial."""
    backend = bdl.backends.get("numpyro", "float64")
    original, calls = type(backend).jit, {"n": 0}

    def jit(self, fn, *args, **kwargs):
        compiled = original(self, fn, *args, **kwargs)
        if getattr(fn, "__name__", "") != "sweep":
            return compiled

        def counted(*a, **k):
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt
            return compiled(*a, **k)

        return counted

    monkeypatch.setattr(type(backend), "jit", jit)
    with pytest.raises(RunInterrupted, match="CAVI was interrupted at sweep 2") as info:
        bdl.fit(
            normal_gamma(Y),
            backend="numpyro",
            method="cavi",
            num_samples=10,
            precision="float64",
            progress=False,
        )
    partial = info.value.partial
    assert partial.losses.shape == (2,) and partial.samples["mu"].shape == (1, 10)


ENSEMBLE = dict(method="ensemble", num_members=3, num_steps=40, lr=0.05, chunk_size=20)


def test_ensemble_interrupted_keeps_the_members_done():
    """Members one after another (Pyro): Ctrl-C in the second member's first chunk keeps the
    first member as fitted, and the second at its start."""
    whole = bdl.fit(mean_model(Y), backend="pyro", progress=False, **ENSEMBLE)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _interrupt_chunks(monkeypatch, "pyro", at=3)
        with pytest.raises(RunInterrupted, match="ensemble was interrupted") as info:
            bdl.fit(mean_model(Y), backend="pyro", progress=False, **ENSEMBLE)
    partial = info.value.partial
    assert partial.settings["members"] == [0, 1]
    np.testing.assert_array_equal(partial.samples["mu"][0], whole.samples["mu"][0])


SGLD = dict(method="sgld", step_size=1e-3, num_warmup=0, num_samples=60, chunk_size=50)


def _partial(monkeypatch, at: int, **kw):
    clear_programs()  # each fit compiles its loop anew, through the stand-in
    with monkeypatch.context() as patch:
        _interrupt_chunks(patch, "pyro", at)
        with pytest.raises(RunInterrupted) as info:
            bdl.fit(mean_model(Y), backend="pyro", progress=False, **kw)
    return info.value


def test_an_executor_keeps_what_the_run_in_one_process_keeps(monkeypatch):
    """Three chains one after another, Ctrl-C in the third chain's second chunk (it has 50 of
    its 60 draws): in one process and through InProcessExecutor (one chain per group) the
    partial is the same, the three chains cut to 50 draws (150 draws, more than the two
    finished chains' 120); the executor's error is an ExecutorInterrupted naming them."""
    here = _partial(monkeypatch, 6, num_chains=3, **SGLD)
    grouped = _partial(
        monkeypatch, 6, num_chains=3, executor=bdl.InProcessExecutor(chains_per_task=1), **SGLD
    )
    assert isinstance(grouped, ExecutorInterrupted)
    assert grouped.finished == [0, 1] and grouped.kept == [0, 1, 2]
    assert [(f.chains, f.reason) for f in grouped.failed] == [([2], "interrupted")]
    assert here.partial.samples["mu"].shape == (3, 50)
    np.testing.assert_array_equal(grouped.partial.samples["mu"], here.partial.samples["mu"])


def test_one_chain_through_an_executor_keeps_its_draws(monkeypatch):
    """One chain, one group, interrupted part-way: its draws so far are error.partial (they
    were dropped: no group had finished)."""
    executor = bdl.InProcessExecutor()
    error = _partial(monkeypatch, 2, num_chains=1, executor=executor, **SGLD)
    assert error.finished == [] and error.partial.samples["mu"].shape == (1, 50)
