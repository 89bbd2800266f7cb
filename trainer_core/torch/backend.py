"""The paths trainer_core.torch reduces over: the workers' collective group, the parameter
servers' KV store, or this process alone (no launcher: a Horovod script run as plain ``python``).

Each backend takes numpy (or cupy) arrays and returns handles with ``wait()`` and ``done()``, every
operation queued in submission order (every rank submits the same operations in the same order).
``Collective`` is ``trainer_core.collective``'s group; ``KV`` runs its store's calls on one
background thread of its own (the tensor operations move bytes: see the class); ``Solo`` answers
at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from trainer_core.collective import ErrorFeedback, Group, spec_for
from trainer_core.collective import job as collective_job
from trainer_core.collective.executor import Executor
from trainer_core.collective.subgroups import Subgroups
from trainer_core.train.comm import KVCommunicator
from trainer_core.xp import like, to_host

from .fusion_settings import Fusion


class Waitable(Protocol):
    def wait(self, timeout: float | None = None) -> Any: ...
    def done(self) -> bool: ...


class Done:
    """A handle whose result is already there."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def wait(self, timeout: float | None = None) -> Any:
        return self._result

    def done(self) -> bool:
        return True


def local_of(hosts: list[str], rank: int) -> tuple[int, int]:
    """``(local_rank, local_size)`` of ``rank`` among the ranks of its host."""
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    return mine.index(rank), len(mine)


class Backend:
    """What every path offers (``Solo``'s behaviour: one rank)."""

    comm = "solo"
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    #: the host of every rank, in rank order, where known (``basics``: cross_rank, is_homogeneous)
    hosts: tuple[str, ...] = ()
    #: the KV store of the ``ps`` path (None elsewhere)
    kv: Any = None
    #: Horovod's tensor fusion settings (``fuse``; None: the defaults)
    fusion: Fusion | None = None

    def fuse(self, fusion: Fusion) -> None:
        """Use ``fusion`` (``init()`` reads it from the environment): the collectives' path fuses
        allreduces with it; on every path ``DistributedOptimizer`` sizes its buckets by it."""
        self.fusion = fusion

    def allreduce_async(
        self,
        array: Any,
        op: str,
        kind: str | None = None,
        out: Any = None,
        name: str | None = None,
        fuse: bool = True,
        waits: bool = False,
    ) -> Waitable:
        """Start reducing ``array``; the result is a fresh array, or ``out`` (written into);
        ``name`` matches it across ranks where the path matches by name (the collectives');
        ``fuse=False``: never fused with others (where the path fuses: the collectives');
        ``waits``: the caller waits for it at once (it ends a fusion cycle)."""
        if op not in ("sum", "mean", "max", "min"):
            raise ValueError(f"allreduce op must be sum, mean, max or min, not {op!r}")
        if out is None:
            return Done(array.copy())
        out[...] = array
        return Done(out)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        return Done(array.copy())

    def broadcast_async(self, array: Any, root: int, name: str | None = None) -> Waitable:
        _check_root(root, self.size)
        return Done(array.copy())

    def allgather_async(self, array: Any, name: str | None = None, counts: bool = False) -> Waitable:
        """Start gathering every rank's rows of ``array`` in rank order; ``counts``: the result is
        ``(rows, each rank's number of rows)`` (a rank that joined gave none)."""
        rows = array.reshape(1) if array.ndim == 0 else array.copy()
        return Done((rows, [rows.shape[0]]) if counts else rows)

    def barrier(self) -> None:
        pass

    def join(self) -> int:
        """Horovod's ``join``: the rank that joined last (with one rank, this one)."""
        return 0

    #: whether process sets other than the global one can run here (the collectives' path)
    has_sets = False

    def add_set(self, ranks: list[int]) -> int:
        """Register a process set of ``ranks`` (not every rank): its id (``collective.subgroups``)."""
        raise ValueError(self.no_sets("a process set of ranks " + str(list(ranks))))

    def remove_set(self, sid: int) -> None:
        raise ValueError(self.no_sets(f"process set {sid}"))

    def subset(self, sid: int, what: str) -> Backend:
        """The backend of process set ``sid`` (this rank must be a member)."""
        raise ValueError(self.no_sets(what))

    def no_sets(self, what: str) -> str:
        """Why ``what`` (an operation in a process set, a registration) is refused on this path."""
        why = (
            "the parameter servers sum each key over every worker (a round waits for all of them), "
            "so some of the workers cannot reduce among themselves there"
            if self.comm == "ps"
            else "this process runs alone, and its only set is the global one"
        )
        return (
            f"{what}: process sets other than the global one run on the collectives' path (-s 0), "
            f"not on this worker's path ({self.comm!r}): {why}"
        )

    def close(self) -> None:
        pass


