"""``Communicator``: CNTK's distributed communicator, over a KV store or a collective group.

``Communicator`` is the protocol the distributed learners run on: CNTK's rank, size, barrier and
worker table, plus what a learner moves (``declare`` its keys, ``broadcast`` rank 0's values,
``aggregate``: the sum over the workers, compressed once ``set_compression`` was called).
``KVCommunicator`` is the parameter server's (this module); ``CollectiveCommunicator`` the
collectives' (``collcomm``: allreduce among the workers, for jobs with ``-s 0``).

>>> comm = KVCommunicator(kv)      # collective: every worker constructs it (hostnames are exchanged)
>>> comm.rank(), comm.num_workers(), comm.is_main()
>>> comm.current_worker().host_id  # WorkerDescriptor(global_rank, host_id)
>>> comm.barrier()
>>> comm.finalize()                # closes the KV store; only after successful training, as CNTK

The hostnames of all workers are gathered once, in the constructor: every worker writes its own
name (``DMLC_NODE_HOST``, else ``socket.gethostname()``) as bytes into its row of a
``(num_workers, HOST_BYTES)`` float32 array and the KV store sums the rows (``pushpull`` on the
key ``__comm_hosts__``; with ``dist_async``, one key per worker). The distributed learners build
their communicator before they turn gradient compression on, since that exchange must travel
uncompressed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainer_core.transport.host import host_name

HOSTS_KEY = "__comm_hosts__"
HOST_BYTES = 256


@dataclass(frozen=True)
class WorkerDescriptor:
    """One worker: its global rank and the id (hostname) of the host it runs on."""

    global_rank: int
    host_id: str


def local_host_id(environ: dict[str, str] | None = None) -> str:
    """This process's host id: ``DMLC_NODE_HOST`` when the launcher set it, else the hostname."""
    env = os.environ if environ is None else environ
    return host_name(env.get("DMLC_NODE_HOST"))


