"""The executor layer without Ray: groups of chains merged into the run in one process, the
merge's checks, what a failed or interrupted group becomes, and the settings' errors; the
worker processes of :class:`~ppl_bdl.run.process_executor.DeviceExecutor` (one per device): a
worker that dies, retried or named, and Ctrl-C."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import RunInterrupted
from ppl_bdl.posterior.chains import detach, merge_chains
from ppl_bdl.run import process_executor, ray_executor
from ppl_bdl.run.executor import ChainJob, ExecutorError, GroupResult, run_job, split_chains
from ppl_bdl.run.process_executor import DeviceExecutor
from ppl_bdl.trace.programs import clear_programs


@pytest.fixture(autouse=True)
def _fresh_programs():
    """The tests here stand in for a backend's loop or sampler: no program cached by an earlier
    fit of the same model may skip them."""
    clear_programs()
    yield
    clear_programs()


@bdl.model
def regression(x, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2))
    return x, x @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=n)


KW = dict(
    method="sghmc",
    num_warmup=30,
    num_samples=20,
    num_chains=4,
    seed=3,
    step_size=1e-3,
    batch_size=16,
    progress=False,
)


def _fit(backend, **kw):
    with warnings.catch_warnings():  # 20 draws: the ESS check says so
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        return bdl.fit(regression(*_data()), backend=backend, **dict(KW, **kw))


def test_groups_of_chains_merge_into_the_run_in_one_process(backend):
    """One chain per group, one after another: the samples, stats, the pointwise
    log-likelihood (joined when first read), settings and diagnostics of the whole run.

    Bit for bit where the backend runs chains one after another (Pyro); to float32 round-off
    where it vectorises them (NumPyro: three chains side by side and one alone are two compiled
    programs, which XLA may fuse differently; measured: 3 of 120 numbers 1 ulp apart)."""
    whole = _fit(backend, num_chains=3)
    grouped = _fit(backend, num_chains=3, executor=bdl.InProcessExecutor(chains_per_task=1))
    vectorised = bdl.backends.get(backend).vectorized_chains
    same = np.testing.assert_allclose if vectorised else np.testing.assert_array_equal
    tolerance = dict(rtol=1e-5, atol=1e-6) if vectorised else {}
    for name in whole.samples:
        same(grouped.samples[name], whole.samples[name], **tolerance)
    for name in whole.sample_stats:
        same(grouped.sample_stats[name], whole.sample_stats[name], **tolerance)
    assert "over 3 parts" in repr(grouped.log_likelihood)
    same(grouped.log_likelihood["y"], whole.log_likelihood["y"], **tolerance)
    assert grouped.settings == whole.settings
    found = [(f.kind, f.sites) for f in grouped.diagnostics]
    assert found == [(f.kind, f.sites) for f in whole.diagnostics]
    for a, b in zip(grouped.diagnostics, whole.diagnostics, strict=True):
        assert a.value == pytest.approx(b.value, rel=1e-4), (a, b)
    # what a worker sends back pickles; a bound model is pickled without its caches (its
    # function by value where Ray's cloudpickle sends it: tests/test_ray_executor.py)
    back = pickle.loads(pickle.dumps(detach(grouped)))
    np.testing.assert_array_equal(back.log_likelihood["y"], grouped.log_likelihood["y"])
    assert whole.model._converted and whole.model.model.compiled is not None
    assert whole.model.__getstate__()["_converted"] == {}
    assert whole.model.model.__getstate__()["compiled"] == {}


def test_merge_refuses_what_is_not_chains_of_one_fit():
    a = _fit("pyro", num_chains=1, log_likelihood=False)
    b = _fit("pyro", num_chains=1, num_samples=10, log_likelihood=False)
    with pytest.raises(ValueError, match="with 10 draws per chain"):
        merge_chains([a, b])
    with warnings.catch_warnings():  # 10 steps: far from converged, and said so
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        vi = bdl.fit(
            regression(*_data()),
            backend="pyro",
            method="vi",
            num_steps=10,
            num_samples=20,
            progress=False,
            log_likelihood=False,
        )
    with pytest.raises(ValueError, match="merge_chains joins the chains of MCMC fits"):
        merge_chains([a, vi])
    with pytest.raises(ValueError, match="at least one"):
        merge_chains([])


class _OneGroupFails:
    """An executor whose second group fails (as a task whose worker died would)."""

    def run(self, job):
        groups = split_chains(job.chains, 2)
        ok = GroupResult(groups[0], posterior=job.run(job.bound, groups[0], job.options))
        return [ok, GroupResult(groups[1], reason="worker died", message="killed")]


def test_a_failed_group_is_named_and_the_finished_chains_kept():
    with pytest.raises(
        ExecutorError,
        match=r"1 of 2 groups of chains failed:\n- chains \[2, 3\]: "
        r"worker died: killed",
    ) as info:
        _fit("numpyro", executor=_OneGroupFails())
    error = info.value
    assert error.finished == [0, 1] and not error.interrupted
    whole = _fit("numpyro")
    np.testing.assert_array_equal(error.partial.samples["w"], whole.samples["w"][:2])


def test_ctrl_c_in_process_stops_at_the_group_it_interrupts(backend, monkeypatch):
    """Ctrl-C in the second group's first chunk: the first group's chains are kept, the rest
    named as cancelled."""
    be = bdl.backends.get(backend)
    original, calls = type(be).compile_loop, {"n": 0}
    # the first group's chunks: 2 chunks of 25 steps, for each chain on a backend without vmap
    interrupt_at = 3 if be.vectorized_chains else 5

    def compile_loop(self, step, emit):
        runner = original(self, step, emit)

        def counted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == interrupt_at:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return counted

    monkeypatch.setattr(type(be), "compile_loop", compile_loop)
    with pytest.raises(ExecutorError, match="interrupted") as info:
        _fit(backend, chunk_size=25, executor=bdl.InProcessExecutor(chains_per_task=2))
    monkeypatch.undo()
    error = info.value
    assert error.interrupted and error.finished == [0, 1] and isinstance(error, RunInterrupted)
    assert [(f.chains, f.reason) for f in error.failed] == [([2, 3], "interrupted")]
    np.testing.assert_array_equal(error.partial.samples["w"], _fit(backend).samples["w"][:2])


def test_executor_settings_are_checked(monkeypatch):
    with pytest.raises(bdl.ConfigError, match="does not apply to method='vi'"):
        bdl.fit(regression(*_data()), method="vi", executor="ray")
    with pytest.raises(bdl.ConfigError, match=r"chain_ids=\[1\] does not apply to method='vi'"):
        bdl.fit(regression(*_data()), method="vi", chain_ids=[1])
    with pytest.raises(bdl.ConfigError, match="the one name an executor goes by is 'ray'"):
        _fit("numpyro", executor="dask")
    with pytest.raises(bdl.ConfigError, match="a run\\(job\\) method"):
        _fit("numpyro", executor=object())
    with pytest.raises(bdl.ConfigError, match="chains_per_task must be"):
        bdl.InProcessExecutor(chains_per_task=0)
    with pytest.raises(bdl.ConfigError, match="max_retries must be"):
        bdl.RayExecutor(max_retries=-1)
    with pytest.raises(bdl.ConfigError, match=r"resources\['num_gpus'\] must be a number"):
        bdl.RayExecutor(resources={"num_gpus": "one"})
    with pytest.raises(bdl.ConfigError, match="chain_ids must be"):  # checked before any task
        _fit("numpyro", chain_ids=[4], executor=bdl.InProcessExecutor())
    monkeypatch.setattr(ray_executor.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(bdl.BackendError, match=r'pip install "ppl_bdl\[ray\]"'):
        bdl.RayExecutor()


def test_run_job_with_a_job_of_its_own():
    """The protocol as a third party would use it: a job whose run is any function."""
    seen = []

    def run(bound, group, options):
        seen.append(group)
        return bdl.fit(bound, chain_ids=group, **options)

    options = dict(KW, backend="numpyro", log_likelihood=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        post = run_job(
            bdl.InProcessExecutor(chains_per_task=3),
            ChainJob(regression(*_data()), [0, 1, 2, 3], options, run),
        )
    assert seen == [[0, 1], [2, 3]] and post.samples["w"].shape == (4, 20, 2)


# -- one worker process per device ---------------------------------------------------------------
def _draws(group: list[int]) -> bdl.Posterior:
    """A posterior of ``group``'s chains made without a fit: each chain's draws from its number."""
    draws = np.stack([np.random.default_rng(c).normal(size=20) for c in group])
    return bdl.Posterior(samples={"x": draws}, method="sgld", settings={"seed": 3})


def _faulty(bound, group, options):
    """A worker's run (in its own process): the group holding chain 2 dies (SIGKILL) once
    (``FAULT=once``: the marker ``FAULT_MARKER`` says it did), always (``always``), waits to
    be interrupted (``stall``: Ctrl-C ends it without draws; ``keep``: it keeps 15 draws, as a
    fit does); every other group's draws come back."""
    mode, marker = os.environ["FAULT"], Path(os.environ["FAULT_MARKER"])
    if 2 in group and mode in ("stall", "keep"):
        (marker.parent / "waiting").touch()  # started: a Ctrl-C now reaches the run
    if 2 in group and mode == "stall":
        time.sleep(300)  # the caller interrupts this process long before
    if 2 in group and mode == "keep":
        try:
            time.sleep(300)
        except KeyboardInterrupt:
            kept = _draws(group)
            kept.samples["x"] = kept.samples["x"][:, :15]
            raise RunInterrupted("interrupted", partial=kept) from None
    if 2 in group and (mode == "always" or not marker.exists()):
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return _draws(group)


