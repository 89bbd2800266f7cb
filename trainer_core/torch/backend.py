"""The paths trainer_core.torch reduces over: the workers' collective group, the parameter
servers' KV store, or this process alone (no launcher: a Horovod script run as plain ``python``).

Each backend takes numpy (or cupy) arrays and returns handles with ``wait()`` and ``done()``, every
operation queued in submission order (every rank submits the same operations in the same order).
``Collective`` is ``trainer_core.collective``'s group; ``KV`` runs its store's calls on one
background thread of its own (``pushpull`` sums; broadcast and allgather are sums where the other
ranks add zeros, so they are exact); ``Solo`` answers at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from trainer_core.collective import ErrorFeedback, Group
from trainer_core.collective.executor import Executor
from trainer_core.train.comm import KVCommunicator


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
    #: the KV store of the ``ps`` path (None elsewhere)
    kv: Any = None

    def allreduce_async(self, array: Any, op: str, kind: str | None = None, out: Any = None) -> Waitable:
        """Start reducing ``array``; the result is a fresh array, or ``out`` (written into)."""
        if op not in ("sum", "mean", "max", "min"):
            raise ValueError(f"allreduce op must be sum, mean, max or min, not {op!r}")
        if out is None:
            return Done(array.copy())
        out[...] = array
        return Done(out)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        return Done(array.copy())

    def broadcast_async(self, array: Any, root: int) -> Waitable:
        _check_root(root, self.size)
        return Done(array.copy())

    def allgather_async(self, array: Any) -> Waitable:
        return Done(array.reshape(1) if array.ndim == 0 else array.copy())

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


Solo = Backend


class Collective(Backend):
    """The workers' collective group (``trainer_core.collective``; jobs without servers)."""

    comm = "allreduce"

    def __init__(self, group: Group) -> None:
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.local_rank = int(getattr(group, "local_rank", 0))
        self.local_size = int(getattr(group, "local_size", 1))

    def allreduce_async(self, array: Any, op: str, kind: str | None = None, out: Any = None) -> Waitable:
        return self.group.allreduce_async(array, op, out, kind)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        return self.group.compressed_allreduce_async(array, feedback, key, op)

    def broadcast_async(self, array: Any, root: int) -> Waitable:
        return self.group.broadcast_async(array, root)

    def allgather_async(self, array: Any) -> Waitable:
        return self.group.allgather_async(array)

    def barrier(self) -> None:
        self.group.barrier()

    def close(self) -> None:
        self.group.close()


#: the dtypes the KV store carries (others travel as float32 or raise)
_KV_DTYPES = frozenset(np.dtype(t) for t in ("f2", "f4", "f8", "i4", "i8", "u1", "i1"))


class KV(Backend):
    """The parameter servers' KV store (``comm="ps"``): sums are ``pushpull``s on keys of this
    module's own (``__torch__/...``), run in order on one background thread."""

    comm = "ps"

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.rank, self.size = int(kv.rank), int(kv.num_workers)
        table = KVCommunicator(kv)  # exchanges the host names (an uncompressed pushpull)
        self.local_rank, self.local_size = local_of([w.host_id for w in table.workers()], self.rank)
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

    def _sum(self, name: str, array: np.ndarray) -> np.ndarray:
        """The sum over the workers of ``array`` (on the store's thread)."""
        if self.server_optimizer:
            raise ValueError(
                "with a server-side optimizer every key on the servers is updated by it: "
                "trainer_core.torch's allreduce/allgather/broadcast(root_rank != 0) are not available on comm='ps' then"
            )
        key = f"__torch__/{name}/{array.dtype.str}/{array.size}"
        self.declare([key], [np.zeros(array.size, array.dtype)])
        out = np.empty(array.size, array.dtype)
        self.kv.pushpull(key, np.ascontiguousarray(array).reshape(-1), out)
        return out.reshape(array.shape)

    def allreduce_async(self, array: Any, op: str, kind: str | None = None, out: Any = None) -> Waitable:
        if op not in ("sum", "mean"):
            raise ValueError(f"comm='ps' sums or averages, not {op!r}")
        host, back = _to_kv(np.asarray(array), kind)

        def run() -> np.ndarray:
            total = self._sum("reduce", host)
            if op == "mean":
                total = total / np.asarray(self.size, total.dtype)
            return back(total)

        return self.submit("allreduce", run)

    def compressed_allreduce_async(self, array: Any, feedback: ErrorFeedback, key: Any, op: str) -> Waitable:
        raise ValueError("comm='ps' compresses through the KV store (set_gradient_compression), not here")

    def broadcast_async(self, array: Any, root: int) -> Waitable:
        _check_root(root, self.size)
        host, back = _to_kv(np.asarray(array), "bfloat16" if array.dtype == np.uint16 else None)
        if root == 0:  # ``init`` stores rank 0's value; a pull reads it (no optimizer runs)

            def first() -> np.ndarray:
                self._seq += 1
                key = f"__torch__/bcast/{self._seq}"
                self.declare([key], [host.reshape(-1)])
                out = np.empty(host.size, host.dtype)
                self.kv.pull(key, out)
                return back(out.reshape(host.shape))

            return self.submit("broadcast", first)
        mine = host if self.rank == root else np.zeros_like(host)
        return self.submit("broadcast", lambda: back(self._sum("bcast", mine)))

    def allgather_async(self, array: Any) -> Waitable:
        host, back = _to_kv(np.asarray(array), "bfloat16" if array.dtype == np.uint16 else None)
        host = host.reshape(1) if host.ndim == 0 else host

        def run() -> np.ndarray:
            counts = np.zeros(self.size, np.int64)
            counts[self.rank] = host.shape[0]
            counts = self._sum("rows", counts)
            row = int(np.prod(host.shape[1:], dtype=np.int64))
            table = np.zeros((int(counts.sum()), *host.shape[1:]), host.dtype)
            start = int(counts[: self.rank].sum())
            table[start : start + host.shape[0]] = host
            return back(self._sum(f"gather{row}", table))

        return self.submit("allgather", run)

    def barrier(self) -> None:
        self.submit("barrier", self.kv.barrier).wait()

    def close(self) -> None:
        self._executor.close()
        self.kv.close()


def _to_kv(host: np.ndarray, kind: str | None) -> tuple[np.ndarray, Any]:
    """``host`` in a dtype the KV store carries, and the function that turns a result back."""
    if kind == "bfloat16":  # bits to float32 (exact) and back, rounded to nearest
        from trainer_core.collective import bf16_to_f32, f32_to_bf16

        return bf16_to_f32(np, host), lambda r: f32_to_bf16(np, r)
    dt = np.dtype(host.dtype)
    if dt in _KV_DTYPES:
        return host, lambda r: r
    if dt == np.dtype(bool) or dt.kind in "iu":
        return host.astype(np.int64), lambda r: r.astype(dt)
    raise TypeError(f"comm='ps' carries float16/32/64, bfloat16 and integer tensors, not {dt}")


def _check_root(root: int, size: int) -> None:
    if not 0 <= root < size:
        raise ValueError(f"root_rank must be a rank of the job (0..{size - 1}), not {root}")
