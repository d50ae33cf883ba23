"""Epoch minibatches: one shuffle per epoch, sliced; the same sequence however they are read."""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.loop.minibatch import EpochBatches


def test_the_sequence_is_one_permutation_per_epoch():
    size, batch = 2_000, 100
    batches = EpochBatches(size, batch, 3)
    blocks = np.concatenate([batches.next_block(15) for _ in range(4)])  # 3 epochs of 20
    rng = np.random.default_rng(3)
    inline = np.concatenate([rng.permutation(size) for _ in range(3)]).reshape(-1, batch)
    np.testing.assert_array_equal(blocks, inline[:60])
    for epoch in range(3):  # every point once per epoch
        assert np.unique(blocks[epoch * 20 : (epoch + 1) * 20]).size == size


def test_small_n_drops_the_short_tail_of_each_epoch():
    batches = EpochBatches(10, 4, 0)
    block = batches.next_block(4)  # two batches per epoch (the 2 left over are dropped)
    assert block.shape == (4, 4)
    assert np.unique(block[:2]).size == 8 and np.unique(block[2:]).size == 8


def test_the_same_however_it_is_read():
    one_step_at_a_time = EpochBatches(1_000, 100, 5)
    steps = np.concatenate([one_step_at_a_time.next_block(1) for _ in range(25)])
    at_once = EpochBatches(1_000, 100, 5).next_block(25)
    np.testing.assert_array_equal(steps, at_once)
    assert at_once.dtype == np.int32
