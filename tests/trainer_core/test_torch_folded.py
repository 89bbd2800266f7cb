"""Adasum's arithmetic (trainer_core.torch.folded), in process: the pair rule's two limits, the
order of the tree, the small-norm rule, the refusals, and a joined rank's zeros in its own place."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

import torch

from trainer_core.torch import folded


def test_orthogonal_vectors_add_and_equal_ones_average() -> None:
    a, b = np.array([3.0, 0.0]), np.array([0.0, 4.0])
    assert folded.combine(a, b).tolist() == [3.0, 4.0]
    assert folded.combine(a, a).tolist() == a.tolist()


def test_a_vector_with_a_tiny_norm_keeps_coefficient_one() -> None:
    a, zero = np.array([1.0, 2.0]), np.zeros(2)
    assert folded.combine(a, zero).tolist() == [1.0, 2.0]
    assert folded.combine(zero, zero).tolist() == [0.0, 0.0]


def test_four_rows_pair_at_distance_one_then_two() -> None:
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(4, 7))
    want = folded.combine(folded.combine(rows[0], rows[1]), folded.combine(rows[2], rows[3]))
    assert folded.adasum_rows(rows).tolist() == want.tolist()
    other = folded.combine(folded.combine(rows[0], rows[2]), folded.combine(rows[1], rows[3]))
    assert not np.array_equal(other, want)  # the order is part of the definition


@pytest.mark.parametrize("size", [0, 3, 5, 6, 12])
def test_sizes_that_are_not_powers_of_two_are_refused(size: int) -> None:
    assert not folded.power_of_two(size)
    if size:
        with pytest.raises(ValueError, match=f"power of two of vectors, not {size}"):
            folded.adasum_rows(np.ones((size, 2)))
        with pytest.raises(ValueError, match=f"this job has {size}"):
            folded.check_adasum(torch.ones(2), size)


def test_the_tensor_keeps_its_dtype_and_shape() -> None:
    every = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]], dtype=torch.bfloat16)
    out = folded.adasum_of(every)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2) and out.tolist() == [[1.0, 2.0]]
    with pytest.raises(ValueError, match=r"floating-point tensors, not torch\.int32"):
        folded.check_adasum(torch.ones(2, dtype=torch.int32), 2)


def test_a_rank_that_gave_no_row_is_zeros_in_its_own_place() -> None:
    """``fold`` puts each row at the rank that gave it (counts 1, 0, 1, 1: rank 1 joined)."""
    x0, x2, x3 = [1.0, 2.0], [3.0, -1.0], [0.5, 4.0]
    t = torch.zeros(2, dtype=torch.float64)
    got = (np.array([x0, x2, x3]), [1, 0, 1, 1])
    want = folded.adasum_rows(np.array([x0, [0.0, 0.0], x2, x3]))
    assert folded.fold("adasum", got, t, 4).tolist() == want.tolist()
    assert (
        folded.fold("adasum", got, t, 4).tolist()
        != folded.adasum_rows(np.array([x0, x2, x3, [0.0, 0.0]])).tolist()
    )
    assert folded.fold("product", got, t, 4).tolist() == [0.0, 0.0]
    every = (np.array([x0, x2]), [1, 1])
    assert folded.fold("product", every, t, 2).tolist() == [3.0, -2.0]


def test_a_process_sets_size_is_named() -> None:
    with pytest.raises(ValueError, match=r"process set \[0, 1, 2\] has 3"):
        folded.check_adasum(torch.ones(2), 3, (0, 1, 2))
