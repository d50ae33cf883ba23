"""``RayExecutor``: the chains of a fit as Ray tasks on a Ray cluster (``pip install
"ppl_bdl[ray]"``; Ray is imported when a fit first uses it, never by ``import ppl_bdl``).

What goes where: the bound model (its function and its data on the host) is put once into
Ray's object store (``ray.put``) and every task reads it from there; each task is one group of
chains, ``fit(..., chain_ids=group)`` in a worker process pinned to the resources asked
(``resources={"num_gpus": 1}``), and sends back the posterior of its chains
(:func:`ppl_bdl.posterior.chains.detach`: draws, sample stats and the pointwise
log-likelihood); :func:`ppl_bdl.run.executor.run_job` merges them into the posterior the run in one
process gives with the same seed.

Faults: a task whose worker process dies (killed, out of memory, its node lost) is run again by
Ray from the start, up to ``max_retries`` times; since a chain's draws depend only on the seed
and its number, the retried draws are those an unfailed run gives. A task that still fails, or
whose fit fails (a non-finite step), comes back as a failed group. Ctrl-C interrupts the
running tasks (``ray.cancel(force=False)`` raises KeyboardInterrupt in each, which keeps its
draws so far and sends them back) and cancels those not started; a task that has not come back
within :data:`~ppl_bdl.run.executor.INTERRUPT_GRACE_SECONDS` (or at a second Ctrl-C) is
stopped. Either way the fit raises :class:`~ppl_bdl.run.executor.ExecutorError` (after Ctrl-C
an :class:`~ppl_bdl.run.executor.ExecutorInterrupted`) naming the groups that did not finish,
with what the run kept in ``error.partial``.
"""

from __future__ import annotations

import importlib.util
import math
import time
from typing import Any

from ppl_bdl.errors import BackendError, ConfigError, RunInterrupted
from ppl_bdl.inference.loop.driver import progress_bar
from ppl_bdl.run.executor import (
    INTERRUPT_GRACE_SECONDS,
    ChainJob,
    GroupResult,
    check_chains_per_task,
    portable_options,
    run_detached,
    say_waiting,
    split_chains,
)

#: Keys of ``resources`` that are Ray's own task options; any other key is a custom resource.
TASK_RESOURCES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
#: Seconds between checks for finished tasks (Ctrl-C is seen between them).
POLL_SECONDS = 0.2
#: Ray's errors that mean the worker (or its node) died, not that the fit failed.
_DIED = (
    "WorkerCrashedError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "OutOfMemoryError",
    "ObjectLostError",
    "OwnerDiedError",
)


