"""Executors: where the chains of a fit run, a layer above the loop.

``fit(..., executor=...)`` hands the fit's chains to an executor as a :class:`ChainJob`; the
executor runs them in groups, each group one ``fit(..., chain_ids=group)`` (a chain's draws
depend only on the seed and its number, never on where it ran or which chains ran beside it),
and hands back a :class:`GroupResult` per group. :func:`run_job` is the one place that turns
those into the fit's result: the groups' posteriors merged along the chain axis
(:func:`ppl_bdl.posterior.chains.merge_chains`, identical to the run in one process with the
same seed), or, when a group failed or the run was interrupted, an :class:`ExecutorError` that
names the groups that did not finish and carries what the run kept (``error.partial``: the
chains that finished and the draws the stopped groups kept, as the run in one process keeps
them).

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
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.loop.driver import most_draws
from ppl_bdl.posterior.chains import detach, merge_chains
from ppl_bdl.posterior.posterior import Posterior

#: Seconds an executor waits, after Ctrl-C, for its interrupted workers to send back the draws
#: they kept (a second Ctrl-C stops them at once).
INTERRUPT_GRACE_SECONDS = 30.0


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
    "error", "worker died", "interrupted" (Ctrl-C stopped it part-way) or "cancelled" (stopped
    before it ran, or its worker was stopped); ``message`` says what happened) with what it
    kept before (``partial``, where it kept anything: the draws so far)."""

    chains: list[int]
    posterior: Posterior | None = None
    reason: str = ""
    message: str = ""
    partial: Posterior | None = None
    error: BaseException | None = field(default=None, repr=False)


class Executor(Protocol):
    """Runs the groups of chains of a :class:`ChainJob`; one :class:`GroupResult` per group, in
    the order of the job's chains. A failed group is a result (never dropped); Ctrl-C stops the
    run: a group it stopped part-way comes back with reason "interrupted" and its draws so far
    (``partial``), the groups not started (or whose worker was stopped) with "cancelled"."""

    def run(self, job: ChainJob) -> list[GroupResult]: ...


class ExecutorError(InferenceError):
    """Some groups of chains did not finish: ``failed`` lists them (:class:`GroupResult`),
    ``finished`` the numbers of the chains that finished, ``partial`` a Posterior of what the
    run kept (None if nothing): the chains that finished and the draws the stopped groups kept,
    cut to the common length that keeps the most draws (as the run in one process keeps them;
    ``kept``: its chains' numbers, in order); ``interrupted`` says whether Ctrl-C stopped the
    run (the error is then an :class:`ExecutorInterrupted`, a
    :class:`~ppl_bdl.errors.RunInterrupted`)."""

    def __init__(
        self, message: str, partial=None, failed=(), finished=(), interrupted=False, kept=()
    ):
        super().__init__(message, partial=partial)
        self.failed = list(failed)
        self.finished = list(finished)
        self.interrupted = interrupted
        self.kept = list(kept)


