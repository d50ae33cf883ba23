"""NUTS and HMC: the backend's own samplers, stepped by the core's driver with the core's potential.

The backend wraps its native kernel (NumPyro's or Pyro's NUTS/HMC, their warmup adaptation
included) as a transition (:meth:`Backend.native_transition`); the driver runs it like every
other method: chunks, chains, progress with an ETA, draws kept after warmup every ``thinning``
draws, and Ctrl-C keeping the draws finished so far (``error.partial``).
"""

from __future__ import annotations

import numpy as np

from ..backend_protocol import NativeSettings
from ..errors import ConfigError
from ..layout import ModelDensity
from .common import Setup, build_posterior, initial_positions
from .driver import plan_run, run_chains
from .failures import raise_failure

CHAIN_METHODS = ("sequential", "vectorized")


def run_native_mcmc(
    setup: Setup,
    method: str,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init,
    target_accept: float = 0.8,
    max_tree_depth: int = 10,
    num_steps: int | None = None,
    step_size: float | None = None,
    dense_mass: bool = False,
    progress: bool = False,
    chain_method: str = "sequential",
    chunk_size: int | None = None,
    log_likelihood: bool = True,
):
    """Run the backend's NUTS (``method="nuts"``) or HMC on a prepared model; return a Posterior."""
    if not 0.0 < target_accept < 1.0:
        raise ConfigError(f"target_accept must be in (0, 1), got {target_accept!r}.")
    if chain_method not in CHAIN_METHODS:
        raise ConfigError(
            f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r} ('vectorized' "
            "runs the chains side by side where the backend can, 'sequential' one after another)."
        )
    if (
        isinstance(max_tree_depth, bool)
        or not isinstance(max_tree_depth, int)
        or max_tree_depth < 1
    ):
        raise ConfigError(f"max_tree_depth must be a positive int, got {max_tree_depth!r}.")
    if step_size is not None and not (isinstance(step_size, int | float) and step_size > 0):
        raise ConfigError(f"step_size must be a number > 0, got {step_size!r}.")
    be = setup.backend
    density = ModelDensity(setup.bound, be, setup.layout, setup.params)
    settings = NativeSettings(
        method=method, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
        thinning=thinning, target_accept=target_accept, max_tree_depth=max_tree_depth,
        num_steps=num_steps, step_size=step_size, dense_mass=dense_mass, progress=progress,
        chain_method=chain_method,
    )  # fmt: skip
    transition = be.native_transition(lambda flat, data: density.potential(flat, data), settings)
    keep = np.zeros(num_warmup + num_samples * thinning, bool)
    keep[num_warmup + thinning - 1 :: thinning] = True
    positions = initial_positions(setup, init, num_chains, seed)
    plan = plan_run(keep, num_chains, setup.layout.dim, chunk_size, progress)
    chains = list(range(num_chains))
    groups = [chains] if chain_method == "vectorized" else [[c] for c in chains]
    runs = []
    for group in groups:
        run = run_chains(
            be, transition, positions[group], seed, plan, density.data, lambda c: None,
            method, progress, chain_ids=group,
        )  # fmt: skip
        runs.append(run)
        if run.failure is not None:
            break
    run = _merge(runs)
    if run.failure is not None:
        raise_failure(setup, run, kind=method.upper(), requested=num_samples, method=method,
                      log_likelihood=log_likelihood)  # fmt: skip
    stats = _arviz_stats(run.infos, method)
    return build_posterior(setup, run.draws, stats, method, log_likelihood=log_likelihood)


def _merge(runs):
    """One result from the runs of successive chain groups (draws cut to a common length)."""
    if len(runs) == 1:
        return runs[0]
    from .driver import RunResult

    done = [r for r in runs if r.draws is not None]
    failure = runs[-1].failure
    if not done:
        return RunResult(None, {}, None, failure)
    n = min(r.draws.shape[1] for r in done)
    draws = np.concatenate([r.draws[:, :n] for r in done])
    infos = {k: np.concatenate([r.infos[k][:, :n] for r in done]) for k in done[0].infos}
    return RunResult(draws, infos, runs[-1].final_state, failure)


def _arviz_stats(infos: dict, method: str) -> dict:
    """The per-draw stats under ArviZ's names (``tree_depth`` from the number of steps)."""
    stats = dict(infos)
    stats["diverging"] = stats["diverging"].astype(bool)
    stats["n_steps"] = stats["n_steps"].astype(np.int64)
    if method == "nuts":
        stats["tree_depth"] = (
            np.floor(np.log2(np.maximum(stats["n_steps"], 1))).astype(np.int64) + 1
        )
    return stats