class RayExecutor:
    """Runs a fit's chains as Ray tasks: ``fit(..., executor=RayExecutor(...))``.

    Parameters
    ----------
    address : str, optional
        The cluster to join, as ``ray.init`` reads it: None is Ray's default (the cluster named
        by ``RAY_ADDRESS``, else one started on this machine with ``ray start``, else a new
        local Ray); ``"auto"`` joins the cluster started on this machine (``ray start
        --head`` or ``ray start --address=...``) and fails if there is none;
        ``"ray://host:10001"`` a remote one through Ray Client. If this process has already
        called ``ray.init``, that Ray is used whatever the address.
    resources : dict, optional
        What each task asks for: ``num_cpus``, ``num_gpus``, ``memory`` (bytes), and custom
        resources by name (default ``{"num_cpus": 1}``). With ``num_gpus`` and no ``device=``
        given to ``fit``, the tasks run on the GPU Ray gives them (``device="cuda"``).
    max_retries : int
        How many times a task whose worker died is run again (default 2).
    chains_per_task : int, optional
        Chains per task (run side by side in the task where the backend vectorises chains).
        None: the chains are spread evenly over as many tasks as the cluster can run at once
        with ``resources``.
    runtime_env : dict, optional
        Ray's runtime environment for the workers (e.g. ``{"working_dir": "."}`` so that they
        can import the module that defines the model), used when this executor starts or joins
        Ray.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.RayExecutor(resources={"num_cpus": 1}, max_retries=2)
    RayExecutor(address=None, resources={'num_cpus': 1}, max_retries=2, chains_per_task=None)
    """

    def __init__(
        self,
        address: str | None = None,
        resources: dict | None = None,
        max_retries: int = 2,
        chains_per_task: int | None = None,
        runtime_env: dict | None = None,
    ):
        if address is not None and not isinstance(address, str):
            raise ConfigError(
                f"address must be None (a local Ray), 'auto' (the cluster on this machine) or a "
                f"cluster address such as 'ray://host:10001', got {address!r}."
            )
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise ConfigError(f"runtime_env must be a dict or None, got {runtime_env!r}.")
        if importlib.util.find_spec("ray") is None:
            raise BackendError(
                'RayExecutor needs Ray, which is not installed: pip install "ppl_bdl[ray]" '
                "(or pip install ray). Without it, leave executor out: the chains run here."
            )
        self.address = address
        self.resources = _check_resources({"num_cpus": 1} if resources is None else resources)
        self.max_retries = max_retries
        self.chains_per_task = check_chains_per_task(chains_per_task)
        self.runtime_env = runtime_env

    def __repr__(self) -> str:
        return (
            f"RayExecutor(address={self.address!r}, resources={self.resources!r}, "
            f"max_retries={self.max_retries}, chains_per_task={self.chains_per_task})"
        )

    def run(self, job: ChainJob) -> list[GroupResult]:
        """Run ``job``'s groups of chains as Ray tasks; one :class:`GroupResult` per group."""
        options = self._task_options(job.options)
        ray = self._connect()
        per_task = self.chains_per_task or math.ceil(len(job.chains) / self._slots(ray))
        groups = split_chains(job.chains, per_task)
        bound = ray.put(job.bound)  # the data, once, into the object store
        ask = {key: value for key, value in self.resources.items() if key in TASK_RESOURCES}
        custom = {key: value for key, value in self.resources.items() if key not in ask}
        task = ray.remote(run_task).options(
            max_retries=self.max_retries, retry_exceptions=False, resources=custom or None, **ask
        )
        refs = {task.remote(bound, group, options, job.run): i for i, group in enumerate(groups)}
        return self._collect(ray, refs, groups, job.progress)

    def _connect(self):
        import ray  # an optional extra: imported when a fit first uses it

        if not ray.is_initialized():
            ray.init(
                address=self.address,
                runtime_env=self.runtime_env,
                include_dashboard=False,
                logging_level="WARNING",
            )
        return ray

    def _task_options(self, options: dict) -> dict:
        """The fit's options as a task gets them: the device of the task's GPU, and a
        posterior given as ``init`` without its model (its draws are what ``init`` reads)."""
        options = dict(options)
        device, gpus = options.get("device"), self.resources.get("num_gpus", 0)
        if isinstance(device, str) and device.startswith("cuda") and not gpus:
            raise ConfigError(
                f"device={device!r} but the executor's resources {self.resources} ask for no GPU, "
                "so Ray gives the tasks none. Add 'num_gpus' to the resources, e.g. "
                "RayExecutor(resources={'num_gpus': 1})."
            )
        if device is None and gpus:
            options["device"] = "cuda"
        return portable_options(options)

    def _slots(self, ray) -> int:
        """How many tasks with ``resources`` the cluster can run at once."""
        total = ray.cluster_resources()
        slots = []
        for key, amount in self.resources.items():
            if amount <= 0:
                continue
            have = total.get(TASK_RESOURCES.get(key, key), 0.0)
            if have < amount:
                raise ConfigError(
                    f"resources: each task asks {key}={amount}, but the Ray cluster has "
                    f"{have:g} in all ({_listing(total)}), so no task could start. Ask for less, "
                    "or join a cluster that has it (address='auto' or 'ray://...')."
                )
            slots.append(int(have // amount))
        return max(1, min(slots, default=1))

    def _collect(self, ray, refs: dict, groups: list, progress: bool) -> list[GroupResult]:
        """Wait for the tasks; on Ctrl-C interrupt the running ones (each sends back the draws
        it kept), cancel those not started, and stop what has not come back after
        :data:`INTERRUPT_GRACE_SECONDS` (or at a second Ctrl-C)."""
        results: dict[int, GroupResult] = {}
        bar = progress_bar(sum(len(g) for g in groups), "chains (Ray tasks)") if progress else None
        pending = dict(refs)
        try:
            try:
                self._wait(ray, pending, results, groups, bar)
            except KeyboardInterrupt:
                for ref in pending:  # Ctrl-C inside the task; one not started is cancelled
                    ray.cancel(ref, force=False)
                say_waiting(len(pending), "Ray tasks")
                try:
                    self._wait(ray, pending, results, groups, bar, INTERRUPT_GRACE_SECONDS)
                except KeyboardInterrupt:  # a second Ctrl-C: stop them now
                    pass
                for ref, i in pending.items():
                    ray.cancel(ref, force=True)
                    results[i] = GroupResult(
                        groups[i],
                        reason="cancelled",
                        message="interrupted (Ctrl-C); its Ray task was stopped",
                    )
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in range(len(groups))]

    def _wait(self, ray, pending: dict, results: dict, groups: list, bar, within=None) -> None:
        """Collect tasks from ``pending`` as they finish, until none is left (or ``within``
        seconds have passed)."""
        end = None if within is None else time.monotonic() + within
        while pending and (end is None or time.monotonic() < end):
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                i = pending.pop(ref)
                results[i] = _result(ray, ref, groups[i], self.max_retries)
                if bar is not None:
                    bar.update(len(groups[i]))


def run_task(bound: Any, group: list[int], options: dict, run) -> GroupResult:
    """A Ray task: fit the chains ``group`` in this worker and send back what came of it (the
    posterior, or the failure with the draws kept before it, both without the model)."""
    return run_detached(ChainJob(bound, group, options, run), group)


def _result(ray, ref, group: list[int], retries: int) -> GroupResult:
    """A finished task's :class:`GroupResult`, or its group's failure named by Ray's error."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError as err:
        return GroupResult(
            group, reason="cancelled", message="its Ray task was cancelled", error=err
        )
    except ray.exceptions.RayError as err:
        if type(err).__name__ in _DIED:
            return GroupResult(
                group,
                reason="worker died",
                error=err,
                message=(
                    f"its Ray worker died and the task failed after {retries} retr"
                    f"{'y' if retries == 1 else 'ies'} ({type(err).__name__}: {_first_line(err)})"
                ),
            )
        cause = getattr(err, "cause", None)
        if isinstance(cause, RunInterrupted | KeyboardInterrupt):
            partial = getattr(cause, "partial", None)
            return GroupResult(
                group, reason="interrupted", message="interrupted", partial=partial, error=err
            )
        shown = (
            f"{type(cause).__name__}: {cause}"
            if isinstance(cause, BaseException)
            else (f"{type(err).__name__}: {_first_line(err)}")
        )
        return GroupResult(group, reason="error", message=shown, error=err)


def _check_resources(resources: Any) -> dict:
    if not isinstance(resources, dict) or not resources:
        raise ConfigError(
            f"resources must be a non-empty dict such as {{'num_cpus': 1}} or {{'num_gpus': 1}}, "
            f"got {resources!r}."
        )
    for key, value in resources.items():
        if not isinstance(key, str):
            raise ConfigError(f"resources: keys are resource names (str), got {key!r}.")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ConfigError(
                f"resources[{key!r}] must be a number >= 0 (a fraction shares a GPU), got {value!r}."
            )
    return dict(resources)


def _listing(total: dict) -> str:
    shown = {k: v for k, v in total.items() if not k.startswith(("node:", "object_store"))}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "nothing"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
