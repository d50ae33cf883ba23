"""``fit``: one call for every inference method, on the backend and device named at fit time.

A fit reads as four steps: **resolve** the method object
(:func:`~ppl_bdl.inference.methods.resolve_method`; its options were checked when it was built)
and where it runs
(:class:`FitRequest`, an executor or none); **prepare** the model on the backend
(:func:`~ppl_bdl.inference.setup.prepare`); **run** the method there, or hand its chains to an
executor in groups; **diagnose** the result, whatever the path (:func:`diagnose`).

Example
-------
>>> from ppl_bdl.run.fit import choose_executor
>>> import ppl_bdl as bdl
>>> choose_executor(None, bdl.NUTS(), FitRequest(backend="pyro", device=["cpu", "cpu"]))
DeviceExecutor(devices=['cpu', 'cpu'], max_retries=0)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.mcmc.methods import CostWarning
from ppl_bdl.inference.method import Method
from ppl_bdl.inference.methods import resolve_method
from ppl_bdl.inference.setup import prepare
from ppl_bdl.posterior.diagnostics import ConvergenceError, ConvergenceWarning, check_fit
from ppl_bdl.posterior.posterior import Posterior
from ppl_bdl.run.executor import ChainJob, run_job
from ppl_bdl.run.process_executor import DeviceExecutor
from ppl_bdl.run.ray_executor import RayExecutor

__all__ = ["CostWarning", "FitRequest", "fit"]


def fit(
    bound,
    backend: str | None = None,
    method: str | Method = "nuts",
    *,
    seed: int = 0,
    precision: str = "float32",
    device: str | list[str] | None = None,
    shard: str | None = None,
    progress: bool | None = None,
    log_likelihood: bool = True,
    strict: bool = False,
    chain_ids: list[int] | None = None,
    executor: Any = None,
    **options: Any,
) -> Posterior:
    """Fit a bound model on ``backend`` ("pyro" or "numpyro") with ``method``.

    Parameters
    ----------
    bound : BoundModel
        A model with its data, ``my_model(X, y)``.
    backend : str, optional
        "numpyro" or "pyro" (see :func:`ppl_bdl.backends.available`); default: NumPyro if
        installed.
    method : str or method object
        A method object, ``bdl.NUTS(target_accept=0.9)``, ``bdl.SGHMC(step_size=1e-3)``,
        ``bdl.VI(guide="flow")``, ``bdl.CAVI()``, ``bdl.Ensemble(num_members=5)``, ...; or its
        name ("nuts", "hmc", "sgld", "sghmc", "psgld", "csgld", "csghmc", a kernel registered
        with :func:`ppl_bdl.kernels.register`, "vi", "cavi", "ensemble"), with its options as
        keywords: ``fit(model, method="sghmc", step_size=1e-3)`` builds
        ``bdl.SGHMC(step_size=1e-3)`` and gives the same draws. Options given with an object
        replace its fields.
    seed : int
        Same seed, same backend: same draws.
    precision : "float32" | "float64"
    device : str or list of str, optional
        Where the data and the computation live: "cpu", "cuda", "cuda:1", ... (None: the
        backend's default device). Several devices: a list, ``["cuda:0", "cuda:1"]``, or every
        device of a kind, ``"cuda:*"``; the work is split over them as ``shard`` says (the
        user guide's page on scale).
    shard : "chains" | "data", optional
        What is split over several devices: "chains" (the default) or "data" (each step's
        minibatch; needs ``batch_size`` divisible by the number of devices).
    progress : bool, optional
        A progress bar (default: on a terminal, off in CI).
    log_likelihood : bool
        Keep the pointwise log-likelihood for ArviZ (LOO, WAIC).
    strict : bool
        Every fit is checked (:mod:`ppl_bdl.posterior.diagnostics`); the findings are in
        ``post.diagnostics`` and warned as one ``ConvergenceWarning``, or raised as a
        ``ConvergenceError`` under ``strict=True`` (the posterior in ``error.partial``).
    chain_ids : list of int, optional
        MCMC and ensembles: run just these chains (members), each drawing what it draws in the
        whole run.
    executor : "ray" | Executor, optional
        MCMC and ensembles: where the chains (members) run, in groups, merged into the
        posterior this process would give with the same seed: ``bdl.RayExecutor(...)`` on a
        Ray cluster, ``"ray"`` on a local Ray, ``bdl.InProcessExecutor(chains_per_task=k)``
        here. A group that fails raises :class:`~ppl_bdl.run.executor.ExecutorError`
        (after Ctrl-C an ``ExecutorInterrupted``, a ``RunInterrupted`` too) naming the groups
        that did not finish, with what the run kept (finished chains and the stopped groups'
        draws) in ``error.partial``.
    **options
        The method's options (see each method's class).

    Returns
    -------
    Posterior

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> post = bdl.fit(mean_model(np.array([0.9, 1.1, 1.0])), backend="numpyro",
    ...                method=bdl.NUTS(num_warmup=200, num_samples=200, num_chains=2),
    ...                progress=False)
    >>> post.samples["mu"].shape
    (2, 200)
    """
    method = resolve_method(method, options)
    request = FitRequest(
        backend, precision, device, shard, seed, want_progress(progress), log_likelihood
    )
    check_strict(strict)
    runner = choose_executor(executor, method, request, chain_ids)
    chains = chains_to_run(chain_ids, method)
    if runner is None:
        post, setup = run_here(bound, method, request, chains)
        log_weights = method.importance_log_weights(setup, post, seed)
    else:
        post, log_weights = run_groups(runner, bound, method, request, chains), None
    return diagnose(post, bound.name, strict, log_weights)


@dataclass(frozen=True)
class FitRequest:
    """Where and how a fit runs, whatever the method: the backend, precision, device and
    sharding, the seed, the progress bar and whether to keep the log-likelihood."""

    backend: str | None = None
    precision: str = "float32"
    device: Any = None
    shard: str | None = None
    seed: int = 0
    progress: bool = False
    log_likelihood: bool = True

    def settings(self) -> dict[str, Any]:
        """What ``post.settings`` records of the request."""
        settings = dict(
            backend=self.backend, precision=self.precision, device=self.device, seed=self.seed
        )
        if self.shard is not None:
            settings["shard"] = self.shard
        return settings


def run_here(bound, method: Method, request: FitRequest, chain_ids):
    """Prepare the model on the request's backend and run the method in this process: the
    posterior (of ``chain_ids``) and the setup, before the checks."""
    setup = prepare(
        bound, request.backend, request.precision, request.seed, request.device, shard=request.shard
    )
    resolved = {"backend": setup.backend.name, "device": setup.backend.device}
    setup.settings.update({"method": method.name, **request.settings(), **method.settings()})
    setup.settings.update(resolved)  # as resolved, not as asked: None is a default
    post = method.run(
        setup,
        seed=request.seed,
        progress=request.progress,
        log_likelihood=request.log_likelihood,
        chain_ids=chain_ids,
    )
    return post, setup


def run_group(bound, chain_ids: list[int], options: dict) -> Posterior:
    """What one task of an executor runs: the chains ``chain_ids`` of the fit that ``options``
    describe (the request's fields and ``method``), without the checks (they run once, on the
    merged chains)."""
    fields = {f.name for f in dataclasses.fields(FitRequest)}
    request = FitRequest(**{k: v for k, v in options.items() if k in fields})
    return run_here(bound, options["method"], request, chain_ids)[0]


def run_groups(runner, bound, method: Method, request: FitRequest, chains: list[int]):
    """The chains run in groups on ``runner`` and merged."""
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    options = dict(dataclasses.asdict(request), progress=False, method=method)
    return run_job(runner, ChainJob(bound, chains, options, run_group, progress=request.progress))


def diagnose(post: Posterior, name: str, strict: bool, log_weights=None) -> Posterior:
    """Check the fit (:func:`~ppl_bdl.posterior.diagnostics.check_fit`) and keep the findings in
    ``post.diagnostics``; warn them at the caller of ``fit``, or raise them under ``strict``."""
    post.diagnostics = check_fit(post, log_weights)
    if post.diagnostics:
        message = f"{post.method} fit of {name!r}: " + post.diagnostics.report()
        if strict:
            raise ConvergenceError(message, partial=post, findings=post.diagnostics)
        warnings.warn(message, ConvergenceWarning, stacklevel=3)
    return post


def choose_executor(executor: Any, method: Method, request: FitRequest, chain_ids=None):
    """Where the groups of chains run: None (here, together), the executor given ("ray": a
    local Ray; or an object with ``run(job)``), or one worker process per device where the
    backend runs chains over several devices so."""
    if not method.runs_chains:
        for name, value in (("executor", executor), ("chain_ids", chain_ids)):
            if value is not None:
                raise ConfigError(
                    f"{name}={value!r} does not apply to method={method.name!r}: it places or "
                    "picks the chains of an MCMC fit (or an ensemble's members), and this "
                    f"method fits one approximation in one process. Leave {name} out."
                )
        return None
    found = get_backend(request.backend, request.precision)
    devices = found.process_devices(request.device, request.shard)
    if devices is not None:
        if executor is not None:
            raise ConfigError(
                f"executor={executor!r} with device={request.device!r}: this backend spreads "
                "chains over several devices one worker process per device, an executor of its "
                "own. Pick one: leave executor out, or give each of the executor's tasks one "
                "device (device='cuda', with RayExecutor(resources={'num_gpus': 1}))."
            )
        return DeviceExecutor(devices)
    if executor is None or callable(getattr(executor, "run", None)):
        return executor
    if isinstance(executor, str) and executor == "ray":
        return RayExecutor()
    raise ConfigError(
        f"executor={executor!r}: the one name an executor goes by is 'ray' (a local Ray); "
        "otherwise pass an executor with a run(job) method, e.g. bdl.RayExecutor(address="
        "'auto', resources={'num_gpus': 1}) or bdl.InProcessExecutor(), or leave it out."
    )


def chains_to_run(chain_ids, method: Method) -> list[int] | None:
    """The chains (ensemble: members) to run: all of them (None for a method without chains),
    or a checked subset (distinct, in range)."""
    if not method.runs_chains:
        return None
    count = method.num_chains_to_run
    if chain_ids is None:
        return list(range(count))
    ids = list(chain_ids) if isinstance(chain_ids, list | tuple | range) else None
    if (
        not ids
        or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < count for c in ids)
        or len(set(ids)) != len(ids)
    ):
        raise ConfigError(
            f"chain_ids must be a non-empty list of distinct chain (ensemble: member) numbers in "
            f"[0, {count}), got {chain_ids!r}."
        )
    return ids


def check_strict(strict: Any) -> None:
    if not isinstance(strict, bool):
        raise ConfigError(f"strict must be True or False, got {strict!r}.")


def want_progress(progress: bool | None) -> bool:
    """A progress bar where asked, else on a terminal outside CI."""
    if progress is not None:
        return bool(progress)
    return sys.stderr.isatty() and not os.environ.get("CI")
