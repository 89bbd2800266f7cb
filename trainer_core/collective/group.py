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
from dataclasses import replace
from typing import Any

import numpy as np

from trainer_core.compression.powersgd import PowerSGD
from trainer_core.xp import like, to_host

from . import fusion, joining, moves, policy, speculation
from .agreement import Descriptor, agreed, body, record
from .algorithms import doubling, hierarchical, ring, shmpipe, shmreduce
from .algorithms.hierarchical import Topology
from .compressed import hierarchical as compressed_hierarchical
from .compressed import lowrank, twostage
from .compressed.twostage import ErrorFeedback
from .exchange import Exchange
from .executor import Work
from .lane import LANES, Lane, check_array, check_out, deliver, dtype_name, plain
from .nccl import NcclPath
from .negotiator import NOT_RUN, Negotiator, Op
from .policy import Thresholds
from .primitives.hostsegment import Local
from .primitives.links import Ctx, Links, Scratch, SubLinks
from .primitives.reduce import FLOAT_DTYPES, ReduceSpec, spec_for
from .timeline import Recorder


class Group:
    """The collectives of ``links.size`` ranks; ``hosts`` (host of each rank) enables the
    hierarchical path; ``thresholds`` overrides the algorithm choice; ``local``: this rank's use of
    its host's shared-memory segment (default: ``links.local`` where the links have one); ``label``:
    what every rank's descriptors say of the group (default: its size)."""

    def __init__(
        self,
        links: Links,
        hosts: Sequence[str] | None = None,
        thresholds: Thresholds | None = None,
        local: Local | None = None,
        nccl: NcclPath | None = None,
        label: str | None = None,
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
        self._exchange = Exchange(links, self.local)
        self._negotiator = Negotiator(self._exchange, f"collective-{links.rank}")
        self._negotiator.standin = lambda desc: joining.standin(self, desc)
        self._negotiator.fuser = self._fused
        self._joins = 0
        #: what every rank's descriptors say of the group (the same on every rank of one group)
        self._gid = label or f"{links.size} ranks"
        self._lanes: dict[tuple[Any, ...], Lane] = {}
        self._scratch = Scratch()
        #: the algorithm of the last allreduce (for tests and logs)
        self.last_algorithm = ""

    @property
    def rank(self) -> int:
        return self.links.rank

    @property
    def size(self) -> int:
        return self.links.size

    @property
    def slots(self) -> int:
        """The operations this rank has taken part in (``0 .. slots - 1``; the same on every rank)."""
        return self._negotiator.slots

    def record(self, timeline: Recorder | None) -> Recorder | None:
        """Send each finished operation's phases to ``timeline`` from now on (None: nowhere);
        returns the one it replaces."""
        old, self._negotiator.timeline = self._negotiator.timeline, timeline
        return old

    @property
    def collectives(self) -> int:
        """The collectives this rank ran (a fused batch counts once)."""
        return self._negotiator.collectives

    def fuse(self, threshold: int, cycle_s: float = 0.0) -> None:
        """Horovod's tensor fusion from now on: ``allreduce_async``s of one dtype and op that every
        rank has queued run as one collective of at most ``threshold`` bytes (``batching``), one at
        the head of the queue waiting for others until ``cycle_s`` passes without a submission (or
        a caller waits for a queued one); ``threshold`` 0: off (``grouped_allreduce``: each alone)."""
        if not isinstance(cycle_s, int | float) or cycle_s < 0:
            raise ValueError(f"the fusion cycle must be a non-negative number of seconds, not {cycle_s!r}")
        self.thresholds = replace(self.thresholds, fusion_bytes=threshold)
        self._negotiator.fusion_bytes, self._negotiator.cycle_s = threshold, float(cycle_s)

    def _fused(self, batch: list[Op]) -> tuple[Callable[[], None], Callable[[int], list[Any]]]:
        """The data path of ``batch``, allreduces the ranks agreed to run as one (``fusion.fuser``)."""
        spec = batch[0].part.spec

        def reduce(seq: int, buf: np.ndarray) -> None:
            self._allreduce_into(self._ctx(seq), buf, buf, spec)
            spec.finish(buf, self.size)

        return fusion.fuser([o.part for o in batch], reduce)

    def close(self) -> None:
        """Finish the queued operations and stop the background thread."""
        self._negotiator.close()
        if self.nccl is not None:
            self.nccl.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def starting(self) -> None:
        """Before each operation: raise what keeps it from starting (``JobGroup``: a new epoch)."""

    def _op(self, kind: str, name: str | None, build: Callable[[str], Op]) -> Op:
        """The operation ``build(name)`` makes; where this rank's own checks refuse it (a
        ``TypeError`` or ``ValueError``), the others are told (it fails on every rank) and the
        error is raised here."""
        self.starting()
        nm = self._negotiator.name(name)
        try:
            return build(nm)
        except (TypeError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            self._negotiator.submit(Op(Descriptor(nm, kind, group=self._gid, refused=why), _nothing))
            raise

    def _desc(self, name: str, kind: str, array: Any = None, **more: Any) -> Descriptor:
        if array is None:
            return Descriptor(name, kind, group=self._gid, **more)
        return Descriptor(name, kind, tuple(array.shape), dtype_name(array.dtype), group=self._gid, **more)

    def _submit(self, op: Op) -> Work:
        return self._negotiator.submit(op)

    def _ctx(self, seq: int) -> Ctx:
        return Ctx.for_op(self.links, seq, self._scratch)

    # -- allreduce ----------------------------------------------------------------------------
    def allreduce_async(
        self,
        array: Any,
        op: str = "sum",
        out: Any = None,
        kind: str | None = None,
        *,
        name: str | None = None,
        fuse: bool = True,
        waits: bool = False,
    ) -> Work:
        """Start reducing ``array`` over all ranks (``op``: sum, mean, max, min; ``kind="bfloat16"``
        for bfloat16 bits in a uint16 array). ``out=array`` (a C-contiguous numpy array) lends it:
        it is read and written in place when the operation runs, without a private copy, and is the
        operation's until ``wait()``. ``name``: matches the operation across ranks (default: the
        next of this rank's unnamed operations). ``fuse=False``: never fused with others (``fuse``);
        ``waits``: the caller waits for it at once (a fusion cycle ends: it runs with what is queued)."""
        op_of = self._op(
            "allreduce", name, lambda nm: self._allreduce_op(nm, array, op, out, kind, fuse=fuse)
        )
        return self._negotiator.submit(op_of, waits)

    def _allreduce_op(
        self,
        name: str,
        array: Any,
        op: str,
        out: Any,
        kind: str | None,
        sync: bool = False,
        fuse: bool = False,
    ) -> Op:
        check_array("allreduce", array)
        spec = spec_for(array.dtype, op, kind)
        desc = self._desc(name, "allreduce", array, op=op)
        if spec.kind != desc.dtype:
            desc = replace(desc, dtype=spec.kind)
        if self.nccl is not None and self.nccl.takes(array, spec):
            check_out(array, out)
            return Op(desc, moves.with_ctx(self, self.nccl.allreduce(array, spec, out)))
        inplace = sync and plain(array) and (out is None or plain(out))
        lent = inplace or (out is array and plain(array))
        host = array if lent else np.array(to_host(array), copy=True, order="C")
        check_out(host, out)

        def destination() -> np.ndarray:
            return host if out is array or not inplace else (np.empty_like(host) if out is None else out)

        def result(dest: np.ndarray) -> Any:
            return dest if inplace else (out if lent else deliver(host, array, out))

        def run(seq: int) -> Any:
            dest = destination()
            flat = dest.reshape(-1)
            self._allreduce_into(self._ctx(seq), host.reshape(-1), flat, spec)
            spec.finish(flat, self.size)
            return result(dest)

        fast = None
        shm = self._exchange.local is not None and host.size and self.size > 1
        if shm and policy.choose(host.nbytes, self.topology, self.thresholds, True) == policy.SHM:

            def fast(seq: int, rec: bytes) -> tuple[list[bytes], Any]:
                dest = destination()
                flat = dest.reshape(-1)
                shown: list[list[bytes]] = []
                if not self._shm(host.reshape(-1), flat, spec, rec, shown):
                    return shown[0], NOT_RUN
                spec.finish(flat, self.size)
                return shown[0], result(dest)

        if not fuse or not 0 < host.nbytes <= self._negotiator.fusion_bytes:
            return Op(desc, run, host.nbytes, fast)

        def from_piece(piece: np.ndarray) -> Any:  # its piece of a fused batch's buffer
            dest = destination()
            dest.reshape(-1)[...] = piece
            return result(dest)

        return Op(
            replace(desc, fuse=host.nbytes), run, host.nbytes, fast, part=fusion.Part(host, spec, from_piece)
        )

    def _shm(
        self, x: np.ndarray, out: np.ndarray, spec: ReduceSpec, rec: bytes, shown: list[list[bytes]]
    ) -> bool:
        """The shared-memory allreduce with this operation's record shown in its first step."""
        loc, ex = self.local, self._exchange
        assert loc is not None
        self.last_algorithm = policy.SHM

        def check() -> bool:
            shown.append(ex.read())
            return agreed(shown[0])

        split = policy.shm_split(x.nbytes, loc.size, self.thresholds)
        return shmreduce.allreduce(loc, x, out, spec, split, show=lambda: ex.put(rec), agreed=check)

    def allreduce(
        self,
        array: Any,
        op: str = "sum",
        out: Any = None,
        kind: str | None = None,
        *,
        name: str | None = None,
    ) -> Any:
        """``allreduce_async(...).wait()``; a C-contiguous numpy array is read (and ``out``
        written) in place, on the calling thread when nothing else is queued."""
        self.starting()
        if self.nccl is None and type(array) is np.ndarray and array.flags.c_contiguous:
            lane = self._lane(array, op, out, kind)
            if lane is not None:
                res = self._quick(lane, array, out, op, kind, name)
                if res is not NOT_RUN:
                    return res
        return self._negotiator.call(
            self._op("allreduce", name, lambda nm: self._allreduce_op(nm, array, op, out, kind, sync=True))
        )

    def _lane(self, array: np.ndarray, op: str, out: Any, kind: str | None) -> Lane | None:
        """What a repeated synchronous allreduce of ``array``'s shape and dtype needs, made once
        (None where ``out`` is not a plain array of its shape and dtype, or the checks refuse it:
        the general way raises their error)."""
        if out is not None and not (
            type(out) is np.ndarray
            and out.flags.c_contiguous
            and out.shape == array.shape
            and out.dtype == array.dtype
        ):
            return None
        key = (array.shape, array.dtype, op, kind, out is None)
        lane = self._lanes.get(key)
        if lane is None or lane.thresholds is not self.thresholds:
            if len(self._lanes) >= LANES:
                self._lanes.clear()
            try:
                spec = spec_for(array.dtype, op, kind)
            except (TypeError, ValueError):
                return None
            shm = self._exchange.local is not None and array.size > 0 and self.size > 1
            shm = shm and policy.choose(array.nbytes, self.topology, self.thresholds, True) == policy.SHM
            split = (
                shm
                and self.local is not None
                and policy.shm_split(array.nbytes, self.local.size, self.thresholds)
            )
            shape = tuple(array.shape)
            digest = body("allreduce", shape, spec.kind, op, -1, self._gid)
            lane = self._lanes[key] = Lane(spec, digest, array.nbytes, shm, bool(split), self.thresholds)
        return lane

    def _quick(
        self, lane: Lane, array: np.ndarray, out: Any, op: str, kind: str | None, name: str | None
    ) -> Any:
        """The synchronous allreduce through ``Negotiator.quick`` (``NOT_RUN``: not taken)."""
        spec, x = lane.spec, array.reshape(-1)
        dest = np.empty_like(array) if out is None else out
        flat = dest.reshape(-1)

        def attempt(seq: int, rec: bytes) -> tuple[list[bytes], Any]:
            if lane.shm:
                shown: list[list[bytes]] = []
                loc, ex = self.local, self._exchange
                assert loc is not None
                self.last_algorithm = policy.SHM

                def check() -> bool:
                    shown.append(ex.read())
                    return agreed(shown[0])

                if not shmreduce.allreduce(
                    loc, x, flat, spec, lane.split, show=lambda: ex.put(rec), agreed=check
                ):
                    return shown[0], NOT_RUN
                spec.finish(flat, self.size)
                return shown[0], dest
            if speculation.takes(self._exchange, self.links):  # data and records at once
                records = speculation.run(
                    self._exchange,
                    self.links,
                    seq,
                    rec,
                    lambda: self._allreduce_into(self._ctx(seq), x, flat, spec),
                )
            else:
                records = self._exchange.records(seq, rec) if self.size > 1 else [rec]
                if agreed(records):
                    self._allreduce_into(self._ctx(seq), x, flat, spec)
            if not agreed(records):
                return records, NOT_RUN
            spec.finish(flat, self.size)
            return records, dest

        return self._negotiator.quick(
            name,
            lambda nm: record(nm, lane.body, lane.nbytes),
            attempt,
            lambda nm: self._allreduce_op(nm, array, op, out, kind, sync=True),
        )

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
        self, arrays: Sequence[Any], op: str = "sum", kind: str | None = None, *, name: str | None = None
    ) -> Work:
        """Reduce many arrays at once, fused into buckets of one dtype of at most
        ``thresholds.fusion_bytes``; the result is the list of reduced arrays."""
        return self._submit(
            self._op("grouped_allreduce", name, lambda nm: self._grouped(nm, arrays, op, kind))
        )

    def _grouped(self, name: str, arrays: Sequence[Any], op: str, kind: str | None) -> Op:
        if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Sequence):
            raise TypeError(f"grouped_allreduce takes a list of arrays, not {type(arrays).__name__}")
        for a in arrays:
            check_array("grouped_allreduce", a)
        specs = [spec_for(a.dtype, op, kind) for a in arrays]
        shapes = tuple(tuple(a.shape) for a in arrays)
        desc = self._desc(
            name, "grouped_allreduce", shape=shapes, dtype=",".join(s.kind for s in specs), op=op
        )
        sizes = [(s.kind, int(a.nbytes)) for s, a in zip(specs, arrays, strict=True)]
        buckets = fusion.plan(sizes, self.thresholds.fusion_bytes)
        nccl = self.nccl
        if arrays and nccl is not None and all(nccl.takes(a, s) for a, s in zip(arrays, specs, strict=True)):
            return Op(desc, moves.with_ctx(self, nccl.grouped_allreduce(arrays, specs, buckets)))
        hosts = [to_host(a) for a in arrays]
        packed = [fusion.pack(hosts, b) for b in buckets]

        def run(seq: int) -> list[Any]:
            ctx = self._ctx(seq)
            results: list[Any] = [None] * len(arrays)
            for i, (bucket, buf) in enumerate(zip(buckets, packed, strict=True)):
                spec = specs[bucket[0]]
                self._allreduce_into(ctx.phase(i % 15), buf, buf, spec)
                spec.finish(buf, self.size)
                fusion.unpack(buf, hosts, bucket, results)
            return [like(r, a) for r, a in zip(results, arrays, strict=True)]

        return Op(desc, run, sum(n for _, n in sizes))

    def grouped_allreduce(
        self, arrays: Sequence[Any], op: str = "sum", kind: str | None = None, *, name: str | None = None
    ) -> list[Any]:
        return self._negotiator.call(
            self._op("grouped_allreduce", name, lambda nm: self._grouped(nm, arrays, op, kind))
        )

    def compressed_allreduce_async(
        self,
        array: Any,
        state: ErrorFeedback,
        key: Any = 0,
        op: str = "mean",
        *,
        name: str | None = None,
        out: Any = None,
    ) -> Work:
        """Reduce ``array`` compressed with ``state``'s compressor, with error feedback kept in
        ``state`` under ``key`` (one key per tensor; see ``compressed.twostage``, and ``lowrank`` for
        ``powersgd``). The result is a fresh array, or ``out`` (``array``'s shape and dtype; may be
        ``array`` itself), which a C-contiguous numpy array receives directly: reused from one step
        to the next, it spares the fresh result's page faults (about as costly as a copy of it)."""
        return self._submit(
            self._op(
                "compressed_allreduce",
                name,
                lambda nm: self._compressed(nm, array, state, key, op, False, out),
            )
        )

    def _compressed(
        self, name: str, array: Any, state: ErrorFeedback, key: Any, op: str, sync: bool, out: Any
    ) -> Op:
        """The compressed allreduce of ``array`` (read in place where ``sync`` and a plain numpy
        array, else copied; written only where it is ``out``)."""
        check_array("compressed_allreduce", array)
        if np.dtype(array.dtype) not in FLOAT_DTYPES:
            raise TypeError(f"compressed allreduce takes float16/32/64 arrays, not {np.dtype(array.dtype)}")
        if op not in twostage.OPS:
            raise ValueError(f"compressed allreduce sums or averages, not {op!r}")
        inplace = sync and self.nccl is None and plain(array) and state.params.get("type") != "powersgd"
        host = array if inplace else np.array(to_host(array), copy=True, order="C")
        check_out(host, out)
        # a plain ``out`` receives the result directly (after ``host`` is read: it may be ``array``)
        direct = plain(out) and out.dtype == host.dtype
        compressor = str(state.params.get("type", ""))
        desc = self._desc(name, "compressed_allreduce", array, op=f"{op} ({compressor or 'compressed'})")
        spec = spec_for(array.dtype, op)
        topo = self.topology
        hier = compressed_hierarchical.takes(topo)
        st = state.key(key, topo.nhosts if hier and topo is not None else self.size)

        def run(seq: int) -> Any:
            ctx = self._ctx(seq)
            if isinstance(st.server, PowerSGD):  # its own form: P and Q are allreduced
                res = lowrank.allreduce(ctx, host, spec, st.server, self._flat_allreduce)
                return deliver(np.ascontiguousarray(res).reshape(host.shape), array, out)
            x, dest = host.reshape(-1), out.reshape(-1) if direct else None
            if hier and topo is not None:
                th = self.thresholds
                flat = compressed_hierarchical.allreduce(ctx, x, spec, st, topo, self.local, th, dest)
            else:
                flat = twostage.allreduce(ctx, x, spec, st, out=dest)
            return out if direct else deliver(flat.reshape(host.shape), array, out)

        return Op(desc, run, host.nbytes)

    def compressed_allreduce(
        self,
        array: Any,
        state: ErrorFeedback,
        key: Any = 0,
        op: str = "mean",
        *,
        name: str | None = None,
        out: Any = None,
    ) -> Any:
        return self._negotiator.call(
            self._op(
                "compressed_allreduce",
                name,
                lambda nm: self._compressed(nm, array, state, key, op, True, out),
            )
        )

    # -- the others (``moves``) -----------------------------------------------------------------
    def broadcast_async(self, array: Any, root: int = 0, *, name: str | None = None) -> Work:
        """Start sending ``root``'s ``array`` to every rank; the result is a fresh array."""
        return self._submit(self._op("broadcast", name, lambda nm: moves.broadcast(self, nm, array, root)))

    def broadcast(self, array: Any, root: int = 0, *, name: str | None = None) -> Any:
        return self._negotiator.call(
            self._op("broadcast", name, lambda nm: moves.broadcast(self, nm, array, root))
        )

    def allgather_async(self, array: Any, *, name: str | None = None, counts: bool = False) -> Work:
        """Start concatenating every rank's ``array`` along the first axis, in rank order; the first
        dimension may differ between ranks (ragged). ``counts``: the result is ``(rows, counts)``,
        each rank's number of rows too (a joined rank gave none)."""
        return self._submit(self._op("allgather", name, lambda nm: moves.allgather(self, nm, array, counts)))

    def allgather(self, array: Any, *, name: str | None = None, counts: bool = False) -> Any:
        return self._negotiator.call(
            self._op("allgather", name, lambda nm: moves.allgather(self, nm, array, counts))
        )

    def reduce_scatter_async(
        self, array: Any, op: str = "sum", kind: str | None = None, *, name: str | None = None
    ) -> Work:
        """Start reducing ``array`` and keep this rank's block of the first axis (the rows split as
        ``numpy.array_split`` does: the first ``rows % size`` ranks get one more)."""
        return self._submit(self._op("reduce_scatter", name, self._reduce_scatter(array, op, kind)))

    def reduce_scatter(
        self, array: Any, op: str = "sum", kind: str | None = None, *, name: str | None = None
    ) -> Any:
        return self._negotiator.call(self._op("reduce_scatter", name, self._reduce_scatter(array, op, kind)))

    def _reduce_scatter(self, array: Any, op: str, kind: str | None) -> Callable[[str], Op]:
        return lambda nm: moves.reduce_scatter(self, nm, array, op, kind)

    def barrier_async(self, *, name: str | None = None) -> Work:
        return self._submit(self._op("barrier", name, lambda nm: moves.barrier(self, nm)))

    def barrier(self, *, name: str | None = None) -> None:
        self._negotiator.call(self._op("barrier", name, lambda nm: moves.barrier(self, nm)))

    def join(self) -> int:
        """Horovod's ``join``: this rank has no more data (``joining.join``)."""
        return joining.join(self)


def _nothing(seq: int) -> None:
    """The data path of an operation this rank refused (never run: it fails on every rank)."""
