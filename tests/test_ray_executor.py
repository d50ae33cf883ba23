"""``fit(..., executor=RayExecutor(...))`` on a local Ray with two CPUs (one Ray session for the
module): the draws of the run in one process (chains, and an ensemble's members), a worker
killed mid-run and retried from its seed, a task that still fails named with the chains that
finished, Ctrl-C cancelling the tasks; and what the executor hands Ray (address, runtime_env,
each task's resources, the data put once)."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.run.executor import ExecutorError, GroupResult
from ppl_bdl.run.ray_executor import RayExecutor

ray = pytest.importorskip("ray")

DOCS = Path(__file__).resolve().parents[1] / "docs" / "ray.md"

# The models below live in this test module, which Ray's workers cannot import: send them by
# value (what cloudpickle does by itself for a model defined in a user's script).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray with two CPUs for the module (Ray starts in seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


#: Runs of the model in this process, by marker (a worker counts its own).
_RUNS: dict[str, int] = {}
#: The run of the model at which a worker stalls: with the settings below (2 chains per task
#: on Pyro: ~70 runs before the log-likelihood), one of those that replay the kept draws, so
#: the worker dies after all its steps, with its task's work done and lost.
STALL_AT = 30


def _stall_once(marker: str) -> None:
    """The first process to run the model ``STALL_AT`` times (the first to create ``marker``)
    writes its process id there and waits to be killed (the test kills it); every other run
    goes on."""
    _RUNS[marker] = _RUNS.get(marker, 0) + 1
    if _RUNS[marker] < STALL_AT:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    for _ in range(3000):  # the test kills (or interrupts) this process long before
        time.sleep(0.1)  # (short sleeps: Ray's Ctrl-C in a task is seen between them)


@bdl.model
def regression(x, y, marker=None):
    if marker:
        _stall_once(marker)
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


#: The fits in one process that the Ray runs are compared with, by backend (made once).
_HERE: dict = {}


def _here(backend):
    if backend not in _HERE:
        _HERE[backend] = _fit(backend)
    return _HERE[backend]


def _fit(backend, **kw):
    with warnings.catch_warnings():  # 20 draws: the ESS check says so
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        return bdl.fit(
            regression(*_data(), kw.pop("marker", None)), backend=backend, **dict(KW, **kw)
        )


def _same_chains(got, want, chains):
    """Bit for bit on Pyro (chains one after another); on NumPyro to float rounding (a task's
    vectorised XLA program over 2 chains may sum in another order than one over 4)."""
    same = (
        np.testing.assert_array_equal
        if want.backend == "pyro"
        else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    )
    for name in want.samples:
        same(got.samples[name], want.samples[name][chains])
    for name in want.sample_stats:
        same(got.sample_stats[name], want.sample_stats[name][chains])


def _kill_when_stalled(marker: Path, killed: list) -> threading.Thread:
    """A thread that SIGKILLs the worker process that wrote its id to ``marker``."""

    def kill():
        for _ in range(6000):  # up to 300 s: a busy machine starts Ray's workers slowly
            text = marker.read_text() if marker.exists() else ""
            if text:
                os.kill(int(text), signal.SIGKILL)
                killed.append(int(text))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "backend",
    ["pyro", pytest.param("numpyro", marks=pytest.mark.slow)],  # ~50 s: XLA compiles
)
def test_ray_gives_the_draws_of_the_run_in_one_process(local_ray, backend):
    """Two tasks of two chains each, merged: the samples, sample stats, pointwise
    log-likelihood, settings and diagnostics of the same fit in one process (on Pyro through
    the shorthand "ray": the Ray this process started)."""
    executor = "ray" if backend == "pyro" else bdl.RayExecutor(resources={"num_cpus": 1})
    on_ray, here = _fit(backend, executor=executor), _here(backend)
    _same_chains(on_ray, here, slice(None))
    rtol = 0 if backend == "pyro" else 1e-5  # see _same_chains
    np.testing.assert_allclose(on_ray.log_likelihood["y"], here.log_likelihood["y"], rtol=rtol)
    assert on_ray.settings == here.settings
    if backend == "pyro":
        assert on_ray.diagnostics == here.diagnostics
    else:  # the findings' numbers round as the draws do
        assert [(f.kind, f.sites) for f in on_ray.diagnostics] == [
            (f.kind, f.sites) for f in here.diagnostics
        ]
    assert on_ray.model is not None and on_ray.predict(regression(*_data())).mean.shape == (64,)


def test_a_worker_killed_mid_run_is_retried_from_its_seed(local_ray, tmp_path):
    """SIGKILL to the worker of one task after its steps, while it replays its draws (the
    other task runs on): Ray runs the task again from its seed, and its draws are those of a
    run that never failed."""
    marker, killed = tmp_path / "stall", []
    thread = _kill_when_stalled(marker, killed)
    executor = bdl.RayExecutor(resources={"num_cpus": 1}, max_retries=1)
    on_ray = _fit("pyro", executor=executor, marker=str(marker))
    thread.join()
    assert killed, "no worker was killed: the test did not test a fault"
    _same_chains(on_ray, _here("pyro"), slice(None))


def test_a_task_that_still_fails_is_named_with_the_chains_that_finished(local_ray, tmp_path):
    """No retries left: the killed task's chains are named in the error, and error.partial
    holds the other task's chains, as the run in one process draws them."""
    marker, killed = tmp_path / "stall", []
    thread = _kill_when_stalled(marker, killed)
    executor = bdl.RayExecutor(resources={"num_cpus": 1}, max_retries=0, chains_per_task=2)
    with pytest.raises(ExecutorError, match="1 of 2 groups of chains failed") as info:
        _fit("pyro", executor=executor, marker=str(marker))
    thread.join()
    error = info.value
    assert killed and isinstance(error, bdl.InferenceError) and not error.interrupted
    (failed,) = error.failed
    assert failed.reason == "worker died" and "after 0 retries" in failed.message
    assert sorted(error.finished + failed.chains) == [0, 1, 2, 3]
    assert f"chains {failed.chains}: worker died" in str(error)
    _same_chains(error.partial, _here("pyro"), error.finished)


