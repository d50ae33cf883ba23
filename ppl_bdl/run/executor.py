"""Executors: where the chains of a fit run, a layer above the loop.

``fit(..., executor=...)`` hands the fit's chains to an executor as a :class:`ChainJob`; the
executor runs them in groups, each group one ``fit(..., chain_ids=group)`` (a chain's draws
depend only on the seed and its number, never on where it ran or which chains ran beside it),
and hands back a :class:`GroupResult` per group. :func:`run_job` is the one place that turns
those into the fit's result: the groups' posteriors merged along the chain axis
(:func:`ppl_bdl.posterior.chains.merge_chains`, identical to the run in one process with the
same seed), or, when a group failed or the run was interrupted, an :class:`ExecutorError` that
names the groups that did not finish and carries the chains that did (``error.partial``).

An executor is any object with ``run(job) -> list[GroupResult]`` (:class:`Executor`).
:class:`InProcessExecutor` runs the groups one after another in this process (the reference
every other executor is checked against); :class:`ppl_bdl.run.ray_executor.RayExecutor` runs them
as Ray tasks on a cluster.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     bdl.sample("y", dist.Normal(mu, 1.0), obs=y)
>>> post = bdl.fit(m(np.array(0.5)), backend="pyro", method="sgld", step_size=0.1,
...                num_warmup=100, num_samples=400, num_chains=2, progress=False,
...                executor=bdl.InProcessExecutor(chains_per_task=1))
>>> post.samples["mu"].shape
(2, 400)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.posterior.chains import detach, merge_chains
from ppl_bdl.posterior.posterior import Posterior


@dataclass(frozen=True)
class ChainJob:
    """The chains of one fit to run: ``run(bound, group, options)`` fits the chains ``group``
    (a list of chain numbers) with the fit's keyword arguments ``options`` and returns their
    :class:`~ppl_bdl.posterior.posterior.Posterior`, without the post-fit checks (they run once, on the
    merged result). ``progress``: whether the fit asked for a progress bar."""

    bound: Any
    chains: list[int]
    options: dict
    run: Callable[[Any, list[int], dict], Posterior]
    progress: bool = False


@dataclass
class GroupResult:
    """What became of one group of chains: its posterior, or why it failed (``reason``:
    "error", "worker died" or "cancelled"; ``message`` says what happened) with what it kept
    before (``partial``, where it kept anything)."""

    chains: list[int]
    posterior: Posterior | None = None
    reason: str = ""
    message: str = ""
    partial: Posterior | None = None
    error: BaseException | None = field(default=None, repr=False)


class Executor(Protocol):
    """Runs the groups of chains of a :class:`ChainJob`; one :class:`GroupResult` per group, in
    the order of the job's chains. A failed group is a result (never dropped); Ctrl-C stops the
    run and the groups not finished come back with reason "cancelled"."""

    def run(self, job: ChainJob) -> list[GroupResult]: ...


class ExecutorError(InferenceError):
    """Some groups of chains did not finish: ``failed`` lists them (:class:`GroupResult`),
    ``partial`` is a Posterior of the chains that finished (None if none did), ``finished``
    their numbers; ``interrupted`` says whether Ctrl-C stopped the run."""

    def __init__(self, message: str, partial=None, failed=(), finished=(), interrupted=False):
        super().__init__(message, partial=partial)
        self.failed = list(failed)
        self.finished = list(finished)
        self.interrupted = interrupted


def split_chains(chains: list[int], per_task: int) -> list[list[int]]:
    """``chains`` in consecutive groups of at most ``per_task``, as equal in size as fit."""
    count = -(-len(chains) // per_task)
    size, extra = divmod(len(chains), count)
    groups, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        groups.append(chains[start:end])
        start = end
    return groups


def check_chains_per_task(value: Any) -> int | None:
    """``chains_per_task`` checked: None (the executor chooses) or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"chains_per_task must be None (the executor spreads the chains over its workers) or "
            f"an int >= 1, got {value!r}."
        )
    return value


