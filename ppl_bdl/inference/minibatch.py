"""Minibatches: one shuffle per epoch, sliced, so a step costs O(B), not O(N).

``batch_size=B`` at fit time subsamples the plate that holds the observed sites: each step it yields
B indices of the current epoch's permutation, and the sites in it are scaled by N / B (the
chapter's Eq. 2.19), which keeps the log-likelihood and its gradient unbiased.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import ConfigError
from .common import Setup


def minibatch_plate(setup: Setup, batch_size: int | None) -> tuple[str, int] | None:
    """The (plate name, size N) to subsample, or None for full batch. Validates ``batch_size``."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}.")
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
    return name, size


#: Data sizes from which the next epoch's shuffle is prepared on a worker thread.
BACKGROUND_N = 100_000
#: For such data, the indices of the first epoch drawn before its first batch; the rest of the
#: epoch is shuffled on the worker meanwhile (a million-point shuffle takes ~10 ms, as long as a
#: thousand steps of a small network, and would hold up the first of them).
FIRST_EPOCH_HEAD = 131_072
_SHUFFLER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppl_bdl-shuffle")


class EpochBatches:
    """Minibatch indices: reshuffle once per epoch and slice consecutive blocks of ``batch_size``.

    The tail of an epoch shorter than a batch is dropped, so every batch has the same size (one
    compiled step shape) and every point is seen at most once per epoch. ``num_batches``, when
    known, is how many batches the run plans to draw: no epoch beyond them is shuffled ahead
    (unless the run goes on past them).

    Example
    -------
    >>> batches = EpochBatches(size=10, batch_size=4, seed=0)
    >>> block = batches.next_block(5)
    >>> block.shape
    (5, 4)
    """

    def __init__(self, size: int, batch_size: int, seed, num_batches: int | None = None):
        self.size = size
        self.batch_size = batch_size
        self.per_epoch = size // batch_size
        self.num_batches = num_batches
        self._dtype = np.int32 if size < 2**31 else np.int64
        self._rng = np.random.default_rng(seed)
        self._drawn = 0  # batches handed out so far
        self._next = None
        self._filling = None  # the first epoch's tail, being shuffled on the worker
        split = size >= BACKGROUND_N and size > FIRST_EPOCH_HEAD
        self._start_epoch(self._split_shuffle() if split else self._shuffle())

    def _shuffle(self) -> np.ndarray:
        # NumPy shuffles int64 faster than int32 (the same permutation); int32 indices when they
        # fit: half the memory traffic, and what the backends use.
        return self._rng.permutation(self.size).astype(self._dtype, copy=False)

    def _split_shuffle(self) -> np.ndarray:
        """The first epoch's permutation, usable at once: its first FIRST_EPOCH_HEAD entries
        are a uniformly random ordered sample of the data (O(head)); the rest, a uniformly
        random order of the points not in it, is shuffled on the worker while the head is used.
        Together: a uniformly random permutation, the same for a seed however it is consumed."""
        perm = np.empty(self.size, dtype=self._dtype)
        head = FIRST_EPOCH_HEAD
        perm[:head] = self._rng.choice(self.size, head, replace=False)

        def fill_tail():
            rest = np.ones(self.size, dtype=bool)
            rest[perm[:head]] = False
            tail = np.flatnonzero(rest)
            self._rng.shuffle(tail)
            perm[head:] = tail

        self._filling = _SHUFFLER.submit(fill_tail)
        return perm

    def _await_tail(self) -> None:
        if self._filling is not None:
            self._filling, filling = None, self._filling
            filling.result()

    def _start_epoch(self, perm: np.ndarray) -> None:
        self._perm, self._position = perm, 0
        # For large N the next epoch's shuffle is made on a worker thread (NumPy releases the
        # GIL while shuffling) while this epoch's batches are used, if the run gets there; the
        # same generator draws the same permutations in the same order either way.
        planned = self.num_batches
        reaches_next = (
            planned is None
            or self._drawn + self.per_epoch < planned
            or self._drawn >= planned  # past the plan already: it may well go on
        )
        if self.size >= BACKGROUND_N and reaches_next:
            self._next = _SHUFFLER.submit(self._shuffle)

    def next_block(self, num_steps: int) -> np.ndarray:
        """Indices for the next ``num_steps`` steps, shaped (num_steps, batch_size)."""
        out = np.empty((num_steps, self.batch_size), dtype=self._dtype)
        done, b = 0, self.batch_size
        while done < num_steps:  # whole runs of one epoch at a time (same indices as step by step)
            if self._position == self.per_epoch:
                self._await_tail()  # the worker is done with the generator
                upcoming, self._next = self._next, None
                self._start_epoch(self._shuffle() if upcoming is None else upcoming.result())
            take = min(num_steps - done, self.per_epoch - self._position)
            start = self._position * b
            if start + take * b > FIRST_EPOCH_HEAD:
                self._await_tail()
            out[done : done + take] = self._perm[start : start + take * b].reshape(take, b)
            self._position += take
            self._drawn += take
            done += take
        return out
