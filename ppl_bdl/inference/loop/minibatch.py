"""Minibatches: one shuffle per epoch, sliced, so a step costs O(B), not O(N).

``batch_size=B`` at fit time subsamples the plate that holds the observed sites
(:func:`ppl_bdl.inference.setup.minibatch_plate` finds and checks it): each step it yields B
indices of the current epoch's permutation, and the sites in it are scaled by N / B (Eq. 2.19
of "Bayesian Computation in Deep Learning"), which keeps the log-likelihood and its gradient unbiased. This module is a
leaf: the driver reads its index blocks and nothing else.
"""

from __future__ import annotations

import numpy as np


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