def run_group(job: ChainJob, group: list[int], bound: Any = None) -> GroupResult:
    """Run one group of ``job`` (on ``bound``, default the job's): its posterior, or the
    group's failure (an :class:`~ppl_bdl.errors.InferenceError`: a non-finite step) with the
    draws it kept. Ctrl-C and every other error propagate."""
    try:
        post = job.run(job.bound if bound is None else bound, group, job.options)
    except RunInterrupted:
        raise
    except InferenceError as err:
        return GroupResult(group, reason="error", message=str(err), partial=err.partial, error=err)
    return GroupResult(group, posterior=post)


def portable_options(options: dict) -> dict:
    """A job's options as another process gets them: a posterior given as ``init`` without its
    model and pointwise log-likelihood (its draws are what ``init`` reads; the rest holds this
    process's compiled replays)."""
    if isinstance(options.get("init"), Posterior):
        init = dataclasses.replace(options["init"], model=None, log_likelihood={})
        return {**options, "init": init}
    return options


def run_detached(job: ChainJob, group: list[int]) -> GroupResult:
    """A worker's run of ``group`` (a Ray task's, a worker process's): its
    :class:`GroupResult` ready to cross to the calling process (posteriors without the model;
    the error as an :class:`~ppl_bdl.errors.InferenceError` of its message: the original may
    hold this process's compiled replays)."""
    result = run_group(job, group)
    if result.posterior is not None:
        result.posterior = detach(result.posterior)
    if result.partial is not None:
        result.partial = detach(result.partial)
    if result.error is not None:
        result.error = InferenceError(str(result.error))
    return result


class InProcessExecutor:
    """Runs the groups of chains one after another in this process: ``chains_per_task`` chains
    per group (None: all of them in one group, which is what ``fit`` without an executor does).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.InProcessExecutor(chains_per_task=2)
    InProcessExecutor(chains_per_task=2)
    """

    def __init__(self, chains_per_task: int | None = None):
        self.chains_per_task = check_chains_per_task(chains_per_task)

    def run(self, job: ChainJob) -> list[GroupResult]:
        groups = split_chains(job.chains, self.chains_per_task or len(job.chains))
        results: list[GroupResult] = []
        for group in groups:
            try:
                results.append(run_group(job, group))
            except (KeyboardInterrupt, RunInterrupted) as err:
                results += [
                    GroupResult(g, reason="cancelled", message="interrupted (Ctrl-C)", error=err)
                    for g in groups[len(results) :]
                ]
                break
        return results

    def __repr__(self) -> str:
        return f"InProcessExecutor(chains_per_task={self.chains_per_task})"


def run_job(executor: Executor, job: ChainJob) -> Posterior:
    """Run ``job`` on ``executor``: the merged posterior of every chain (its diagnostics
    computed on the merged chains), or an :class:`ExecutorError` naming each group that did not
    finish, with the chains that did in ``error.partial``."""
    results = executor.run(job)
    done = [r for r in results if r.posterior is not None]
    failed = [r for r in results if r.posterior is None]
    if not failed:
        return merge_chains([r.posterior for r in done], model=job.bound)
    finished = [c for r in done for c in r.chains]
    partial = merge_chains([r.posterior for r in done], model=job.bound) if done else None
    interrupted = any(r.reason == "cancelled" for r in failed)
    lines = [f"- chains {r.chains}: {r.reason}: {r.message}" for r in failed]
    kept = (
        f"The {len(finished)} chains that finished ({finished}) are in error.partial"
        if finished
        else "No group of chains finished; error.partial is None"
    )
    head = (
        f"the run was interrupted (Ctrl-C) with {len(failed)} of {len(results)} groups of chains "
        "unfinished:"
        if interrupted
        else f"{len(failed)} of {len(results)} groups of chains failed:"
    )
    error = ExecutorError(
        "\n".join(
            [
                head,
                *lines,
                kept + " (each failed group's own draws, where it kept any, are "
                "in error.failed[i].partial).",
            ]
        ),
        partial=partial,
        failed=failed,
        finished=finished,
        interrupted=interrupted,
    )
    cause = next((r.error for r in failed if r.error is not None), None)
    raise error from cause