def test_ctrl_c_cancels_the_tasks_and_keeps_those_finished(local_ray, tmp_path, monkeypatch):
    """Ctrl-C while waiting (after the first task came back): the other task is interrupted
    (a KeyboardInterrupt in it: it sends back what it kept) and the error carries the finished
    chains."""
    marker = tmp_path / "stall"  # one task stalls until it is cancelled
    real_wait, seen = ray.wait, []

    def wait(refs, **kw):  # Ctrl-C once, in the first wait after a task came back
        if len(seen) == 1:
            seen.append("Ctrl-C")
            raise KeyboardInterrupt
        ready, rest = real_wait(refs, **kw)
        if ready and not seen:
            seen.append(ready)
        return ready, rest

    monkeypatch.setattr(ray, "wait", wait)
    executor = bdl.RayExecutor(resources={"num_cpus": 1}, chains_per_task=2)
    with pytest.raises(ExecutorError, match="interrupted") as info:
        _fit("pyro", executor=executor, marker=str(marker))
    monkeypatch.undo()
    error = info.value
    assert error.interrupted and len(error.finished) == 2
    assert [f.reason for f in error.failed] == ["interrupted"], error.failed[0].message
    _same_chains(error.partial, _here("pyro"), error.finished)


def test_settings_that_cannot_work_are_named_before_any_task_starts(local_ray):
    with pytest.raises(bdl.ConfigError, match="the Ray cluster has 0 in all"):
        _fit("pyro", executor=bdl.RayExecutor(resources={"num_gpus": 1}), device="cpu")
    with pytest.raises(bdl.ConfigError, match="ask for no GPU"):
        _fit("pyro", executor="ray", device="cuda")