Solo = Backend


class Collective(Backend):
    """The workers' collective group (``trainer_core.collective``); in a job with servers, ``kv``:
    the KV store on the same node (``train.joint``), closed after the group (it finishes the job)."""

    comm = "allreduce"
    has_sets = True

    def __init__(self, group: Group, kv: Any = None) -> None:
        self.group = group
        self.kv = kv
        self.rank, self.size = group.rank, group.size
        self.local_rank = int(getattr(group, "local_rank", 0))
        self.local_size = int(getattr(group, "local_size", 1))
        known = getattr(group, "hosts", None) or (group.topology.hosts if group.topology else None)
        self.hosts = tuple(str(h) for h in known) if known else ()
        #: the process sets of this group's ranks, and the backends of those this rank is in
        self.sets = Subgroups(group)
        self._subs: dict[int, InSet] = {}

    def add_set(self, ranks: list[int]) -> int:
        return self.sets.add(ranks)

    def remove_set(self, sid: int) -> None:
        self._subs.pop(sid, None)
        self.sets.remove(sid)

    def subset(self, sid: int, what: str) -> Backend:
        if sid == 0:
            return self
        sub = self._subs.get(sid)
        if sub is None:
            sub = self._subs[sid] = InSet(self.sets.group(sid, what), self.sets.members(sid), self)
            if self.fusion is not None:
                sub.fuse(self.fusion)
        return sub

    def fuse(self, fusion: Fusion) -> None:
        """Horovod's tensor fusion in this group (``Group.fuse``) and its process sets' groups."""
        self.fusion = fusion
        self.group.fuse(fusion.threshold, fusion.cycle_s)
        for sub in self._subs.values():
            sub.fuse(fusion)

    def allreduce_async(
        self,
        array: Any,
        op: str,
        kind: str | None = None,
        out: Any = None,
        name: str | None = None,
        fuse: bool = True,
        waits: bool = False,
    ) -> Waitable:
        return self.group.allreduce_async(array, op, out, kind, name=name, fuse=fuse, waits=waits)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        return self.group.compressed_allreduce_async(array, feedback, key, op)

    def broadcast_async(self, array: Any, root: int, name: str | None = None) -> Waitable:
        return self.group.broadcast_async(array, root, name=name)

    def allgather_async(self, array: Any, name: str | None = None, counts: bool = False) -> Waitable:
        return self.group.allgather_async(array, name=name, counts=counts)

    def barrier(self) -> None:
        self.group.barrier()

    def join(self) -> int:
        return self.group.join()

    def workers_waiting(self) -> bool:
        """An elastic job's workers changed since this group formed (workers joined, or left
        while no operation ran): ``hvd.elastic``'s state re-forms at its next commit."""
        node, epoch = getattr(self.group, "node", None), getattr(self.group, "epoch", None)
        return node is not None and epoch is not None and node.changed_since(epoch) is not None

    def reform(self) -> Collective:
        """The backend over the group of the job's current epoch (an elastic job; the node stays)."""
        if not isinstance(self.group, collective_job.JobGroup):
            raise ValueError("only a job's group re-forms (this one was made in process)")
        if self.sets.ids():
            raise ValueError("an elastic job's group re-forms without process sets (remove them first)")
        new = Collective(collective_job.reform(self.group), self.kv)
        if self.fusion is not None:
            new.fuse(self.fusion)
        return new

    def close(self) -> None:
        slots = self.sets.close()
        try:
            if isinstance(self.group, collective_job.JobGroup):
                self.group.close(sets=slots)
            else:
                self.group.close()
        finally:  # after the queued operations: they are in the timeline
            self.sets.stop_timeline()
            if self.kv is not None:  # the node's owner: finishes the job once, stops the node
                self.kv.close()


