"""NCCL for device arrays: a group's collectives on GPU memory, with no copy through the host.

A group takes this path when every one of its ranks can use NCCL (``agree``: a collective of the
host path, run once when the job's group is made; rank 0's NCCL id reaches the others through
it). Then a cupy array goes through NCCL; a numpy array, an int16/uint16 reduction (NCCL has no
such type), a compressed allreduce and a barrier go through host memory as before. The
communicator itself is made on the first device operation, on the group's background thread,
on the array's device.

Results follow the host path's rules: ``mean`` is NCCL's sum, then divided on the device as the
host path does; every rank gets the same bits (NCCL reduces each element once and sends the
result round); ``reduce_scatter`` with rows that do not divide evenly reduces everything and
keeps this rank's rows (NCCL's own needs equal blocks); ``allgather`` is ragged-safe (each
rank's block broadcast from it, in one NCCL group call, unless every block has one length).

Each operation is enqueued on the caller's current CUDA stream at the time of the call (so after
whatever produced the input there), on a copy of the input taken then, and ``Work.wait()``
returns once the stream has finished it.

Written against the ``Nccl`` calls of cupy's ``cupy.cuda.nccl`` (pointers, counts, NCCL type and
op numbers); the tests run it on numpy arrays with a stand-in for those calls, so its pointer and
count arithmetic and its choices are tested here while NCCL itself runs only on a GPU machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from trainer_core.xp import array_module, cupy_module, is_device_array

from .algorithms import ring
from .primitives.links import Ctx
from .primitives.reduce import BFLOAT16, ReduceSpec

#: the NCCL type of each kind the collectives reduce (int16 and uint16 have none)
NCCL_TYPES = {
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64",
    "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    BFLOAT16: "NCCL_BFLOAT16",
}
#: ``mean`` is a sum divided afterwards (``ReduceSpec.finish``), as on the host path
NCCL_OPS = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}
#: the length of an NCCL unique id (``ncclUniqueId``: 128 bytes)
ID_BYTES = 128


def nccl_names(spec: ReduceSpec) -> tuple[str, str] | None:
    """The NCCL type and op names of ``spec``; ``None`` where NCCL cannot reduce it."""
    dtype = NCCL_TYPES.get(spec.kind)
    return None if dtype is None else (dtype, NCCL_OPS[spec.op])


def load() -> Any | None:
    """cupy's NCCL binding when cupy is usable here and NCCL's library loads, else ``None``."""
    cupy = cupy_module()
    if cupy is None:
        return None
    try:
        from cupy.cuda import nccl  # type: ignore[import-not-found, unused-ignore]
    except Exception:  # no libnccl: the host path
        return None
    return nccl if getattr(nccl, "available", True) and hasattr(nccl, "NcclCommunicator") else None


class HostCollectives(Protocol):
    """What ``agree`` needs of the group's host path."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allgather(self, array: Any) -> Any: ...

    def broadcast(self, array: Any, root: int = 0) -> Any: ...


def agree(
    host: HostCollectives, nccl: Any | None, where: tuple[int, int] | None = None, log: Any = None
) -> NcclPath | None:
    """Every rank says whether it can use NCCL (``nccl``: the binding, or ``None``) and where it
    runs (``where``: its host's and its GPU's ids, default ``device_here()``); when all can and no
    two ranks share one GPU, rank 0's NCCL id is broadcast and each rank gets its ``NcclPath``,
    else every rank gets ``None``. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"),
    so such a job (several workers on a one-GPU machine) reduces device arrays through host
    memory instead; ``log`` (rank 0's) says so. A collective: every rank of the group calls it
    once, at the same point."""
    mine = (0, 0) if nccl is None else (where if where is not None else device_here())
    said = host.allgather(np.array([nccl is not None, *mine], dtype=np.uint64)).reshape(-1, 3)
    if nccl is None or host.size < 2 or not bool(np.all(said[:, 0])):
        return None
    shared = shared_devices([(int(h), int(d)) for _, h, d in said])
    if shared:
        if log is not None and host.rank == 0:
            log.warning(
                "collective: ranks %s share one GPU, which NCCL refuses: device arrays are reduced "
                "through host memory (give each worker its own GPU for NCCL)",
                " and ".join(str(r) for r in shared),
            )
        return None
    uid = np.zeros(ID_BYTES, dtype=np.int16)  # the id's bytes as cupy gives them (signed chars)
    if host.rank == 0:
        uid[:] = id_values(nccl.get_unique_id())
    uid = host.broadcast(uid, 0)
    return NcclPath(nccl, host.rank, host.size, tuple(int(b) for b in uid))