class ExecutorInterrupted(ExecutorError, RunInterrupted):
    """Ctrl-C stopped a run of groups of chains: ``except RunInterrupted`` catches it as it
    catches the same run in one process; the attributes are :class:`ExecutorError`'s."""


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
    group's failure (an :class:`~ppl_bdl.errors.InferenceError`: a non-finite step; or Ctrl-C,
    reason "interrupted") with the draws it kept. Every other error propagates."""
    try:
        post = job.run(job.bound if bound is None else bound, group, job.options)
    except RunInterrupted as err:
        return GroupResult(
            group, reason="interrupted", message=str(err), partial=err.partial, error=err
        )
    except KeyboardInterrupt as err:  # landed outside the loop (e.g. while setting up)
        return GroupResult(group, reason="interrupted", message="interrupted (Ctrl-C)", error=err)
    except InferenceError as err:
        return GroupResult(group, reason="error", message=str(err), partial=err.partial, error=err)
    return GroupResult(group, posterior=post)


def say_waiting(count: int, what: str) -> None:
    """Tell the user, after Ctrl-C, that ``count`` workers are asked for their draws."""
    if count:
        print(
            f"Interrupted: waiting up to {INTERRUPT_GRACE_SECONDS:g} s for {count} {what} to send "
            "back the draws they kept (Ctrl-C again to stop them now).",
            file=sys.stderr,
        )


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
        kind = RunInterrupted if result.reason == "interrupted" else InferenceError
        result.error = kind(str(result.error) or result.message)
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
            results.append(run_group(job, group))
            if results[-1].reason == "interrupted":
                break
        return results + [
            GroupResult(g, reason="cancelled", message="not started: the run was interrupted")
            for g in groups[len(results) :]
        ]

    def __repr__(self) -> str:
        return f"InProcessExecutor(chains_per_task={self.chains_per_task})"


def run_job(executor: Executor, job: ChainJob) -> Posterior:
    """Run ``job`` on ``executor``: the merged posterior of every chain (its diagnostics
    computed on the merged chains), or an :class:`ExecutorError` (after Ctrl-C an
    :class:`ExecutorInterrupted`) naming each group that did not finish, with what the run
    kept in ``error.partial``."""
    results = executor.run(job)
    done = [r for r in results if r.posterior is not None]
    failed = [r for r in results if r.posterior is None]
    if not failed:
        return merge_chains([r.posterior for r in done], model=job.bound)
    finished = [c for r in done for c in r.chains]
    partial, kept = kept_posterior(results, job.bound)
    interrupted = any(r.reason in ("interrupted", "cancelled") for r in failed)
    lines = [f"- chains {r.chains}: {r.reason}: {r.message}" for r in failed]
    head = (
        f"the run was interrupted (Ctrl-C) with {len(failed)} of {len(results)} groups of chains "
        "unfinished:"
        if interrupted
        else f"{len(failed)} of {len(results)} groups of chains failed:"
    )
    kind = ExecutorInterrupted if interrupted else ExecutorError
    error = kind(
        "\n".join([head, *lines, _kept_message(partial, kept, finished)]),
        partial=partial,
        failed=failed,
        finished=finished,
        interrupted=interrupted,
        kept=kept,
    )
    cause = next((r.error for r in failed if r.error is not None), None)
    raise error from cause


def kept_posterior(results: list[GroupResult], model: Any) -> tuple[Posterior | None, list]:
    """What a run that stopped early kept, as the run in one process keeps it: the finished
    groups' chains and the stopped groups' draws (``partial``), cut to the common length that
    keeps the most draws (:func:`~ppl_bdl.inference.loop.driver.most_draws`); and those
    chains' numbers. (None, []) where nothing was kept."""
    parts = [(r.chains, r.posterior or r.partial) for r in results]
    parts = [(chains, post) for chains, post in parts if post is not None and post.samples]
    if not parts:
        return None, []
    lengths = [post.num_draws for _, post in parts for _ in range(post.num_chains)]
    picked, length = most_draws(lengths)
    if not picked:
        return None, []
    owner = [i for i, (_, post) in enumerate(parts) for _ in range(post.num_chains)]
    use = sorted({owner[c] for c in picked})
    parts = [(parts[i][0], _first_draws(parts[i][1], length)) for i in use]
    posts = _alike([post for _, post in parts])
    kept = [c for chains, post in parts for c in chains[: post.num_chains]]
    return merge_chains(posts, model=model), kept


def _first_draws(post: Posterior, length: int) -> Posterior:
    """``post`` with the first ``length`` draws of each chain."""
    if post.num_draws == length:
        return post

    def cut(arrays):
        return {k: np.asarray(v)[:, :length] for k, v in arrays.items()}

    return dataclasses.replace(
        post,
        samples=cut(post.samples),
        sample_stats=cut(post.sample_stats),
        log_likelihood=cut(post.log_likelihood),
    )


def _alike(posts: list[Posterior]) -> list[Posterior]:
    """Parts that :func:`merge_chains` joins: the sample stats every part has, and the losses
    only where every part has them alike (a stopped ensemble's members come without)."""
    stats = set.intersection(*(set(p.sample_stats) for p in posts))
    shapes = {None if p.losses is None else np.shape(p.losses)[1:] for p in posts}
    drop = len(shapes) > 1 or None in shapes
    return [
        dataclasses.replace(
            p,
            sample_stats={k: v for k, v in p.sample_stats.items() if k in stats},
            losses=None if drop else p.losses,
        )
        for p in posts
    ]


def _kept_message(partial: Posterior | None, kept: list[int], finished: list[int]) -> str:
    if partial is None:
        return "Nothing was kept: error.partial is None."
    return (
        f"error.partial holds chains {kept} ({partial.num_draws} draws each; finished whole: "
        f"{finished or 'none'}); each stopped group's own draws, where it kept any, are in "
        "error.failed[i].partial."
    )