def test_a_module_level_model_pickles_by_reference(monkeypatch):
    """How a job reaches a worker process where cloudpickle is not installed (a fresh install):
    ``@bdl.model`` at a module's top level pickles by reference, as a function does (the
    module's name holds the model, so its function cannot be found under that name)."""
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # import cloudpickle fails
    bound = pickle.loads(process_executor._dumps(regression(*_data())))
    assert bound.model is regression
    np.testing.assert_array_equal(bound.args[0], _data()[0])

    def local(y):
        bdl.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises((pickle.PicklingError, AttributeError), match="local"):
        process_executor._dumps(bdl.model(local))  # made in a function: by value, as pickle can


def _workers(monkeypatch, tmp_path, mode: str, retries: int = 0):
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # plain pickle, as on a fresh install
    monkeypatch.setenv("FAULT", mode)
    monkeypatch.setenv("FAULT_MARKER", str(tmp_path / "died"))
    job = ChainJob(regression(*_data()), [0, 1, 2, 3], {}, _faulty)
    return run_job(DeviceExecutor(["cpu", "cpu"], max_retries=retries), job)


def test_worker_processes_merge_their_groups_and_a_dead_worker_is_retried(monkeypatch, tmp_path):
    """Two worker processes, chains [0, 1] and [2, 3]; the second dies once and is started
    again (its draws depend only on its chains): the merged draws are every chain's."""
    post = _workers(monkeypatch, tmp_path, "once", retries=1)
    assert (tmp_path / "died").exists(), "no worker died: the test did not test a fault"
    np.testing.assert_array_equal(post.samples["x"], _draws([0, 1, 2, 3]).samples["x"])


