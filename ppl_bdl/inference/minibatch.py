"""Minibatches: one shuffle per epoch, sliced, so a step costs O(B), not O(N).

``batch_size=B`` at fit time subsamples the plate that holds the observed sites: each step it yields
B indices of the current epoch's permutation, and the sites in it are scaled by N / B (the
chapter's Eq. 2.19), which keeps the log-likelihood and its gradient unbiased.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .common import Setup


def minibatch_plate(setup: Setup, batch_size: int | None) -> tuple[str, int] | None:
    """The (plate name, size N) to subsample, or None for full batch. Validates ``batch_size``."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}.")
    if setup.layout.discrete:
        raise ConfigError(
            f"batch_size={batch_size}: the model has discrete latent sites "
            f"{setup.layout.discrete}, summed out over the whole data set, so it takes no "
            "minibatches. Fit without batch_size (NUTS, HMC, VI and the SG-MCMC kernels all "
            "sum them out on full batches)."
        )
    plates = {}
    for site in setup.sites.values():
        if site.kind == "observed":
            for frame in site.plates:
                plates[frame.name] = frame.size
    if len(plates) != 1:
        raise ConfigError(
            f"batch_size needs exactly one plate around the observed sites to subsample; found "
            f"{sorted(plates) or 'none'}. Wrap the likelihood in `with bdl.plate('data', N) as idx:` "
            "and index the data with idx."
        )
    ((name, size),) = plates.items()
    if batch_size > size:
        raise ConfigError(
            f"batch_size={batch_size} is larger than the data (plate {name!r} has N={size}). Use "
            f"batch_size <= {size}, or leave it out for full-batch steps."
        )
    _check_indexed(setup, name, size, batch_size)
    return name, size


def _check_indexed(setup: Setup, plate: str, size: int, batch_size: int) -> None:
    """Run the model once on a minibatch: an observed site of the plate whose data is not indexed
    with the plate's indices would be scaled by N/B over all of its N values."""
    from ..errors import ModelError
    from ..layout import trace_model

    if batch_size == size:
        return
    values = {n: s.value for n, s in setup.sites.items() if s.kind == "latent"}
    try:
        trace_model(setup.bound, setup.backend, values=values, missing="error",
                    batch={plate: np.arange(batch_size)}, check_bounds=False)  # fmt: skip
    except ModelError as err:
        if "obs has shape" not in str(err):
            raise
        raise ConfigError(
            f"with batch_size={batch_size} the plate {plate!r} yields {batch_size} of its {size} "
            f"indices per step, but an observed site in it does not use them: {err} Index the "
            "data with the plate's indices (`with bdl.plate(...) as idx:` then `obs=y[idx]`, "
            "`X[idx]`)."
        ) from err


class EpochBatches:
    """Minibatch indices: reshuffle once per epoch and slice consecutive blocks of ``batch_size``.

    The tail of an epoch shorter than a batch is dropped, so every batch has the same size (one
    compiled step shape) and every point is seen at most once per epoch.

    Example
    -------
    >>> batches = EpochBatches(size=10, batch_size=4, seed=0)
    >>> block = batches.next_block(5)
    >>> block.shape
    (5, 4)
    """

    def __init__(self, size: int, batch_size: int, seed):
        self.size = size
        self.batch_size = batch_size
        self.per_epoch = size // batch_size
        self._dtype = np.int32 if size < 2**31 else np.int64
        self._rng = np.random.default_rng(seed)
        self._perm, self._position = self._shuffle(), 0

    def _shuffle(self) -> np.ndarray:
        # NumPy shuffles int64 faster than int32 (the same permutation); int32 indices when they
        # fit: half the memory traffic, and what the backends use.
        return self._rng.permutation(self.size).astype(self._dtype, copy=False)

    def next_block(self, num_steps: int) -> np.ndarray:
        """Indices for the next ``num_steps`` steps, shaped (num_steps, batch_size)."""
        out = np.empty((num_steps, self.batch_size), dtype=self._dtype)
        done, b = 0, self.batch_size
        while done < num_steps:  # whole runs of one epoch at a time (same indices as step by step)
            if self._position == self.per_epoch:
                self._perm, self._position = self._shuffle(), 0
            take = min(num_steps - done, self.per_epoch - self._position)
            start = self._position * b
            out[done : done + take] = self._perm[start : start + take * b].reshape(take, b)
            self._position += take
            done += take
        return out
