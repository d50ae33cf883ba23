"""What the driver checks and prepares before it spreads a run over several devices.

A run that the fit's devices cannot split is refused before anything compiles, saying what
would be split and what to do (:func:`check_spread`); chains split over devices are padded to
a multiple of the device count (:func:`chain_padding`); a per-chain rate scale (VI's fits, each
with its own plateau cuts) is cut to a part of the run's chains and padded like them
(:func:`part_scale`).

Example
-------
>>> from types import SimpleNamespace
>>> one = SimpleNamespace(device_count=1, shard_mode="chains")
>>> check_spread(one, vectorised=False, batch=None, name="sgld")  # one device: nothing to check
>>> chain_padding(SimpleNamespace(device_count=4, shard_mode="chains"), chains=5)
3
>>> part_scale([1.0, 0.5, 0.25], [0, 1, 2], [2, 1], pad=1).tolist()
[0.25, 0.5, 0.5]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError


def check_spread(backend, vectorised: bool, batch, name: str) -> None:
    """A run that several devices cannot split is refused, saying what would be split."""
    count = backend.device_count
    if count == 1:
        return
    if backend.shard_mode == "chains" and not vectorised:
        raise ConfigError(
            f"{name}: device={backend.device!r} splits chains over {count} devices, but this run has "
            "one chain at a time (num_chains=1, or chain_method='sequential'). Run several "
            f"chains side by side (num_chains >= 2; NUTS/HMC: chain_method='vectorized'), split "
            "each step's minibatch with shard='data', or use one device."
        )
    if backend.shard_mode == "data" and batch is None:
        raise ConfigError(
            f"{name}: shard='data' splits each step's minibatch over {count} devices, but this "
            "run steps on the full data (no batch_size). Give batch_size=... (SG-MCMC, VI), or "
            "split chains instead (shard='chains', the default)."
        )
    if backend.shard_mode == "data" and batch.batch_size % count:
        raise ConfigError(
            f"{name}: shard='data' splits each minibatch over {count} devices; batch_size="
            f"{batch.batch_size} is not a multiple of {count}. Use batch_size="
            f"{max(count, batch.batch_size // count * count)} (a multiple of {count})."
        )


def chain_padding(backend, chains: int) -> int:
    """How many copies of the last chain make ``chains`` a multiple of the devices they are
    split over (0 unless chains are split)."""
    return (-chains) % backend.device_count if backend.shard_mode == "chains" else 0


def part_scale(scale: Any, chains: list, part: list, pad: int) -> Any:
    """The rates' scale of the run's ``part`` (its chains): a float as it is; one per chain
    (aligned with ``chains``) cut to the part's chains, its last repeated ``pad`` times, and a
    part of one chain's as a float."""
    if np.ndim(scale) == 0:
        return float(scale)
    values = np.asarray(scale, float)
    if values.shape != (len(chains),):
        raise ConfigError(
            f"Rates.scale: one per chain expected ({len(chains)}), got shape {values.shape}."
        )
    values = values[[chains.index(c) for c in part]]
    if len(part) == 1 and not pad:
        return float(values[0])
    return np.concatenate([values, values[-1:].repeat(pad)])
