"""``fit``: one call for every inference method, on the backend and device named at fit time."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.cavi.coordinate_ascent import check_cavi_call, run_cavi
from ppl_bdl.inference.ensemble import EnsembleConfig, check_ensemble_call
from ppl_bdl.inference.setup import prepare
from ppl_bdl.inference.vi.psis import importance_log_weights
from ppl_bdl.inference.vi.runner import run_vi
from ppl_bdl.posterior.diagnostics import ConvergenceError, ConvergenceWarning, check_fit
from ppl_bdl.run.fit_checks import chain_ids_to_run as _chain_ids
from ppl_bdl.run.fit_checks import positive_int as _positive_int
from ppl_bdl.run.fit_jobs import (
    NATIVE_OPTIONS,
    CostWarning,
    check_mcmc,
    check_params,
    choose_executor,
    fit_chains,
    fit_ensemble,
    fit_mcmc,
    fit_members,
    plain,
    run_groups,
    where,
)

__all__ = ["NATIVE_OPTIONS", "CostWarning", "fit"]


def _want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return bool(progress)
    return sys.stderr.isatty() and not os.environ.get("CI")


def fit(
    bound,
    backend: str | None = None,
    method: str = "nuts",
    *,
    num_warmup: int | None = None,
    num_samples: int | None = None,
    num_chains: int | None = None,
    thinning: int | None = None,
    seed: int = 0,
    init: Any = None,
    precision: str = "float32",
    device: str | list[str] | None = None,
    shard: str | None = None,
    progress: bool | None = None,
    log_likelihood: bool = True,
    strict: bool = False,
    hold_params: bool = False,
    chain_ids: list[int] | None = None,
    executor: Any = None,
    **options: Any,
):
    """Fit a bound model on ``backend`` ("pyro" or "numpyro") with ``method``.

    Parameters
    ----------
    bound : BoundModel
        A model with its data, ``my_model(X, y)``.
    backend : str, optional
        "numpyro" or "pyro" (see :func:`ppl_bdl.backends.available`); default: NumPyro if
        installed.
    method : str
        "nuts", "hmc", a registered SG-MCMC kernel (see :func:`ppl_bdl.inference.mcmc.kernels.available`), "vi",
        "cavi" (closed-form coordinate ascent for conditionally conjugate models:
        :mod:`ppl_bdl.inference.cavi.coordinate_ascent`), or "ensemble" (deep and anchored ensembles: M MAP fits,
        one draw per member, :mod:`ppl_bdl.inference.ensemble`).
    num_warmup, num_samples, num_chains, thinning : int
        ``num_samples`` draws (default 1000) are kept per chain; a chain runs
        ``num_warmup + num_samples * thinning`` steps on every method and backend (defaults:
        1000 warmup steps, 4 chains, no thinning). VI fits one guide for ``num_steps`` steps
        and keeps ``num_samples`` draws from it, so ``num_warmup``, ``thinning`` and ``init``
        (VI's start is ``init_loc``) are errors there, not silently ignored; ``num_chains``
        (default 1) runs that many independent VI fits side by side, one chain of the posterior
        each. An ensemble keeps one draw per member (``num_members``): ``num_samples``,
        ``num_chains``, ``num_warmup`` and ``thinning`` are errors there.
    seed : int
        Same seed, same backend: same draws.
    init : "median" | "uniform" | "prior" | dict | Posterior
        Initial point of each chain (default "median": the prior's centre, from prior draws, with
        a jitter of 0.1 prior standard deviations per chain; where networks are started, and a
        sound start for small models; "uniform": uniform on [-2, 2] in the unconstrained space,
        Stan's overdispersed start, and the default for a model with a flat prior).
    precision : "float32" | "float64"
    device : str or list of str, optional
        Where the data and the computation live: "cpu", "cuda", "cuda:1", ... (None: the
        backend's default device: JAX's default device, or torch's default, the CPU unless
        changed). The posterior's arrays come back as NumPy. Several devices: a list,
        ``["cuda:0", "cuda:1"]``, or every device of a kind, ``"cuda:*"``; the work is split
        over them as ``shard`` says, and the draws are those of one device (docs/scale.md;
        Pyro: chains and ensemble members in one worker process per device, each step's data
        in one ``torch.distributed`` process per device).
    shard : "chains" | "data", optional
        What is split over several devices: "chains" (the default: each device runs its share
        of the chains) or "data" (each step's minibatch, for one chain or a few; needs
        ``batch_size`` divisible by the number of devices).
    progress : bool, optional
        A progress bar with an ETA (default: on a terminal, off in CI).
    log_likelihood : bool
        Keep the pointwise log-likelihood for ArviZ (LOO, WAIC); it is computed the first time it
        is read. False: never.
    strict : bool
        After every fit the result is checked (:mod:`ppl_bdl.posterior.diagnostics`: R-hat, ESS,
        divergences, tree depth, acceptance; VI's loss curve and Pareto k̂). The findings are in
        ``post.diagnostics`` and are warned as one :class:`~ppl_bdl.posterior.diagnostics.ConvergenceWarning`;
        ``strict=True`` raises them as a :class:`~ppl_bdl.posterior.diagnostics.ConvergenceError` instead
        (the posterior in ``error.partial``), for pipelines.
    hold_params : bool
        MCMC and ensembles: a model's ``bdl.param`` sites are not sampled; NUTS, HMC, SG-MCMC
        and ensembles refuse such a model unless ``hold_params=True`` says to hold them at
        their initial values. (VI fits them as point estimates.)
    chain_ids : list of int, optional
        MCMC and ensembles: run just these chains of the ``num_chains`` (the members of the
        ``num_members``; what one task of an executor runs); each chain's draws are those it
        has in the whole run (a chain's draws depend on the seed and its number only; bit for
        bit where chains run one after another, to float rounding where the backend runs them
        side by side: XLA may round a vectorised program over 2 chains otherwise than one over
        4), and the posterior holds them in this order.
    executor : "ray" | Executor, optional
        MCMC and ensembles: where the chains (members) run. None (default): here, in this
        process (on Pyro with several devices: one worker process per device). An executor
        runs them in groups, each group ``fit(..., chain_ids=group)``, and merges the groups'
        posteriors into the one this process would give with the same seed (the checks below
        run once, on the merged chains): ``bdl.RayExecutor(address=..., resources=...,
        max_retries=...)`` runs them as Ray tasks on a cluster (docs/ray.md), ``"ray"`` on a
        local Ray; ``bdl.InProcessExecutor(chains_per_task=k)`` here, k chains at a time. A
        group that fails (its worker died past its retries, a non-finite step) or Ctrl-C raises
        :class:`~ppl_bdl.run.executor.ExecutorError` naming the groups that did not finish, with the
        chains that did in ``error.partial``.
    **options
        Method settings: for NUTS/HMC ``target_accept`` (0.8), ``max_tree_depth`` (10),
        ``dense_mass``, ``num_steps`` and ``step_size`` (HMC), ``chain_method`` ("sequential",
        the default on one device, or "vectorized", the default with chains split over several
        devices); for SG-MCMC, VI and ensembles (``num_members``, ``num_steps``,
        ``batch_size``, ``anchored``, ``lr``, ...) see their docs.

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
    >>> post = bdl.fit(mean_model(np.array([0.9, 1.1, 1.0])), backend="numpyro", method="nuts",
    ...                num_warmup=200, num_samples=200, num_chains=2, progress=False)
    >>> post.samples["mu"].shape
    (2, 200)
    """
    progress = _want_progress(progress)
    samples = 1000 if num_samples is None else num_samples  # None: an ensemble refuses any
    mcmc = dict(
        backend=backend,
        method=method,
        num_warmup=num_warmup,
        num_samples=samples,
        num_chains=num_chains,
        thinning=thinning,
        seed=seed,
        init=init,
        precision=precision,
        device=device,
        shard=shard,
        progress=progress,
        log_likelihood=log_likelihood,
        hold_params=hold_params,
        options=options,
    )
    if not isinstance(strict, bool):
        raise ConfigError(f"strict must be True or False, got {strict!r}.")
    settings = dict(
        method=method,
        backend=backend,
        precision=precision,
        device=device,
        seed=seed,
        **{k: v for k, v in options.items() if plain(v)},
    )
    if shard is not None:
        settings["shard"] = shard
    if method in ("cavi", "vi") and executor is not None:
        raise ConfigError(
            f"executor={executor!r} does not apply to method={method!r}: an executor runs the "
            "chains of an MCMC fit (NUTS, HMC, SG-MCMC) or an ensemble's members as tasks, and "
            "this method fits one approximation in one process. Leave executor out."
        )
    if method in ("cavi", "vi") and chain_ids is not None:
        raise ConfigError(
            f"chain_ids={chain_ids!r} does not apply to method={method!r}: it picks which chains "
            "of an MCMC fit (or members of an ensemble) a call runs, and this method's fits "
            "(num_chains) run together in one call. Leave chain_ids out."
        )
    if method == "ensemble":
        config = EnsembleConfig.build(**options)
        check_ensemble_call(num_chains, num_warmup, thinning, num_samples)
        chain_ids = _chain_ids(chain_ids, config.num_members)
        runner = choose_executor(executor, backend, precision, device, shard)
        members = dict(
            backend=backend,
            precision=precision,
            device=device,
            shard=shard,
            seed=seed,
            init=init,
            progress=progress,
            log_likelihood=log_likelihood,
            hold_params=hold_params,
            settings=settings,
            options=options,
        )
        if runner is None:
            post, setup = fit_ensemble(bound, chain_ids=chain_ids, **members)
            return _diagnose(post, setup, strict)
        post = run_groups(runner, bound, chain_ids, members, fit_members, progress)
        return _report(post, bound.name, strict)
    num_samples = samples
    if method == "cavi":
        check_cavi_call(num_chains, num_warmup, thinning, init)
        setup = prepare(bound, backend, precision, seed, device, shard=shard)
        _one_device(setup, method)
        setup.settings.update(settings, num_samples=num_samples, **where(setup))
        check_params(setup, method, hold_params)
        post = run_cavi(
            setup,
            _positive_int("num_samples", num_samples),
            seed,
            progress,
            log_likelihood,
            **options,
        )
        return _diagnose(post, setup, strict)
    if method == "vi":
        unused = {"num_warmup": num_warmup, "thinning": thinning, "init": init}
        given = sorted(k for k, v in unused.items() if v is not None)
        if given:
            raise ConfigError(
                f"option(s) {', '.join(given)}: does not apply to method='vi': VI runs num_steps optimizer "
                "steps (no warmup, no chain to thin) from init_loc ('median', 'prior', a dict of "
                "site values or a flat array). Leave them out."
            )
        if hold_params:
            raise ConfigError(
                "hold_params=True does not apply to method='vi': VI fits the model's bdl.param "
                "sites as point estimates. Leave it out."
            )
        setup = prepare(bound, backend, precision, seed, device, shard=shard)
        setup.settings.update(settings, num_samples=num_samples, **where(setup))
        if num_chains is not None:
            setup.settings["num_chains"] = num_chains
        post = run_vi(
            setup,
            num_samples=_positive_int("num_samples", num_samples),
            seed=seed,
            progress=progress,
            log_likelihood=log_likelihood,
            num_chains=_positive_int("num_chains", 1 if num_chains is None else num_chains),
            **options,
        )
        return _diagnose(post, setup, strict)
    runner = choose_executor(executor, backend, precision, device, shard)
    if runner is None:
        post, setup = fit_mcmc(bound, chain_ids=chain_ids, **mcmc)
        return _diagnose(post, setup, strict)
    num_chains, chains = check_mcmc(chain_ids=chain_ids, **mcmc)[2:4]
    post = run_groups(
        runner, bound, chains, dict(mcmc, num_chains=num_chains), fit_chains, progress
    )
    return _report(post, bound.name, strict)


def _one_device(setup, method: str) -> None:
    """A method with no chains or minibatches to split runs on one device."""
    be = setup.backend
    if be.device_count > 1:
        raise ConfigError(
            f"method={method!r} runs on one device; device={be.device!r} names "
            f"{be.device_count}. Name one device."
        )


def _diagnose(post, setup, strict: bool):
    """Check the fit (:mod:`ppl_bdl.posterior.diagnostics`): keep the findings, warn or raise them."""
    log_weights = None
    if post.method in ("vi", "cavi"):
        log_weights = importance_log_weights(setup, post, seed=setup.settings.get("seed", 0))
    post.diagnostics = check_fit(post, log_weights)
    return _report(post, setup.bound.name, strict, stacklevel=4)


def _report(post, name: str, strict: bool, stacklevel: int = 3):
    """Warn ``post.diagnostics`` (raise them under ``strict``) at the caller of ``fit``; return
    ``post``."""
    if post.diagnostics:
        message = f"{post.method} fit of {name!r}: " + post.diagnostics.report()
        if strict:
            raise ConvergenceError(message, partial=post, findings=post.diagnostics)
        warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel)
    return post
