"""SplitSampler: deterministic, disjoint, covering, reshuffled per epoch by seed; lockstep_batch: an
epoch taken in lockstep steps from a position, at any number of workers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_core.train.data import SplitSampler, lockstep_batch


@settings(max_examples=60, deadline=None)
@given(length=st.integers(0, 500), parts=st.integers(1, 9), epoch=st.integers(0, 5), seed=st.integers(0, 99))
def test_parts_are_disjoint_and_cover(length, parts, epoch, seed):
    samplers = [SplitSampler(length, parts, i, seed=seed) for i in range(parts)]
    chunks = [s.indices(epoch) for s in samplers]
    allidx = np.concatenate(chunks)
    assert sorted(allidx.tolist()) == list(range(length))  # covering and disjoint
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [len(s) for s in samplers]


def test_deterministic_and_reshuffled_per_epoch():
    a, b = SplitSampler(100, 4, 1, seed=7), SplitSampler(100, 4, 1, seed=7)
    np.testing.assert_array_equal(a.indices(0), b.indices(0))
    assert not np.array_equal(a.indices(0), a.indices(1))
    assert not np.array_equal(a.indices(0), SplitSampler(100, 4, 1, seed=8).indices(0))
    a.set_epoch(3)
    assert list(a) == a.indices(3).tolist()


def test_no_shuffle_is_contiguous_ranges():
    got = [SplitSampler(10, 3, i, shuffle=False).indices().tolist() for i in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_batches():
    s = SplitSampler(10, 1, 0, shuffle=False)
    assert [b.tolist() for b in s.batches(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.tolist() for b in s.batches(4, drop_last=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="batch_size"):
        s.batches(0)


@pytest.mark.parametrize(
    ("args", "match"), [((-1, 2, 0), "length"), ((5, 0, 0), "num_parts"), ((5, 2, 2), "part_index")]
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        SplitSampler(*args)


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 300),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    batch=st.integers(1, 9),
    at=st.integers(0, 8),
)
def test_lockstep_batches_go_on_at_a_new_size_without_skipping_or_repeating(length, sizes, batch, at):
    """An epoch taken in lockstep steps, the number of workers changing every ``at + 1`` steps:
    every position before the last step's end is trained exactly once, in order."""
    order = SplitSampler(length, 1, 0, seed=3).order(2)
    processed, trained, step = 0, [], 0
    while True:
        size = sizes[min(step // (at + 1), len(sizes) - 1)]
        got = [lockstep_batch(order, processed, r, size, batch) for r in range(size)]
        if got[0] is None:
            assert all(g is None for g in got) and length - processed < size * batch
            break
        assert all(g is not None and len(g) == batch for g in got)
        trained += [int(i) for g in got for i in g]  # type: ignore[union-attr]
        processed += size * batch
        step += 1
    assert trained == order[:processed].tolist()


def test_lockstep_batch_refuses_a_rank_outside_the_workers():
    order = np.arange(10)
    with pytest.raises(ValueError, match="rank 3 is not a rank of 3 workers"):
        lockstep_batch(order, 0, 3, 3, 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        lockstep_batch(order, 0, 0, 1, 0)
