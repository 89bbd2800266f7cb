"""``Group``: the collective operations of one set of ranks over one ``Links``.

Every operation exists twice: ``allreduce(...)`` returns the result, ``allreduce_async(...)``
returns a ``Work`` at once (``wait()`` gives the result, ``done()`` polls), the operation running on
the group's background thread (``executor.Executor``) in submission order. Every rank must call the
same operations in the same order with arrays of the same dtype and shape (ragged ``allgather``:
the same dtype and trailing shape).

Arrays are numpy arrays or cupy arrays. A cupy array goes through NCCL on the device
(``nccl.NcclPath``, the ``nccl`` argument: a ``JobGroup`` has one when every rank can use NCCL)
where NCCL takes it; otherwise (no NCCL path, a dtype NCCL lacks, a compressed allreduce, a
barrier) it is copied to host memory, reduced there and copied back. A result is a fresh array;
``allreduce``'s ``out`` receives it instead (``out`` may be the input itself). A synchronous ``allreduce`` of a C-contiguous numpy array runs on the
calling thread when no operation is queued, reading the input and writing ``out`` in place
(no private copies).

Where the ranks of a host share a segment (``hostsegment.Local``: the ``local`` argument, or the links'
``local`` attribute, as ``NetLinks`` has), the allreduce goes through it
(``algorithms.shmreduce``): alone when every rank is on the host, else as the local part of the
hierarchical allreduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainer_core.compression.powersgd import PowerSGD
from trainer_core.xp import like, to_host

from . import fusion, policy
from .algorithms import doubling, hierarchical, ring, shmpipe, shmreduce, tree
from .algorithms.hierarchical import Topology
from .compressed import hierarchical as compressed_hierarchical
from .compressed import lowrank, twostage
from .executor import Executor, Work
from .nccl import NcclPath
from .policy import Thresholds
from .primitives.hostsegment import Local
from .primitives.links import Ctx, Links, Scratch, SubLinks
from .primitives.operands import dtype_of, root_rank
from .primitives.reduce import FLOAT_DTYPES, ReduceSpec, spec_for


class Group:
    """The collectives of ``links.size`` ranks; ``hosts`` (host of each rank) enables the
    hierarchical path; ``thresholds`` overrides the algorithm choice; ``local``: this rank's use of
    its host's shared-memory segment (default: ``links.local`` where the links have one)."""

    def __init__(
        self,
        links: Links,
        hosts: Sequence[str] | None = None,
        thresholds: Thresholds | None = None,
        local: Local | None = None,
        nccl: NcclPath | None = None,
    ) -> None:
        if hosts is not None and len(hosts) != links.size:
            raise ValueError(f"hosts lists {len(hosts)} ranks for a group of {links.size}")
        self.links = links
        self.topology = None if hosts is None else Topology.of(hosts)
        self.local = local if local is not None else getattr(links, "local", None)
        if self.local is not None and (
            self.topology is None or self.local.members != self.topology.local(links.rank)
        ):
            raise ValueError("a shared-memory segment serves the ranks of this rank's host (give hosts)")
        self.thresholds = thresholds or Thresholds()
        #: the NCCL path of device arrays, when every rank can use it (``nccl.agree``)
        self.nccl = nccl
        self._executor = Executor(f"collective-{links.rank}")
        self._scratch = Scratch()
        #: the algorithm of the last allreduce (for tests and logs)
        self.last_algorithm = ""

    @property
    def rank(self) -> int:
        return self.links.rank

    @property
    def size(self) -> int:
        return self.links.size

    def close(self) -> None:
        """Finish the queued operations and stop the background thread."""
        self._executor.close()
        if self.nccl is not None:
            self.nccl.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, name: str, fn: Callable[[Ctx], Any]) -> Work:
        return self._executor.submit(name, lambda seq: fn(Ctx.for_op(self.links, seq, self._scratch)))

    # -- allreduce ----------------------------------------------------------------------------
    def allreduce_async(self, array: Any, op: str = "sum", out: Any = None, kind: str | None = None) -> Work:
        """Start reducing ``array`` over all ranks (``op``: sum, mean, max, min; ``kind="bfloat16"``
        for bfloat16 bits in a uint16 array). ``out=array`` (a C-contiguous numpy array) lends it:
        it is read and written in place when the operation runs, without a private copy, and is the
        operation's until ``wait()``."""
        spec = spec_for(dtype_of(array), op, kind)
        if self.nccl is not None and self.nccl.takes(array, spec):
            _check_out(array, out)
            return self._submit("allreduce", self.nccl.allreduce(array, spec, out))
        lent = out is array and _plain(array)
        host = array if lent else np.array(to_host(array), copy=True, order="C")
        _check_out(host, out)

        def run(ctx: Ctx) -> Any:
            flat = host.reshape(-1)
            self._allreduce_into(ctx, flat, flat, spec)
            spec.finish(flat, self.size)
            return out if lent else _deliver(host, array, out)

        return self._submit("allreduce", run)

    def allreduce(self, array: Any, op: str = "sum", out: Any = None, kind: str | None = None) -> Any:
        if self.nccl is not None or not (_plain(array) and (out is None or _plain(out))):
            return self.allreduce_async(array, op, out, kind).wait()
        spec = spec_for(dtype_of(array), op, kind)
        _check_out(array, out)

        def run(seq: int) -> Any:
            dest = np.empty_like(array) if out is None else out
            flat = dest.reshape(-1)
            self._allreduce_into(Ctx.for_op(self.links, seq, self._scratch), array.reshape(-1), flat, spec)
            spec.finish(flat, self.size)
            return dest

        return self._executor.call("allreduce", run)

    def _allreduce_into(self, ctx: Ctx, x: np.ndarray, out: np.ndarray, spec: ReduceSpec) -> None:
        """``out`` (may be ``x``) becomes the reduction of every rank's flat ``x``."""
        th, loc = self.thresholds, self.local
        algo = self.last_algorithm = policy.choose(x.nbytes, self.topology, th, loc is not None)
        if x.size and self.size > 1 and loc is not None and algo in (policy.SHM, policy.HIERARCHICAL):
            split = policy.shm_split(x.nbytes, loc.size, th)
            if algo == policy.SHM:
                shmreduce.allreduce(loc, x, out, spec, split)
                return
            pieces = policy.pipeline_pieces(x.nbytes, th, shmpipe.MAX_PIECES)
            if pieces > 1:  # the leaders' allreduce of each piece overlaps the host's phases
                shmpipe.allreduce(loc, x, out, spec, pieces, lambda j, buf: self._leaders(ctx, buf, spec, j))
            else:
                shmreduce.allreduce(loc, x, out, spec, split, lambda buf: self._leaders(ctx, buf, spec, 0))
            return
        if out is not x:
            np.copyto(out, x)
        self._allreduce_flat(ctx, out, spec, algo)

    def _allreduce_flat(self, ctx: Ctx, flat: np.ndarray, spec: ReduceSpec, algo: str | None = None) -> None:
        th = self.thresholds
        if algo is None:
            algo = self.last_algorithm = policy.choose(flat.nbytes, self.topology, th)
        if algo == policy.HIERARCHICAL:
            assert self.topology is not None
            cuts = ring.blocks(flat.size, policy.pipeline_pieces(flat.nbytes, th, shmpipe.MAX_PIECES))

            def leaders(_ctx: Ctx, buf: np.ndarray, _spec: ReduceSpec) -> None:  # as shmpipe cuts it
                for j, (a, b) in enumerate(cuts):
                    self._leaders(ctx, buf[a:b], spec, j)

            hierarchical.allreduce(ctx, flat, spec, self.topology, leaders)
        else:
            self._flat_allreduce(ctx, flat, spec, algo)

    def _leaders(self, ctx: Ctx, buf: np.ndarray, spec: ReduceSpec, piece: int) -> None:
        """The hosts' leaders' allreduce of ``piece`` of the hierarchical path, in tag phase
        ``1 + piece`` of the operation (the host's own phases run on other pairs of ranks)."""
        assert self.topology is not None
        self._flat_allreduce(ctx.phase(1 + piece).on(SubLinks(ctx.links, self.topology.leaders())), buf, spec)

    def _flat_allreduce(self, ctx: Ctx, flat: np.ndarray, spec: ReduceSpec, algo: str | None = None) -> None:
        th = self.thresholds
        if algo is None or algo in (policy.HIERARCHICAL, policy.SHM):
            algo = policy.flat_algorithm(flat.nbytes, th)
        if algo == policy.RING:
            ring.allreduce(ctx, flat, spec, th.segment_bytes)
        else:
            doubling.allreduce(ctx, flat, spec)

    def grouped_allreduce_async(
        self, arrays: Sequence[Any], op: str = "sum", kind: str | None = None
    ) -> Work:
        """Reduce many arrays at once, fused into buckets of one dtype of at most
        ``thresholds.fusion_bytes``; the result is the list of reduced arrays."""
        specs = [spec_for(dtype_of(a), op, kind) for a in arrays]
        sizes = [(s.kind, int(a.nbytes)) for s, a in zip(specs, arrays, strict=True)]
        buckets = fusion.plan(sizes, self.thresholds.fusion_bytes)
        nccl = self.nccl
        if arrays and nccl is not None and all(nccl.takes(a, s) for a, s in zip(arrays, specs, strict=True)):
            return self._submit("grouped_allreduce", nccl.grouped_allreduce(arrays, specs, buckets))
        hosts = [to_host(a) for a in arrays]
        packed = [fusion.pack(hosts, b) for b in buckets]

        def run(ctx: Ctx) -> list[Any]:
            results: list[Any] = [None] * len(arrays)
            for i, (bucket, buf) in enumerate(zip(buckets, packed, strict=True)):
                spec = specs[bucket[0]]
                self._allreduce_into(ctx.phase(i % 15), buf, buf, spec)
                spec.finish(buf, self.size)
                fusion.unpack(buf, hosts, bucket, results)
            return [like(r, a) for r, a in zip(results, arrays, strict=True)]

        return self._submit("grouped_allreduce", run)

    def grouped_allreduce(self, arrays: Sequence[Any], op: str = "sum", kind: str | None = None) -> list[Any]:
        return self.grouped_allreduce_async(arrays, op, kind).wait()

    def compressed_allreduce_async(
        self, array: Any, state: twostage.ErrorFeedback, key: Any = 0, op: str = "mean"
    ) -> Work:
        """Reduce ``array`` compressed with ``state``'s compressor, with error feedback kept in
        ``state`` under ``key`` (one key per tensor; see ``compressed.twostage``, and ``lowrank`` for
        ``powersgd``)."""
        if np.dtype(dtype_of(array)) not in FLOAT_DTYPES:
            raise TypeError(f"compressed allreduce takes float16/32/64 arrays, not {np.dtype(array.dtype)}")
        if op not in twostage.OPS:
            raise ValueError(f"compressed allreduce sums or averages, not {op!r}")
        host = np.array(to_host(array), copy=True, order="C")
        return self._submit("compressed_allreduce", self._compressed(array, host, state, key, op))

    def _compressed(
        self, array: Any, host: np.ndarray, state: twostage.ErrorFeedback, key: Any, op: str
    ) -> Callable[[Ctx], Any]:
        """The compressed allreduce of ``host`` (``array`` on the host, read and never written) as
        a function of the operation's ``Ctx``."""
        if np.dtype(dtype_of(array)) not in FLOAT_DTYPES:
            raise TypeError(f"compressed allreduce takes float16/32/64 arrays, not {np.dtype(array.dtype)}")
        if op not in twostage.OPS:
            raise ValueError(f"compressed allreduce sums or averages, not {op!r}")
        spec = spec_for(dtype_of(array), op)
        topo = self.topology
        hier = compressed_hierarchical.takes(topo)
        st = state.key(key, topo.nhosts if hier and topo is not None else self.size)

        def run(ctx: Ctx) -> Any:
            if isinstance(st.server, PowerSGD):  # its own form: P and Q are allreduced
                return like(lowrank.allreduce(ctx, host, spec, st.server, self._flat_allreduce), array)
            if hier and topo is not None:
                x = host.reshape(-1)
                flat = compressed_hierarchical.allreduce(ctx, x, spec, st, topo, self.local, self.thresholds)
            else:
                flat = twostage.allreduce(ctx, host.reshape(-1), spec, st)
            return like(flat.reshape(host.shape), array)

        return run

    def compressed_allreduce(
        self, array: Any, state: twostage.ErrorFeedback, key: Any = 0, op: str = "mean"
    ) -> Any:
        if self.nccl is not None or not _plain(array) or state.params.get("type") == "powersgd":
            return self.compressed_allreduce_async(array, state, key, op).wait()
        run = self._compressed(array, array, state, key, op)  # reads the array in place, no copy
        return self._executor.call(
            "compressed_allreduce", lambda seq: run(Ctx.for_op(self.links, seq, self._scratch))
        )

    # -- the others -----------------------------------------------------------------------------
    def broadcast_async(self, array: Any, root: int = 0) -> Work:
        """Start sending ``root``'s ``array`` to every rank; the result is a fresh array."""
        root = root_rank("broadcast root", root, self.size)
        if self.nccl is not None and self.nccl.takes(array):
            return self._submit("broadcast", self.nccl.broadcast(array, root))
        host = np.array(to_host(array), copy=True, order="C")

        def run(ctx: Ctx) -> Any:
            tree.broadcast(ctx, host.reshape(-1).view(np.uint8), root, self.thresholds.segment_bytes)
            return like(host, array)

        return self._submit("broadcast", run)

    def broadcast(self, array: Any, root: int = 0) -> Any:
        return self.broadcast_async(array, root).wait()

    def allgather_async(self, array: Any) -> Work:
        """Start concatenating every rank's ``array`` along the first axis, in rank order; the first
        dimension may differ between ranks (ragged)."""
        if self.nccl is not None and self.nccl.takes(array):
            return self._submit("allgather", self.nccl.allgather(array))
        host = np.ascontiguousarray(to_host(array))
        if host.ndim == 0:
            host = host.reshape(1)

        def run(ctx: Ctx) -> Any:
            flat, _ = ring.ragged_allgather(
                ctx, host.view(np.uint8).reshape(-1), self.thresholds.segment_bytes
            )
            rows = flat.view(host.dtype).reshape(-1, *host.shape[1:])
            return like(rows, array)

        return self._submit("allgather", run)

    def allgather(self, array: Any) -> Any:
        return self.allgather_async(array).wait()

    def reduce_scatter_async(self, array: Any, op: str = "sum", kind: str | None = None) -> Work:
        """Start reducing ``array`` and keep this rank's block of the first axis (the rows split as
        ``numpy.array_split`` does: the first ``rows % size`` ranks get one more)."""
        spec = spec_for(dtype_of(array), op, kind)
        if array.ndim == 0:
            raise ValueError("reduce_scatter needs an array with at least one axis")
        if self.nccl is not None and self.nccl.takes(array, spec):
            return self._submit("reduce_scatter", self.nccl.reduce_scatter(array, spec))
        host = np.array(to_host(array), copy=True, order="C")

        def run(ctx: Ctx) -> Any:
            rows = ring.blocks(host.shape[0], self.size)
            row = int(np.prod(host.shape[1:], dtype=np.int64))
            flat = host.reshape(-1)
            bounds = [(a * row, b * row) for a, b in rows]
            ring.reduce_scatter(ctx, flat, spec, self.thresholds.segment_bytes, bounds)
            a, b = rows[self.rank]
            mine = host[a:b].copy()
            spec.finish(mine.reshape(-1), self.size)
            return like(mine, array)

        return self._submit("reduce_scatter", run)

    def reduce_scatter(self, array: Any, op: str = "sum", kind: str | None = None) -> Any:
        return self.reduce_scatter_async(array, op, kind).wait()

    def barrier_async(self) -> Work:
        return self._submit("barrier", doubling.barrier)

    def barrier(self) -> None:
        self.barrier_async().wait()


def _plain(a: Any) -> bool:
    """A C-contiguous numpy array (the synchronous allreduce uses it in place)."""
    return isinstance(a, np.ndarray) and a.flags.c_contiguous


def _check_out(host: Any, out: Any) -> None:
    if out is not None and (tuple(out.shape) != host.shape or out.dtype != host.dtype):
        raise ValueError(f"out must be a {host.dtype} array of shape {host.shape}")


def _deliver(host: np.ndarray, template: Any, out: Any) -> Any:
    if out is None:
        return like(host, template)
    out[...] = like(host, out)
    return out
