"""Horovod's ``hvd.elastic.ElasticSampler``: a dataset's indices for this worker, for an epoch that
may see the workers change.

The sampler remembers which indices were processed this epoch (``record_batch`` or
``record_indices``, then ``state.commit()``); after a change of the workers (``reset``, which
``TorchState`` calls) the indices not yet processed are dealt again over the new workers, so that
an epoch neither skips nor repeats a committed sample across the change. As Horovod's (and torch's
``DistributedSampler``), the remaining indices are padded with their own first ones up to a
multiple of the workers (at most ``size - 1`` repeats), so that every worker takes the same number
of steps; ``shuffle`` permutes them with ``seed + epoch`` (the same on every worker).
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
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Batch ``batch_idx`` (of ``batch_size``) of this worker's indices was processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: list[int]) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_indices = {int(i) for i in state["processed_indices"]}
        self.reset()

    def reset(self) -> None:
        """Deal the epoch's unprocessed indices over the workers there are now."""
        backend = self._runtime.backend()
        self.num_replicas, self.rank = backend.size, backend.rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
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
