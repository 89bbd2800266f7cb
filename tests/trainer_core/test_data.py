"""SplitSampler: deterministic, disjoint, covering, reshuffled per epoch by seed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_core.train.data import SplitSampler


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
