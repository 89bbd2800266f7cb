"""Horovod's ``hvd.elastic.ElasticSampler``: a dataset's indices for this worker, for an epoch that
may see the workers change.

The epoch's order (``shuffle``: permuted with ``seed + epoch``, the same on every worker) is dealt
round the workers, worker ``r`` taking positions ``r``, ``r + size``, ... so that the workers'
``k``-th batches together cover the next ``size * batch_size`` positions of the order. The sampler
counts them (``record_batch``: every worker takes its steps in lockstep, so each knows how far all
of them got), and after a change of the workers (``reset``, which ``TorchState`` calls) the
positions not yet counted are dealt again over the new workers: an epoch neither skips nor repeats
a committed sample across the change, whichever worker left. As Horovod's (and torch's
``DistributedSampler``), the remaining order is padded with its own first indices up to a multiple
of the workers (at most ``size - 1`` repeats), so that every worker takes the same number of steps.
``set_epoch`` starts the next epoch: call it at the end of one (Horovod's rule), so that an epoch
cut short resumes where it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch

from .runtime import Runtime, default


class ElasticSampler(torch.utils.data.Sampler[int]):
    def __init__(
        self, dataset: Sized, shuffle: bool = True, seed: int = 0, *, runtime: Runtime | None = None
    ) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self._runtime = runtime or default
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (nothing of it processed yet)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every worker processed its batch ``batch_idx`` of ``batch_size`` (one lockstep step)."""
        self.processed_num += batch_size * self.num_replicas

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This worker's batch ``batch_idx`` of ``batch_size`` (counted from the last reset)."""
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_num = int(state["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Deal the epoch's positions not yet processed over the workers there are now."""
        backend = self._runtime.backend()
        self.num_replicas, self.rank = backend.size, backend.rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(self.remaining_indices)
        while len(padded) < self.total_size:  # (fewer remaining than workers: around again)
            padded += self.remaining_indices[: self.total_size - len(padded)]
        self.indices = padded[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