def test_a_worker_that_still_dies_is_named_with_the_chains_that_finished(monkeypatch, tmp_path):
    with pytest.raises(
        ExecutorError,
        match=r"1 of 2 groups of chains failed:\n- chains \[2, 3\]: "
        r"worker died: .* on cpu .*killed by signal 9\) after 0 retries",
    ) as info:
        _workers(monkeypatch, tmp_path, "always")
    error = info.value
    assert error.finished == [0, 1] and not error.interrupted
    np.testing.assert_array_equal(error.partial.samples["x"], _draws([0, 1]).samples["x"])


def _ctrl_c_once_the_first_group_is_back(monkeypatch, tmp_path, mode: str):
    """Run the workers in ``mode`` with Ctrl-C in the parent's wait once the first group's
    result is there; the error and the workers."""
    real_sleep, workers, pressed = time.sleep, [], []
    start = process_executor._Worker.start

    def started(self):
        start(self)
        workers.append(self)

    def sleep(seconds):  # Ctrl-C in the wait, once the first group's result is there and the
        # second group's run waits (a worker still importing is stopped, its group cancelled)
        waiting = (tmp_path / "waiting").exists()
        if not pressed and waiting and workers and workers[0].out.exists():
            pressed.append(True)
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(process_executor._Worker, "start", started)
    monkeypatch.setattr(process_executor.time, "sleep", sleep)
    with pytest.raises(RunInterrupted, match="interrupted") as info:
        _workers(monkeypatch, tmp_path, mode)
    monkeypatch.undo()
    assert workers[1].process.returncode is not None  # ended, not left running
    return info.value


def test_ctrl_c_interrupts_the_workers_and_keeps_the_groups_finished(monkeypatch, tmp_path):
    """Ctrl-C once the first group came back (the second waits): the second worker is
    interrupted and named, the first group's chains are in error.partial."""
    error = _ctrl_c_once_the_first_group_is_back(monkeypatch, tmp_path, "stall")
    assert isinstance(error, ExecutorError) and error.interrupted and error.finished == [0, 1]
    assert [(f.chains, f.reason) for f in error.failed] == [([2, 3], "interrupted")]
    np.testing.assert_array_equal(error.partial.samples["x"], _draws([0, 1]).samples["x"])


def test_ctrl_c_in_a_worker_sends_back_the_draws_it_kept(monkeypatch, tmp_path):
    """The interrupted worker keeps 15 of its 20 draws (as a fit does) and sends them back:
    they are its group's partial, and error.partial holds all four chains cut to 15 draws
    (60 draws, more than the 40 of the finished group alone), as the run in one process."""
    error = _ctrl_c_once_the_first_group_is_back(monkeypatch, tmp_path, "keep")
    (stopped,) = error.failed
    assert stopped.reason == "interrupted" and stopped.partial.num_draws == 15
    assert error.finished == [0, 1] and error.kept == [0, 1, 2, 3]
    np.testing.assert_array_equal(
        error.partial.samples["x"], _draws([0, 1, 2, 3]).samples["x"][:, :15]
    )


def test_device_executor_settings_are_checked():
    with pytest.raises(bdl.ConfigError, match="devices must be a non-empty list"):
        DeviceExecutor([])
    with pytest.raises(bdl.ConfigError, match="max_retries must be"):
        DeviceExecutor(["cpu"], max_retries=-1)