def encode_host(name: str) -> np.ndarray:
    """A hostname as ``HOST_BYTES`` float32 byte values (zero padded, truncated if longer)."""
    raw = name.encode("utf-8")[:HOST_BYTES]
    row = np.zeros(HOST_BYTES, dtype=np.float32)
    row[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return row


def decode_host(row: np.ndarray) -> str:
    """The inverse of ``encode_host``."""
    values = np.rint(np.asarray(row, dtype=np.float64)).astype(np.uint8)
    return bytes(values).rstrip(b"\x00").decode("utf-8", errors="replace")


def exchange_hosts(kv: Any, n: int, rank: int, row: np.ndarray) -> np.ndarray:
    """Every worker's ``row``, stacked by rank. Sync stores sum one ``(n, HOST_BYTES)`` key; in an
    async store a push replaces the value, so each worker writes its own key and all read them all."""
    known = getattr(kv, "initialized", None)  # a second communicator on the store: init again no more
    if "async" not in str(kv.type):
        table = np.zeros((n, row.size), dtype=np.float32)
        if known is None or not known(HOSTS_KEY):
            kv.init(HOSTS_KEY, table)
        table[rank] = row
        out = np.empty_like(table)
        kv.pushpull(HOSTS_KEY, table, out)
        return out
    keys = [f"{HOSTS_KEY}{i}" for i in range(n)]
    if known is None or not known(keys[0]):
        kv.init(keys, [np.zeros_like(row) for _ in keys])
    kv.pushpull(keys[rank], row, np.empty_like(row))  # answered: the server holds it
    kv.barrier()
    out = np.empty((n, row.size), dtype=np.float32)
    kv.pull(keys, list(out))
    return out


class Communicator(Protocol):
    """What the distributed learners need of a communication path (see the module's text)."""

    def rank(self) -> int: ...
    def num_workers(self) -> int: ...
    def is_main(self) -> bool: ...
    def barrier(self) -> None: ...
    def workers(self) -> list[WorkerDescriptor]: ...
    def current_worker(self) -> WorkerDescriptor: ...
    def finalize(self) -> None: ...

    def declare(self, keys: list[str], values: list[Any]) -> None:
        """Every worker, once per key, before its first use (the KV store stores rank 0's values)."""

    def broadcast(self, keys: list[str], values: list[Any]) -> None:
        """Overwrite ``values`` in place with rank 0's values as they were ``declare``d."""

    def aggregate(self, keys: list[str], values: list[Any], out: list[Any]) -> None:
        """``out[i]`` = the sum of every worker's ``values[i]`` (compressed after ``set_compression``)."""

    def set_compression(self, params: dict[str, Any]) -> None:
        """Compress what ``aggregate`` sends from now on (``trainer_core.compression`` params),
        with error feedback."""


class WorkerTable:
    """What every communicator shares: CNTK's worker table over a rank and a size.

    A subclass gives ``rank``, ``num_workers``, ``barrier`` and ``_close`` (and ``_workers``)."""

    _workers: list[WorkerDescriptor]
    _finalized = False

    def rank(self) -> int:
        """This worker's rank, 0 .. num_workers - 1."""
        raise NotImplementedError

    def num_workers(self) -> int:
        """How many workers the job has."""
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def is_main(self) -> bool:
        """True on rank 0 (the worker that prints and writes checkpoints)."""
        return self.rank() == 0

    def workers(self) -> list[WorkerDescriptor]:
        """Every worker of the job, by rank."""
        return list(self._workers)

    def current_worker(self) -> WorkerDescriptor:
        """This worker's descriptor."""
        return self._workers[self.rank()]

    def finalize(self) -> None:
        """End communication (waits for every worker). Idempotent."""
        if not self._finalized:
            self._finalized = True
            self._close()


def check_store(kv: Any) -> Any:
    """``kv`` itself when it is a KV store (what ``trainer_core.kv.create`` returns); a TypeError
    naming what was given otherwise (``kv="dist_sync"``, the store's type for the store, was an
    AttributeError on ``num_workers`` deep in the learner)."""
    if not all(hasattr(kv, name) for name in ("pushpull", "num_workers", "rank", "type")):
        hint = f" (make it with trainer_core.kv.create({kv!r}))" if isinstance(kv, str) else ""
        raise TypeError(
            f"kv= takes a KV store, as trainer_core.kv.create(...) returns, got "
            f"{type(kv).__name__} {kv!r:.80}{hint}"
        )
    return kv


class KVCommunicator(WorkerTable):
    """The parameter server's ``Communicator``: rank, size, barrier, the worker table and the
    sums of a KV-store job (``pushpull``)."""

    def __init__(self, kv: Any, host_id: str | None = None) -> None:
        self.kv = check_store(kv)
        mine = local_host_id() if host_id is None else host_id
        n, r = int(kv.num_workers), int(kv.rank)
        hosts = exchange_hosts(kv, n, r, encode_host(mine))
        self._workers = [WorkerDescriptor(i, decode_host(hosts[i])) for i in range(n)]

    def rank(self) -> int:
        return int(self.kv.rank)

    def num_workers(self) -> int:
        return int(self.kv.num_workers)

    def barrier(self) -> None:
        """Wait until every worker reached this point."""
        self.kv.barrier()

    def _close(self) -> None:
        self.kv.close()

    def declare(self, keys: list[str], values: list[Any]) -> None:
        self.kv.init(keys, values)

    def broadcast(self, keys: list[str], values: list[Any]) -> None:
        self.kv.pull(keys, values)

    def aggregate(self, keys: list[str], values: list[Any], out: list[Any]) -> None:
        self.kv.pushpull(keys, values, out)

    def set_compression(self, params: dict[str, Any]) -> None:
        self.kv.set_gradient_compression(params)

    def agree(self, at: str, value: Any) -> Any:
        """The job-wide setting ``at``, the same ``value`` on every worker (``KVError`` on every
        worker naming each value otherwise; see ``kv.agree``); a store without ``agree`` agrees."""
        agree = getattr(self.kv, "agree", None)
        return value if agree is None else agree(at, value)
