"""NUTS and HMC, stepped by the core's driver with the core's potential.

NUTS is the backend's own sampler: the backend wraps its native kernel (NumPyro's or Pyro's NUTS,
its warmup adaptation included) as a transition (:meth:`Backend.native_transition`). HMC is the
core's kernel with Stan's warmup (:mod:`~ppl_bdl.inference.mcmc.hmc_warmup`), the same program on
every backend. The driver runs either like every other method: chunks, chains, progress with an
ETA, draws kept after warmup every ``thinning`` draws, and Ctrl-C keeping the draws finished so
far (``error.partial``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppl_bdl.backend_protocol import NativeSettings
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.ensemble import traced_potential
from ppl_bdl.inference.loop.driver import plan_run, run_chains
from ppl_bdl.inference.loop.failures import raise_failure
from ppl_bdl.inference.mcmc.hmc_kernel import DEFAULT_LEAPFROG_STEPS
from ppl_bdl.inference.mcmc.hmc_warmup import adaptive_hmc_transition
from ppl_bdl.inference.mcmc.neutra import NeuTraMap
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.trace.layout import ModelDensity
from ppl_bdl.trace.programs import programs

CHAIN_METHODS = ("sequential", "vectorized")


@dataclass(frozen=True)
class NativeConfig:
    """A fit's NUTS/HMC settings, checked once (:meth:`build`).

    Example
    -------
    >>> from ppl_bdl.inference.mcmc.native import NativeConfig
    >>> NativeConfig.build("nuts", max_tree_depth=6).max_tree_depth
    6
    """

    method: str
    target_accept: float = 0.8
    max_tree_depth: int = 10
    num_steps: int | None = None
    step_size: float | None = None
    dense_mass: bool = False
    #: None: "sequential" on one device, "vectorized" when chains are split over several.
    chain_method: str | None = None
    chunk_size: int | None = None

    @classmethod
    def build(
        cls,
        method: str,
        *,
        target_accept: float = 0.8,
        max_tree_depth: int = 10,
        num_steps: int | None = None,
        step_size: float | None = None,
        dense_mass: bool = False,
        chain_method: str | None = None,
        chunk_size: int | None = None,
    ) -> NativeConfig:
        if not (_number(target_accept) and 0.0 < target_accept < 1.0):
            raise ConfigError(f"target_accept must be in (0, 1), got {target_accept!r}.")
        if chain_method is not None and chain_method not in CHAIN_METHODS:
            raise ConfigError(
                f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r} ('vectorized' "
                "runs the chains side by side where the backend can, 'sequential' one after "
                "another)."
            )
        for name, value in (
            ("max_tree_depth", max_tree_depth),
            ("num_steps", num_steps),
            ("chunk_size", chunk_size),
        ):
            if value is None and name != "max_tree_depth":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}.")
        if step_size is not None and not (_number(step_size) and step_size > 0):
            raise ConfigError(f"step_size must be a number > 0, got {step_size!r}.")
        if not isinstance(dense_mass, bool):
            raise ConfigError(f"dense_mass must be True or False, got {dense_mass!r}.")
        return cls(
            method,
            float(target_accept),
            max_tree_depth,
            num_steps,
            None if step_size is None else float(step_size),
            dense_mass,
            chain_method,
            chunk_size,
        )


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_native_mcmc(
    setup: Setup,
    config: NativeConfig,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init,
    progress: bool = False,
    log_likelihood: bool = True,
    chain_ids: list[int] | None = None,
    neutra=None,
):
    """Run NUTS (the backend's, ``config.method == "nuts"``) or HMC (the core's) on a prepared
    model; return a Posterior (of the chains ``chain_ids`` of ``num_chains``, all by default).
    With ``neutra`` (a flow guide's VI posterior) the sampler runs in the flow's base space
    (:mod:`~ppl_bdl.inference.mcmc.neutra`)."""
    backend, method = setup.backend, config.method
    chain_method = config.chain_method
    if chain_method is None:
        # Side by side where they are split over devices, and for HMC: its chains take the
        # same number of leapfrog steps, so a vectorized step wastes none.
        split = backend.device_count > 1 and backend.shard_mode == "chains"
        chain_method = "vectorized" if split or method == "hmc" else "sequential"
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    settings = NativeSettings(
        method=method,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        thinning=thinning,
        target_accept=config.target_accept,
        max_tree_depth=config.max_tree_depth,
        num_steps=config.num_steps,
        step_size=config.step_size,
        dense_mass=config.dense_mass,
        progress=progress,
        chain_method=chain_method,
    )
    flow = None if neutra is None else NeuTraMap(neutra, setup)
    transition = _transition(setup, density, settings, flow)
    keep = np.zeros(num_warmup + num_samples * thinning, bool)
    keep[num_warmup + thinning - 1 :: thinning] = True
    positions = initial_positions(setup, init, num_chains, seed)
    if flow is not None:
        positions = flow.pull_back(positions)
    chains = list(range(num_chains)) if chain_ids is None else chain_ids
    plan = plan_run(keep, len(chains), setup.layout.dim, config.chunk_size, progress)
    run = run_chains(
        backend,
        transition,
        positions[chains],
        seed,
        plan,
        density.data,
        lambda c: None,
        method,
        progress=progress,
        chain_ids=chains,
        vectorize=chain_method == "vectorized",
    )
    if flow is not None and run.draws is not None:
        run.draws = flow.push_forward(run.draws)
    if run.failure is not None:
        raise_failure(
            setup,
            run,
            kind=method.upper(),
            requested=num_samples,
            method=method,
            log_likelihood=log_likelihood,
        )
    stats = arviz_stats(run.infos, method)
    return build_posterior(setup, run.draws, stats, method, log_likelihood=log_likelihood)


def _transition(setup: Setup, density: ModelDensity, settings: NativeSettings, flow=None):
    """The NUTS (backend's) or HMC (core's) transition, from the program cache where the model
    has a key: it depends on the model and the sampler's settings, not on the number of draws,
    chains or the seed (``num_warmup`` is the adaptation's schedule; ``step_size`` the
    adaptation's start). A NeuTra run (``flow``) samples a potential of its own and is not
    cached."""
    backend = setup.backend

    def build(key=None):
        pull_back = None if flow is None else flow.potential
        if settings.method == "hmc":
            made = _core_hmc(setup, pull_back, settings)
        else:
            potential = density.potential if flow is None else pull_back(density.potential)
            made = backend.native_transition(lambda flat, data: potential(flat, data), settings)
        return made._replace(key=key)

    model = setup.program_key()
    if model is None or flow is not None:
        return build()
    key = (
        "native",
        model,
        settings.method,
        settings.num_warmup,
        repr(settings.target_accept),
        settings.max_tree_depth,
        settings.num_steps,
        repr(settings.step_size),
        settings.dense_mass,
    )
    return programs(backend).get(key, lambda: build(key))


def _core_hmc(setup: Setup, pull_back, settings: NativeSettings):
    """The core's HMC with its warmup on the model's potential (pulled back by ``pull_back``,
    NeuTra's, where given), its value and gradient traced once (:func:`traced_potential`)."""
    _, potential_and_grad = traced_potential(setup, None, None, pull_back)
    return adaptive_hmc_transition(
        setup.backend,
        potential_and_grad,
        num_warmup=settings.num_warmup,
        num_steps=settings.num_steps or DEFAULT_LEAPFROG_STEPS,
        target_accept=settings.target_accept,
        step_size=1.0 if settings.step_size is None else settings.step_size,
        dense_mass=settings.dense_mass,
    )


def arviz_stats(infos: dict, method: str) -> dict:
    """The per-draw stats under ArviZ's names (``tree_depth`` from the number of steps)."""
    stats = dict(infos)
    stats["diverging"] = stats["diverging"].astype(bool)
    stats["n_steps"] = stats["n_steps"].astype(np.int64)
    if method == "nuts":
        stats["tree_depth"] = (
            np.floor(np.log2(np.maximum(stats["n_steps"], 1))).astype(np.int64) + 1
        )
    return stats
