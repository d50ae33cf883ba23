"""Epoch minibatches: one shuffle per epoch, sliced; the same sequence whether the next shuffle is
made on a worker thread (large N) or in line, and the first epoch of large N split into a head drawn
at once and a tail shuffled on the worker."""

from __future__ import annotations

import numpy as np
from scipy import stats

from ppl_bdl.inference import minibatch
from ppl_bdl.inference.minibatch import BACKGROUND_N, FIRST_EPOCH_HEAD, EpochBatches


def first_epoch_inline(rng, size: int, head: int) -> np.ndarray:
    """The first epoch as EpochBatches draws it for large N, written out in line: an ordered
    sample of ``head`` points, then the other points in a random order."""
    first = rng.choice(size, head, replace=False)
    rest = np.setdiff1d(np.arange(size), first)
    rng.shuffle(rest)
    return np.concatenate([first, rest])


def test_large_n_shuffles_ahead_and_matches_the_inline_sequence():
    size, batch = BACKGROUND_N * 2, 1000
    assert size > FIRST_EPOCH_HEAD  # the first epoch is split
    batches = EpochBatches(size, batch, 3)
    blocks = np.concatenate([batches.next_block(150) for _ in range(4)])  # 3 epochs of 200
    rng = np.random.default_rng(3)
    epochs = [first_epoch_inline(rng, size, FIRST_EPOCH_HEAD)]
    epochs += [rng.permutation(size) for _ in range(2)]
    inline = np.concatenate(epochs).reshape(-1, batch)
    np.testing.assert_array_equal(blocks, inline[:600])
    # every point once per epoch
    for epoch in range(3):
        seen = blocks[epoch * 200 : (epoch + 1) * 200].ravel()
        assert np.unique(seen).size == size


def test_small_n_drops_the_short_tail_of_each_epoch():
    batches = EpochBatches(10, 4, 0)
    block = batches.next_block(4)  # two batches per epoch (the 2 left over are dropped)
    assert block.shape == (4, 4)
    assert np.unique(block[:2]).size == 8 and np.unique(block[2:]).size == 8


def test_no_epoch_beyond_the_run_is_shuffled_ahead():
    size, batch = BACKGROUND_N, 1000  # 100 batches per epoch
    batches = EpochBatches(size, batch, 3, num_batches=150)
    assert batches._next is not None  # the run reaches the second epoch: shuffled ahead
    blocks = [batches.next_block(100), batches.next_block(50)]
    assert batches._next is None  # the run ends inside the second epoch: nothing ahead of it
    # a run that asks for more than it said still gets the same sequence, and once past its
    # plan the next epoch is shuffled ahead again
    blocks.append(batches.next_block(100))
    assert batches._next is not None
    rng = np.random.default_rng(3)
    inline = np.concatenate([rng.permutation(size) for _ in range(3)]).reshape(-1, batch)
    np.testing.assert_array_equal(np.concatenate(blocks), inline[:250])


def test_the_split_first_epoch_is_a_uniformly_random_permutation(monkeypatch):
    """Head (an ordered sample) + tail (the rest shuffled on the worker): every one of the 5! orders
    of 5 points equally likely (chi-square over 12,000 seeds, at the 0.1% level)."""
    monkeypatch.setattr(minibatch, "BACKGROUND_N", 1)
    monkeypatch.setattr(minibatch, "FIRST_EPOCH_HEAD", 2)
    size, draws = 5, 12_000
    counts: dict[tuple, int] = {}
    for seed in range(draws):
        order = tuple(EpochBatches(size, 1, seed, num_batches=size).next_block(size).ravel())
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 120 and all(sorted(order) == list(range(size)) for order in counts)
    assert stats.chisquare(list(counts.values())).pvalue > 1e-3


def test_the_first_epoch_is_the_same_however_it_is_consumed():
    size, batch = FIRST_EPOCH_HEAD + 1000, 100
    one_step_at_a_time = EpochBatches(size, batch, 5)
    steps = np.concatenate([one_step_at_a_time.next_block(1) for _ in range(size // batch)])
    at_once = EpochBatches(size, batch, 5).next_block(size // batch)
    np.testing.assert_array_equal(steps, at_once)
    assert np.unique(at_once).size == at_once.size
