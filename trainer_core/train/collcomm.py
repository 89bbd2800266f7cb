"""``CollectiveCommunicator``: CNTK's communicator over a collective group (no servers).

>>> from trainer_core import collective
>>> comm = CollectiveCommunicator(collective.group())   # every worker (hostnames are gathered)
>>> dl = data_parallel_distributed_learner(local, communicator=comm, num_quantization_bits=1)

Sums are allreduces among the workers: ``aggregate`` reduces all the keys at once
(``grouped_allreduce``, fused into buckets); after ``set_compression`` each key goes through the
compressed allreduce (``collective.compressed.twostage``: compressed reduce-scatter with each worker's
residual, the reduced chunk compressed again with its owner's residual for the allgather), the
error feedback kept here per key. ``declare`` moves nothing but checks that every worker declared
the same keys, shapes and dtypes (``samemodel``); ``broadcast`` is rank 0's values.
The hostnames come from an allgather of each worker's encoded name, as the KV path's exchange.
``agree`` checks a job-wide setting (a learner's compression) as the KV communicator's does at the
scheduler: every worker's canonical JSON of it in two allgathers (lengths, bytes), compared on
every worker; a difference is a ``CollectiveMismatch`` on every worker naming each value and its
workers (``node.agree``'s words), and the group goes on.

``compression_state()`` is this worker's error feedback as named arrays (the KV store's method of
that name gives the same form): for each key, ``<key>/worker<c>`` holds the residual of the chunk
this worker sends to rank ``c`` in the reduce-scatter, ``<key>/server`` the residual of the chunk it
owns for the allgather (PowerSGD's ``q`` beside it); ``load_compression_state`` puts it back after
``set_compression``. The residuals differ per worker: each worker checkpoints its own
(``checkpoint.save_worker``; docs/learners.md).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from trainer_core.collective import CollectiveMismatch, ErrorFeedback, Group
from trainer_core.node.agree import MAX_VALUE, Waiter, canonical, differ, out_of_step
from trainer_core.xp import to_host

from . import samemodel
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
        """Nothing is stored anywhere (``broadcast`` sends rank 0's values when asked); every rank's
        keys, shapes and dtypes are checked to be the same (``samemodel``)."""
        g = self.group
        samemodel.check("the learner's parameters", samemodel.entries(keys, values), g.allgather, g.size)

    def agree(self, at: str, value: Any) -> Any:
        """Collective: the job-wide setting ``at`` that every worker gives as ``value`` (plain data;
        ``None``: this worker gives none and takes the others'); returned when they agree, else
        ``CollectiveMismatch`` on every worker naming each value and the workers that gave it (or
        who is where, when the workers name different settings)."""
        try:
            text = canonical(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{at}: a setting to agree on is plain data (dicts, lists, numbers, text): {exc}"
            ) from None
        mine = canonical([at, None if value is None else text]).encode()
        if len(mine) > MAX_VALUE:
            raise ValueError(f"{at}: the setting is {len(mine)} bytes, more than {MAX_VALUE}")
        g = self.group
        lens = np.asarray(g.allgather(np.array([len(mine)], np.int64))).tolist()
        blob = np.asarray(g.allgather(np.frombuffer(mine, np.uint8))).tobytes()
        waiters, start = [], 0
        for r, n in enumerate(lens):
            label, given = json.loads(blob[start : start + n])
            waiters.append(Waiter(r, label, "agree", given, None, 0))
            start += n
        error = out_of_step(waiters) if len({w.label for w in waiters}) > 1 else differ(at, waiters)
        if error is not None:
            raise CollectiveMismatch(error)
        given = [w.value for w in waiters if w.value is not None]
        return json.loads(given[0]) if given else None

    def broadcast(self, keys: list[str], values: list[Any]) -> None:
        works = [self.group.broadcast_async(v, 0) for v in values]
        for v, w in zip(values, works, strict=True):
            v[...] = w.wait()

    def aggregate(self, keys: list[str], values: list[Any], out: list[Any]) -> None:
        if self.feedback is None:
            sums = self.group.grouped_allreduce(values, op="sum")
        else:
            ef = self.feedback
            works = [
                self.group.compressed_allreduce_async(v, ef, k, op="sum")
                for k, v in zip(keys, values, strict=True)
            ]
            sums = [w.wait() for w in works]
        for o, s in zip(out, sums, strict=True):
            o[...] = s

    def set_compression(self, params: dict[str, Any]) -> None:
        self.feedback = ErrorFeedback(dict(params))

    def compression_state(self) -> dict[str, dict[str, np.ndarray]]:
        """This worker's error-feedback state by ``<key>/worker<c>`` and ``<key>/server`` (each a
        compressor's ``state_dict``: ``residual``, PowerSGD's ``q``); empty before
        ``set_compression`` and for parts that have not encoded yet."""
        out: dict[str, dict[str, np.ndarray]] = {}
        if self.feedback is None:
            return out
        for key, st in self.feedback.keys.items():
            parts = [(f"worker{c}", comp) for c, comp in enumerate(st.workers)] + [("server", st.server)]
            for part, comp in parts:
                state = {name: to_host(value) for name, value in comp.state_dict().items()}
                if state:
                    out[f"{key}/{part}"] = state
        return out

    def load_compression_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Restore ``compression_state()`` (after ``set_compression``, before the next
        ``aggregate``): the next compressed allreduce continues with these residuals. A
        ``ValueError`` names a part this job does not have (another number of workers)."""
        if not state:
            return
        if self.feedback is None:
            raise ValueError("compression state given, but this communicator does not compress")
        size = self.num_workers()
        for name, values in state.items():
            key, _, part = str(name).rpartition("/")
            st = self.feedback.key(key, size)
            if part == "server":
                comp = st.server
            elif part.startswith("worker") and part[6:].isdigit() and int(part[6:]) < size:
                comp = st.workers[int(part[6:])]
            else:
                raise ValueError(f"compression state {name!r}: no such part in a job of {size} workers")
            comp.load_state_dict({k: np.asarray(v) for k, v in values.items()})