def test_ensemble_members_as_ray_tasks_are_the_members_fitted_here(local_ray):
    """Four members of an anchored ensemble as two Ray tasks of two members, merged: the
    members, their losses at every step, sample stats, settings and findings of the ensemble
    fitted in this process, bit for bit (Pyro: members one after another)."""
    options = dict(
        backend="pyro",
        method="ensemble",
        num_members=4,
        num_steps=40,
        lr=0.02,
        batch_size=16,
        seed=3,
        anchored=["w"],
        progress=False,
    )
    with warnings.catch_warnings():  # 40 steps: the members' losses still fall, and it says so
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        here = bdl.fit(regression(*_data()), **options)
        on_ray = bdl.fit(regression(*_data()), executor=RayExecutor(chains_per_task=2), **options)
    for name in here.samples:
        np.testing.assert_array_equal(on_ray.samples[name], here.samples[name])
    for name in here.sample_stats:
        np.testing.assert_array_equal(on_ray.sample_stats[name], here.sample_stats[name])
    np.testing.assert_array_equal(on_ray.losses, here.losses)
    assert on_ray.settings == here.settings and on_ray.settings["members"] == [0, 1, 2, 3]
    assert on_ray.diagnostics == here.diagnostics


@pytest.mark.parametrize("address", [None, "auto", "ray://head:10001"])
def test_the_executor_hands_ray_its_address_resources_and_runtime_env(monkeypatch, address):
    """What reaches Ray, with Ray's own calls recorded (no cluster needed): ``ray.init`` gets
    the address and runtime_env; each task's options are the retries, Ray's own resources
    (num_cpus, num_gpus, memory) as keywords and the custom ones as ``resources``; the tasks
    are as many as the cluster has room for (here min(4 CPUs / 2, 8 GiB / 1 GiB, 3 disks / 1)
    = 2), each reading the one object the bound model was put as."""
    calls: dict = {"tasks": []}

    class Remote:
        def __init__(self, function):
            calls["function"] = function

        def options(self, **options):
            calls["options"] = options
            return self

        def remote(self, *args):
            calls["tasks"].append(args)
            return len(calls["tasks"])

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.setdefault("init", kw))
    monkeypatch.setattr(
        ray, "cluster_resources", lambda: {"CPU": 4.0, "memory": 2.0**33, "disk": 3.0}
    )
    monkeypatch.setattr(ray, "put", lambda value: calls.setdefault("put", ["ref"]))
    monkeypatch.setattr(ray, "remote", Remote)
    monkeypatch.setattr(
        RayExecutor,
        "_collect",
        lambda self, ray, refs, groups, progress: [
            GroupResult(g, reason="cancelled", message="not run") for g in groups
        ],
    )
    executor = RayExecutor(
        address=address,
        resources={"num_cpus": 2, "memory": 2**30, "disk": 1},
        max_retries=3,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "2"}},
    )
    with pytest.raises(ExecutorError, match="2 groups of chains unfinished"):
        _fit("pyro", executor=executor)
    assert calls["init"] == dict(
        address=address,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "2"}},
        include_dashboard=False,
        logging_level="WARNING",
    )
    assert calls["options"] == dict(
        max_retries=3, retry_exceptions=False, resources={"disk": 1}, num_cpus=2, memory=2**30
    )
    assert [task[1] for task in calls["tasks"]] == [[0, 1], [2, 3]]
    assert all(task[0] is calls["put"] for task in calls["tasks"])  # the data, put once


@pytest.mark.slow  # ~10 s on a quiet machine, and the first test here checks the same
def test_the_ray_page_example_runs_as_written(local_ray):
    """docs/ray.md's example (it asserts the Ray draws equal the in-process ones itself)."""
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    namespace: dict = {}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", bdl.ConvergenceWarning)
        exec(compile(code, "docs/ray.md", "exec"), namespace)
    assert namespace["post"].samples["w"].shape == (4, 300, 3)
