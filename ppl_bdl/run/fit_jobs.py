"""The fits that run as groups of chains: MCMC (NUTS, HMC, SG-MCMC) and ensembles, run here or
handed to an executor (kept apart to keep :mod:`ppl_bdl.run.fit` small).

:func:`fit_chains` and :func:`fit_members` are what one task of an executor runs: the chains
(members) ``chain_ids`` of the fit, without the post-fit checks, which run once on the merged
result. :func:`choose_executor` picks where the groups run: the executor given, or, when the
backend runs one device per process and ``device=`` names several
(:meth:`~ppl_bdl.backend_protocol.Devices.process_devices`), one worker process per device
(:class:`~ppl_bdl.run.process_executor.DeviceExecutor`).

Example
-------
>>> from ppl_bdl.run.fit_jobs import choose_executor
>>> choose_executor(None, "pyro", "float32", ["cpu", "cpu"], None)
DeviceExecutor(devices=['cpu', 'cpu'], max_retries=0)
>>> choose_executor(None, "pyro", "float32", "cpu", None) is None
True
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from ppl_bdl import backends
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.ensemble import EnsembleConfig, run_ensemble
from ppl_bdl.inference.mcmc import kernels
from ppl_bdl.inference.mcmc.native import NativeConfig, run_native_mcmc
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, run_sgmcmc
from ppl_bdl.inference.setup import prepare
from ppl_bdl.posterior.posterior import Posterior
from ppl_bdl.run.executor import ChainJob, run_job
from ppl_bdl.run.fit_checks import chain_ids_to_run, positive_int
from ppl_bdl.run.process_executor import DeviceExecutor
from ppl_bdl.run.ray_executor import RayExecutor

#: Options of NUTS/HMC (besides the common ones): the settings of :class:`NativeConfig`.
NATIVE_OPTIONS = set(inspect.signature(NativeConfig.build).parameters) - {"method"}
#: Latent dimensions above which NUTS/HMC warn before they start: every draw costs up to
#: 2^max_tree_depth gradients of the full data, which on a network's posterior is the usual case.
NUTS_DIM_WARNING = 500


class CostWarning(UserWarning):
    """A fit is set up in a way that will cost far more than an alternative that suits it."""


def choose_executor(executor: Any, backend, precision: str, device, shard):
    """Where the groups of chains run: None (here, together), the executor given ("ray": a
    local Ray; or an object with ``run(job)``), or one worker process per device where the
    backend runs chains over several devices so."""
    devices = backends.get(backend, precision).process_devices(device, shard)
    if devices is not None:
        if executor is not None:
            raise ConfigError(
                f"executor={executor!r} with device={device!r}: this backend spreads chains "
                "over several devices one worker process per device, an executor of its own. "
                "Pick one: leave executor out, or give each of the executor's tasks one device "
                "(device='cuda', with RayExecutor(resources={'num_gpus': 1}))."
            )
        return DeviceExecutor(devices)
    if executor is None:
        return None
    if isinstance(executor, str):
        if executor == "ray":
            return RayExecutor()
        raise ConfigError(
            f"executor={executor!r}: the one name an executor goes by is 'ray' (a local Ray); "
            "otherwise pass an executor, e.g. bdl.RayExecutor(address='auto', "
            "resources={'num_gpus': 1}) or bdl.InProcessExecutor(), or leave it out."
        )
    if not callable(getattr(executor, "run", None)):
        raise ConfigError(
            f"executor must be 'ray', a RayExecutor, an InProcessExecutor or another object with "
            f"a run(job) method, got {executor!r}."
        )
    return executor


def run_groups(runner, bound, chains: list[int], options: dict, run, progress: bool) -> Posterior:
    """``run(bound, group, options)`` for groups of ``chains`` on ``runner``, merged."""
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    job = ChainJob(bound, chains, dict(options, progress=False), run, progress=progress)
    return run_job(runner, job)


# -- MCMC ------------------------------------------------------------------------------------------
def fit_chains(bound, chain_ids: list[int], options: dict):
    """The chains ``chain_ids`` of an MCMC fit with ``fit``'s keyword ``options``, without the
    post-fit checks (what an executor's task runs: the checks run once, on the merged chains)."""
    return fit_mcmc(bound, chain_ids=chain_ids, **options)[0]


def check_mcmc(method, num_warmup, num_samples, num_chains, thinning, chain_ids, options, **_):
    """An MCMC fit's settings checked (before anything runs, and before any task starts):
    the method's entry and config, the chain count and chains, warmup and thinning."""
    entry = kernels.get(method)
    num_chains = positive_int("num_chains", 4 if num_chains is None else num_chains)
    chain_ids = chain_ids_to_run(chain_ids, num_chains)
    num_warmup = positive_int("num_warmup", 1000 if num_warmup is None else num_warmup, minimum=0)
    thinning = positive_int("thinning", 1 if thinning is None else thinning)
    positive_int("num_samples", num_samples)
    if entry.kind == "native":
        unknown = set(options) - NATIVE_OPTIONS
        if unknown:
            raise ConfigError(
                f"unknown option(s) {sorted(unknown)} for method {method!r}; expected some of "
                f"{sorted(NATIVE_OPTIONS)}."
            )
        config = NativeConfig.build(method, **options)
    else:
        config = SGMCMCConfig.build(method, **options)
    return entry, config, num_chains, chain_ids, num_warmup, thinning


def fit_mcmc(
    bound,
    *,
    backend,
    method,
    num_warmup,
    num_samples,
    num_chains,
    thinning,
    seed,
    init,
    precision,
    device,
    shard,
    progress,
    log_likelihood,
    hold_params,
    chain_ids,
    options,
):
    """NUTS, HMC or an SG-MCMC kernel on ``bound``: the posterior (of ``chain_ids``) and the
    setup, without the post-fit checks."""
    entry, config, num_chains, chain_ids, num_warmup, thinning = check_mcmc(
        method, num_warmup, num_samples, num_chains, thinning, chain_ids, options
    )
    common = dict(
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        thinning=thinning,
        seed=seed,
        init=init,
        progress=progress,
        log_likelihood=log_likelihood,
        chain_ids=chain_ids,
    )
    setup = prepare(bound, backend, precision, seed, device, shard=shard)
    setup.settings.update(
        method=method,
        backend=backend,
        precision=precision,
        device=device,
        seed=seed,
        **{k: v for k, v in options.items() if plain(v)},
    )
    if shard is not None:
        setup.settings["shard"] = shard
    setup.settings.update(
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        thinning=thinning,
        **where(setup),
    )
    check_params(setup, method, hold_params)
    if entry.kind == "native":
        warn_cost(setup, method)
        post = run_native_mcmc(setup, config, **common)
    else:
        post = run_sgmcmc(setup, config, **common)
    return post, setup


# -- ensembles -------------------------------------------------------------------------------------
def fit_members(bound, chain_ids: list[int], options: dict):
    """The members ``chain_ids`` of an ensemble with ``fit``'s keyword ``options``, without the
    post-fit checks (what an executor's task runs)."""
    return fit_ensemble(bound, chain_ids=chain_ids, **options)[0]


def fit_ensemble(
    bound,
    *,
    backend,
    precision,
    device,
    shard,
    seed,
    init,
    progress,
    log_likelihood,
    hold_params,
    chain_ids,
    settings,
    options,
):
    """The members ``chain_ids`` of ``method="ensemble"`` on ``bound`` and the setup, without
    the post-fit checks; ``settings``: those ``fit`` saves with every method."""
    config = EnsembleConfig.build(**options)
    setup = prepare(bound, backend, precision, seed, device, shard=shard)
    setup.settings.update(settings, **config.settings(), **where(setup))
    check_params(setup, "ensemble", hold_params)
    post = run_ensemble(
        setup,
        config,
        seed=seed,
        init=init,
        progress=progress,
        log_likelihood=log_likelihood,
        chain_ids=chain_ids,
    )
    return post, setup


# -- shared ----------------------------------------------------------------------------------------
def warn_cost(setup, method: str) -> None:
    dim = setup.layout.dim
    if dim > NUTS_DIM_WARNING:
        warnings.warn(
            f"{method.upper()} on {setup.bound.name!r}: {dim} latent dimensions (> "
            f"{NUTS_DIM_WARNING}). Each draw costs up to 2^max_tree_depth full-data gradients "
            "and, on a network's posterior, usually hits that depth: expect hours. Use "
            "method='sghmc' (or 'sgld', 'csghmc') with batch_size=..., or method='vi'; or set "
            "max_tree_depth=5 to bound the cost.",
            CostWarning,
            stacklevel=4,
        )


def check_params(setup, method: str, hold_params: bool) -> None:
    """MCMC samples latent sites only: a model's ``bdl.param`` sites would be held at their
    initial values, which is said and refused unless ``hold_params=True``."""
    if setup.params and not hold_params:
        names = sorted(setup.params)
        raise ConfigError(
            f"model {setup.bound.name!r} has bdl.param site(s) {names}; method={method!r} "
            "samples latent sites only and would hold them at their initial values. Fit them "
            "with method='vi' (point estimates; guide='delta' for MAP), make them latent "
            "(bdl.sample with a prior), or pass hold_params=True to hold them at the init "
            "given to bdl.param (e.g. a value a VI fit found: post.params)."
        )


def where(setup) -> dict:
    """The backend and device the fit ran on, as resolved (not as asked: None is a default)."""
    return {"backend": setup.backend.name, "device": setup.backend.device}


def plain(value: Any) -> bool:
    """Whether an option can be saved as a setting (JSON: numbers, strings, bools, None)."""
    return value is None or isinstance(value, bool | int | float | str)