def id_values(raw: Any) -> np.ndarray:
    """An NCCL unique id as its 128 signed byte values: cupy before 14 gives a tuple of them,
    cupy 14 the id's bytes."""
    if isinstance(raw, (bytes, bytearray)):
        return np.frombuffer(bytes(raw), dtype=np.int8).astype(np.int16)
    return np.asarray(raw, dtype=np.int16)


def shared_devices(places: Sequence[tuple[int, int]]) -> list[int]:
    """The ranks whose (host id, GPU id) another rank has too (a GPU id of 0: unknown, never
    shared)."""
    seen = Counter(places)
    return [r for r, p in enumerate(places) if p[1] != 0 and seen[p] > 1]


def _id(text: str) -> int:
    """A stable 63-bit id of ``text`` (not Python's salted ``hash``); never 0."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1 | 1


def device_here() -> tuple[int, int]:
    """This process's host id and its current GPU's id (from its PCI bus id; 0 where unknown)."""
    host = _id(socket.gethostname())
    cupy = cupy_module()
    try:
        return host, (0 if cupy is None else _id(cupy.cuda.Device().pci_bus_id))
    except Exception:  # no device to ask: NCCL will say what is wrong when it is used
        return host, 0


def _pointer(a: Any) -> int:
    return int(a.data.ptr) if is_device_array(a) else int(a.ctypes.data)


def _stream_of_caller() -> Any:
    cupy = cupy_module()
    return None if cupy is None else cupy.cuda.get_current_stream()


def _on_device(a: Any) -> Any:
    return a.device if is_device_array(a) else contextlib.nullcontext()


class NcclPath:
    """One rank's NCCL communicator (made on first use) and the collectives that run on it;
    ``accepts``: which arrays take this path (device arrays; the tests pass numpy arrays)."""

    def __init__(
        self,
        nccl: Any,
        rank: int,
        size: int,
        uid: tuple[int, ...],
        accepts: Callable[[Any], bool] = is_device_array,
    ) -> None:
        self.nccl, self.rank, self.size, self.uid = nccl, rank, size, uid
        self.accepts = accepts
        self._comm: Any = None

    def takes(self, array: Any, spec: ReduceSpec | None = None) -> bool:
        """Whether ``array`` (reduced as ``spec``) goes through NCCL."""
        return self.accepts(array) and (spec is None or nccl_names(spec) is not None)

    def comm(self) -> Any:
        """The communicator (made by every rank at its first device operation: a collective)."""
        if self._comm is None:
            try:
                self._comm = self.nccl.NcclCommunicator(self.size, self.uid, self.rank)
            except TypeError:  # cupy 14 takes the id as bytes (before: a tuple of signed chars)
                as_bytes = bytes(b & 0xFF for b in self.uid)
                self._comm = self.nccl.NcclCommunicator(self.size, as_bytes, self.rank)
        return self._comm

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    def _constant(self, name: str) -> int:
        return int(getattr(self.nccl, name))

    def _run(self, array: Any, body: Callable[[Any, int, Ctx], Any]) -> Callable[[Ctx], Any]:
        """An operation for the group's executor: ``body(comm, stream, ctx)`` on ``array``'s
        device and the caller's stream (taken now), then the stream synchronised."""
        stream = _stream_of_caller()
        ptr = 0 if stream is None else int(stream.ptr)

        def run(ctx: Ctx) -> Any:
            with _on_device(array):
                result = body(self.comm(), ptr, ctx)
                if stream is not None:
                    stream.synchronize()
            return result

        return run

    @staticmethod
    def _copy(array: Any) -> Any:
        """A C-contiguous copy of ``array`` on its own device, enqueued now on the caller's stream."""
        with _on_device(array):
            return array_module(array).array(array, copy=True, order="C")

    # -- the operations: each returns the function the group's executor runs -----------------
    def allreduce(self, array: Any, spec: ReduceSpec, out: Any = None) -> Callable[[Ctx], Any]:
        names = nccl_names(spec)
        assert names is not None, f"NCCL cannot reduce {spec.kind}"
        dtype, op = (self._constant(n) for n in names)
        buf = self._copy(array)  # taken now, on the caller's stream

        def body(comm: Any, stream: int, ctx: Ctx) -> Any:
            flat = buf.reshape(-1)
            if flat.size:
                comm.allReduce(_pointer(flat), _pointer(flat), flat.size, dtype, op, stream)
            spec.finish(flat, self.size)
            if out is None:
                return buf
            out[...] = buf
            return out

        return self._run(array, body)

    def broadcast(self, array: Any, root: int) -> Callable[[Ctx], Any]:
        buf = self._copy(array)
        uint8 = self._constant("NCCL_UINT8")

        def body(comm: Any, stream: int, ctx: Ctx) -> Any:
            if buf.nbytes:
                comm.bcast(_pointer(buf), buf.nbytes, uint8, root, stream)
            return buf

        return self._run(array, body)

    def allgather(self, array: Any, counts: bool = False) -> Callable[[Ctx], Any]:
        """Every rank's ``array`` along axis 0 in rank order (the first axis may differ: the lengths
        are exchanged first over the host path); ``counts``: ``(result, rows of each rank)``."""
        xp = array_module(array)
        local = self._copy(array)
        if local.ndim == 0:
            local = local.reshape(1)
        row_bytes = int(np.prod(local.shape[1:], dtype=np.int64)) * local.dtype.itemsize
        uint8 = self._constant("NCCL_UINT8")

        def body(comm: Any, stream: int, ctx: Ctx) -> Any:
            result, rows = gather(comm, stream, ctx)
            return (result, rows) if counts else result

        def gather(comm: Any, stream: int, ctx: Ctx) -> tuple[Any, list[int]]:
            lengths = np.zeros(self.size, dtype=np.int64)
            lengths[self.rank] = local.shape[0]
            ring.allgather(ctx.phase(0), lengths, [(r, r + 1) for r in range(self.size)])
            rows = [int(c) for c in lengths]
            result = xp.empty((sum(rows), *local.shape[1:]), dtype=local.dtype)
            flat = result.reshape(-1).view(np.uint8)
            mine = local.reshape(-1).view(np.uint8)
            if len(set(rows)) == 1:
                if mine.size:
                    comm.allGather(_pointer(mine), _pointer(flat), mine.size, uint8, stream)
                return result, rows
            self.nccl.groupStart()
            try:
                start = 0
                for root, n in enumerate(rows):
                    part = flat[start : start + n * row_bytes]
                    if root == self.rank and part.size:
                        part[...] = mine
                    if part.size:
                        comm.bcast(_pointer(part), part.size, uint8, root, stream)
                    start += n * row_bytes
            finally:
                self.nccl.groupEnd()
            return result, rows

        return self._run(array, body)

    def reduce_scatter(self, array: Any, spec: ReduceSpec) -> Callable[[Ctx], Any]:
        """This rank's rows (split as ``numpy.array_split``) of the reduction of ``array``."""
        names = nccl_names(spec)
        assert names is not None, f"NCCL cannot reduce {spec.kind}"
        dtype, op = (self._constant(n) for n in names)
        xp = array_module(array)
        buf = self._copy(array)
        blocks = ring.blocks(buf.shape[0], self.size)
        a, b = blocks[self.rank]

        def body(comm: Any, stream: int, ctx: Ctx) -> Any:
            flat = buf.reshape(-1)
            if len({hi - lo for lo, hi in blocks}) == 1:  # equal blocks: NCCL's reduce-scatter
                mine = xp.empty((b - a, *buf.shape[1:]), dtype=buf.dtype)
                if mine.size:
                    comm.reduceScatter(_pointer(flat), _pointer(mine), mine.size, dtype, op, stream)
            else:
                if flat.size:
                    comm.allReduce(_pointer(flat), _pointer(flat), flat.size, dtype, op, stream)
                mine = buf[a:b].copy()
            spec.finish(mine.reshape(-1), self.size)
            return mine

        return self._run(array, body)

    def grouped_allreduce(
        self, arrays: Sequence[Any], specs: Sequence[ReduceSpec], buckets: Sequence[Sequence[int]]
    ) -> Callable[[Ctx], list[Any]]:
        """Each bucket of arrays (one kind each) packed on the device, reduced in one call and cut
        back to the arrays' shapes."""
        xp = array_module(arrays[0])
        with _on_device(arrays[0]):
            packed = [xp.concatenate([xp.ravel(arrays[i]) for i in bucket]) for bucket in buckets]

        def body(comm: Any, stream: int, ctx: Ctx) -> list[Any]:
            results: list[Any] = [None] * len(arrays)
            for bucket, buf in zip(buckets, packed, strict=True):
                spec = specs[bucket[0]]
                names = nccl_names(spec)
                assert names is not None, f"NCCL cannot reduce {spec.kind}"
                dtype, op = (self._constant(n) for n in names)
                if buf.size:
                    comm.allReduce(_pointer(buf), _pointer(buf), buf.size, dtype, op, stream)
                spec.finish(buf, self.size)
                start = 0
                for i in bucket:
                    n = int(np.prod(arrays[i].shape, dtype=np.int64))
                    results[i] = buf[start : start + n].reshape(arrays[i].shape)
                    start += n
            return results

        return self._run(arrays[0], body)