class InSet(Collective):
    """The backend of a process set this rank is in: its ranks and size are the set's, a
    broadcast's root is a global rank (as Horovod's), and its group belongs to the parent's
    ``Subgroups`` (which closes it)."""

    def __init__(self, group: Group, members: tuple[int, ...], parent: Collective) -> None:
        super().__init__(group)
        self.members = members
        self.hosts = tuple(parent.hosts[m] for m in members) if parent.hosts else ()

    def broadcast_async(self, array: Any, root: int, name: str | None = None) -> Waitable:
        if root not in self.members:
            raise ValueError(f"broadcast's root_rank {root} is not in the process set {list(self.members)}")
        return self.group.broadcast_async(array, self.members.index(root), name=name)

    def add_set(self, ranks: list[int]) -> int:
        raise ValueError("process sets are registered with the global set (hvd.add_process_set)")

    def reform(self) -> Collective:
        raise ValueError("a process set does not re-form; the job's group does")

    def close(self) -> None:
        pass


class KV(Backend):
    """The parameter servers' KV store (``comm="ps"``), on keys of this module's own
    (``__torch__/...``), every call in order on one background thread.

    The tensor operations move bytes (``uint8`` keys, which the store never compresses and which
    sum exactly where the other ranks add zeros): ``broadcast`` from rank 0 is ``init`` (rank 0's
    value stored) and ``pull``; ``allgather`` sums a table where each rank wrote its own rows; and
    ``allreduce`` is an allgather reduced here in rank order (exact, identical on every rank, and
    untouched by the gradients' compression). Sums are refused once a server-side optimizer runs
    (it updates every key on push); ``broadcast`` from rank 0 still works."""

    comm = "ps"

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.rank, self.size = int(kv.rank), int(kv.num_workers)
        table = KVCommunicator(kv)  # exchanges the host names (an uncompressed pushpull)
        hosts = [w.host_id for w in table.workers()]
        self.local_rank, self.local_size = local_of(hosts, self.rank)
        self.hosts = tuple(str(h) for h in hosts)
        self._executor = Executor(f"torch-kv-{self.rank}")
        self._declared: set[str] = set()
        self._seq = 0
        #: set once a server-side optimizer runs: sums of other keys would be updated too
        self.server_optimizer = False

    def submit(self, name: str, fn: Any) -> Waitable:
        """Run ``fn()`` on the store's thread, after everything submitted before."""
        return self._executor.submit(name, lambda _seq: fn())

    def declare(self, keys: list[str], values: list[np.ndarray]) -> None:
        """``init`` the keys not yet declared (every worker, same order; rank 0's values stored)."""
        new = [(k, v) for k, v in zip(keys, values, strict=True) if k not in self._declared]
        if new:
            self.kv.init([k for k, _ in new], [v for _, v in new])
            self._declared.update(k for k, _ in new)

    def _sum_bytes(self, name: str, data: np.ndarray) -> np.ndarray:
        """The sum over the workers of ``data`` (uint8, or int64 counts), on the store's thread."""
        if self.server_optimizer:
            raise ValueError(
                "with a server-side optimizer every key on the servers is updated by it: "
                "allreduce, allgather and broadcast from a rank other than 0 are not available on comm='ps' then"
            )
        key = f"__torch__/{name}/{data.dtype.str}/{data.size}"
        self.declare([key], [np.zeros(data.size, data.dtype)])
        out = np.empty(data.size, data.dtype)
        self.kv.pushpull(key, np.ascontiguousarray(data).reshape(-1), out)
        return out

    def _gather_bytes(self, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's rows of ``host`` (ndim >= 1) in rank order, and the rows per rank."""
        counts = np.zeros(self.size, np.int64)
        counts[self.rank] = host.shape[0]
        counts = self._sum_bytes("rows", counts)
        row = (
            host[0].nbytes if host.shape[0] else int(np.prod(host.shape[1:], dtype=np.int64)) * host.itemsize
        )
        table = np.zeros(int(counts.sum()) * row, np.uint8)
        start = int(counts[: self.rank].sum()) * row
        table[start : start + host.nbytes] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        flat = self._sum_bytes("gather", table).view(host.dtype)
        return flat.reshape(-1, *host.shape[1:]), counts

    def allreduce_async(
        self,
        array: Any,
        op: str,
        kind: str | None = None,
        out: Any = None,
        name: str | None = None,
        fuse: bool = True,
        waits: bool = False,
    ) -> Waitable:
        spec = spec_for(array.dtype, op, kind)  # refuses what the collectives refuse
        host = np.array(to_host(array), copy=True, order="C")

        def run() -> Any:
            rows, _ = self._gather_bytes(host.reshape(1, -1))
            total = rows[0].copy()
            for r in range(1, self.size):
                spec.combine(total, rows[r], total)
            spec.finish(total, self.size)
            result = total.reshape(host.shape)
            if out is None:
                return like(result, array)
            out[...] = like(result, out)
            return out

        return self.submit("allreduce", run)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        raise ValueError("comm='ps' compresses through the KV store (set_gradient_compression), not here")

    def broadcast_async(self, array: Any, root: int, name: str | None = None) -> Waitable:
        _check_root(root, self.size)
        host = np.array(to_host(array), copy=True, order="C")
        data = host.reshape(-1).view(np.uint8)

        def run() -> Any:
            if root == 0:  # ``init`` stores rank 0's value; a pull reads it (no optimizer runs)
                self._seq += 1
                key = f"__torch__/bcast/{self._seq}"
                self.declare([key], [data])
                got = np.empty_like(data)
                self.kv.pull(key, got)
            else:
                got = self._sum_bytes("bcast", data if self.rank == root else np.zeros_like(data))
            return like(got.view(host.dtype).reshape(host.shape), array)

        return self.submit("broadcast", run)

    def allgather_async(self, array: Any, name: str | None = None, counts: bool = False) -> Waitable:
        host = np.array(to_host(array), copy=True, order="C")
        host = host.reshape(1) if host.ndim == 0 else host

        def run() -> Any:
            rows, each = self._gather_bytes(host)
            return (like(rows, array), [int(c) for c in each]) if counts else like(rows, array)

        return self.submit("allgather", run)

    def barrier(self) -> None:
        self.submit("barrier", self.kv.barrier).wait()

    def join(self) -> int:
        if self.size == 1:
            return 0
        raise NotImplementedError(
            "hvd.join() with more than one worker runs on the collectives path (comm='allreduce', a job "
            "launched with -s 0), not on the parameter-server path (comm='ps'): there the workers' "
            "operations are paired by their order with no negotiation, so a worker that joined cannot "
            "learn what the others still submit to stand in for it; give every worker the same number "
            "of batches"
        )

    def reform(self) -> KV:
        """An elastic job's workers changed: the store goes on (the servers' rounds count the
        members); this worker's rank and the size are the current epoch's."""
        book = getattr(getattr(self.kv, "client", None), "book", None)
        if book is not None:
            self.rank, self.size = int(book.rank), int(book.num_workers)
        return self

    def close(self) -> None:
        self._executor.close()
        self.kv.close()


def _check_root(root: int, size: int) -> None:
    if not 0 <= root < size:
        raise ValueError(f"root_rank must be a rank of the job (0..{size - 1}), not {root}")
