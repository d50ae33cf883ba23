"""NUTS and HMC: the backend's own samplers, driven with the core's potential function."""

from __future__ import annotations

from ..backends.base import NativeSettings
from ..errors import ConfigError
from ..layout import make_potential
from .common import Setup, build_posterior, initial_positions


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
):
    if not 0.0 < target_accept < 1.0:
        raise ConfigError(f"target_accept must be in (0, 1), got {target_accept!r}.")
    if chain_method not in ("sequential", "vectorized", "parallel"):
        raise ConfigError(
            f"chain_method must be 'sequential', 'vectorized' or 'parallel', got {chain_method!r}."
        )
    if not isinstance(max_tree_depth, int) or max_tree_depth < 1:
        raise ConfigError(f"max_tree_depth must be a positive int, got {max_tree_depth!r}.")
    be = setup.backend
    potential = make_potential(setup.bound, be, setup.layout, setup.params)

    def potential_fn(flat):
        with be.activate():
            return potential(flat)

    settings = NativeSettings(
        method=method,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        thinning=thinning,
        target_accept=target_accept,
        max_tree_depth=max_tree_depth,
        num_steps=num_steps,
        step_size=step_size,
        dense_mass=dense_mass,
        progress=progress,
        chain_method=chain_method,
    )
    init_positions = initial_positions(setup, init, num_chains, seed)
    positions, stats = be.run_native_mcmc(potential_fn, init_positions, settings, seed)
    return build_posterior(setup, positions, stats, method)
