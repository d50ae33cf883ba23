"""Epoch minibatches: one shuffle per epoch, sliced; the same sequence whether the next shuffle is
made on a worker thread (large N) or in line."""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.minibatch import BACKGROUND_N, EpochBatches


def test_large_n_shuffles_ahead_and_matches_the_inline_sequence():
    size, batch = BACKGROUND_N * 2, 1000
    batches = EpochBatches(size, batch, 3)
    blocks = np.concatenate([batches.next_block(150) for _ in range(4)])  # 3 epochs of 200
    rng = np.random.default_rng(3)
    inline = np.concatenate([rng.permutation(size) for _ in range(3)]).reshape(-1, batch)
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
