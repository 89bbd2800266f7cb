"""Splitting a data set over workers: ``SplitSampler``, as CNTK's ``num_data_partitions`` /
``partition_index`` and PyTorch's ``DistributedSampler``.

Each epoch the indices ``0 .. length-1`` are permuted by a generator seeded with
``(seed, epoch)`` (identical on every worker, so no communication is needed), then cut into
``num_parts`` contiguous runs whose sizes differ by at most one; part ``part_index`` is one run.
The parts of one epoch are disjoint and together cover every index exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class SplitSampler:
    """The indices of one worker's share of a data set, per epoch."""

    def __init__(
        self, length: int, num_parts: int, part_index: int, shuffle: bool = True, seed: int = 0
    ) -> None:
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if num_parts < 1:
            raise ValueError(f"num_parts must be >= 1, got {num_parts}")
        if not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        self.length, self.num_parts, self.part_index = length, num_parts, part_index
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0

    def bounds(self) -> tuple[int, int]:
        """``[start, stop)`` of this part within the epoch's order (the first ``length % num_parts``
        parts hold one extra index)."""
        base, extra = divmod(self.length, self.num_parts)
        i = self.part_index
        start = i * base + min(i, extra)
        return start, start + base + (1 if i < extra else 0)

    def order(self, epoch: int) -> np.ndarray:
        """The whole data set's order in ``epoch`` (the same on every part)."""
        if not self.shuffle:
            return np.arange(self.length)
        return np.random.default_rng([self.seed, epoch]).permutation(self.length)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This part's indices for ``epoch`` (default: the epoch set by ``set_epoch``)."""
        start, stop = self.bounds()
        return self.order(self.epoch if epoch is None else epoch)[start:stop]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        start, stop = self.bounds()
        return stop - start

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def batches(self, batch_size: int, epoch: int | None = None, drop_last: bool = False) -> list[np.ndarray]:
        """This part's indices for ``epoch`` cut into minibatches of ``batch_size``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        idx = self.indices(epoch)
        stop = len(idx) - len(idx) % batch_size if drop_last else len(idx)
        return [idx[i : i + batch_size] for i in range(0, stop, batch_size)]


def lockstep_batch(
    order: np.ndarray, processed: int, rank: int, size: int, batch_size: int
) -> np.ndarray | None:
    """Worker ``rank``'s next batch of an epoch whose ``order`` (``SplitSampler.order``) is taken
    in lockstep steps from position ``processed`` on: the ``size`` workers' batches together are
    the next ``size * batch_size`` positions, rank ``r`` the ``r``-th run of ``batch_size``; after
    the step every worker adds ``size * batch_size`` to ``processed``. ``None`` when fewer than
    that remain (the epoch is over; the tail is left out, as a fixed split leaves out what does not
    fill a step). The position alone says what was trained, whatever the number of workers: an
    elastic job's epoch goes on from it at a new size, no sample skipped or trained twice."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not a rank of {size} workers")
    if batch_size < 1 or processed < 0:
        raise ValueError(f"batch_size must be >= 1 and processed >= 0, got {batch_size}, {processed}")
    if processed + size * batch_size > len(order):
        return None
    start = processed + rank * batch_size
    return order[start : start + batch_size]
