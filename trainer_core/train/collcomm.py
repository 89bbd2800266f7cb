"""``CollectiveCommunicator``: CNTK's communicator over a collective group (no servers).

>>> from trainer_core import collective
>>> comm = CollectiveCommunicator(collective.group())   # every worker (hostnames are gathered)
>>> dl = data_parallel_distributed_learner(local, communicator=comm, num_quantization_bits=1)

Sums are allreduces among the workers: ``aggregate`` reduces all the keys at once
(``grouped_allreduce``, fused into buckets); after ``set_compression`` each key goes through the
compressed allreduce (``collective.compressed``: compressed reduce-scatter with each worker's
residual, the reduced chunk compressed again with its owner's residual for the allgather), the
error feedback kept here per key. ``declare`` moves nothing; ``broadcast`` is rank 0's values.
The hostnames come from an allgather of each worker's encoded name, as the KV path's exchange.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer_core.collective import ErrorFeedback, Group

from .comm import WorkerDescriptor, WorkerTable, decode_host, encode_host, local_host_id


class CollectiveCommunicator(WorkerTable):
    """The ``Communicator`` of the workers of ``group`` (``finalize`` closes the group: a job's
    group waits for every worker and leaves the job)."""

    def __init__(self, group: Group, host_id: str | None = None) -> None:
        self.group = group
        #: the compression params and residuals, once ``set_compression`` was called
        self.feedback: ErrorFeedback | None = None
        mine = local_host_id() if host_id is None else host_id
        rows = group.allgather(encode_host(mine).view(np.uint32)[None, :])
        hosts = np.asarray(rows).view(np.float32)
        self._workers = [WorkerDescriptor(i, decode_host(hosts[i])) for i in range(group.size)]

    def rank(self) -> int:
        return int(self.group.rank)

    def num_workers(self) -> int:
        return int(self.group.size)

    def barrier(self) -> None:
        self.group.barrier()

    def _close(self) -> None:
        self.group.close()

    def declare(self, keys: list[str], values: list[Any]) -> None:
        pass  # nothing is stored anywhere: broadcast sends rank 0's values when asked

    def broadcast(self, keys: list[str], values: list[Any]) -> None:
        works = [self.group.broadcast_async(v, 0) for v in values]
        for v, w in zip(values, works, strict=True):
            v[...] = w.wait()

    def aggregate(self, keys: list[str], values: list[Any], out: list[Any]) -> None:
        if self.feedback is None:
            sums = self.group.grouped_allreduce(values, op="sum")
        else:
            ef = self.feedback
            works = [self.group.compressed_allreduce_async(v, ef, k, op="sum") for k, v in zip(keys, values, strict=True)]  # fmt: skip
            sums = [w.wait() for w in works]
        for o, s in zip(out, sums, strict=True):
            o[...] = s

    def set_compression(self, params: dict[str, Any]) -> None:
        self.feedback = ErrorFeedback(dict(params))
