"""``DistKVStore``: the worker side of ``dist_sync``/``dist_async`` (and their ``_device`` variants).

Each key is split into parts (``sharding.py``); one message per server carries all the parts
of a call for that server. A part exchanged with a server on the same host goes through a
shared-memory segment owned by this worker (the socket carries only the header); otherwise
the part travels as a raw frame. Pushes do not wait for the server: a part's segment is
reused only after the server has handled the previous push from it (pushes get no reply; any
later answered request to the same server proves it, see ``WorkerClient.confirm``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from trainer_core.compression.codec import WorkerCodec, resolve_compression, validate_params
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.kv.api import _OPEN, KVStore, check_key, host_sum, normalize, write_out
from trainer_core.log import get_logger
from trainer_core.optim.server import to_spec
from trainer_core.ps.client import WorkerClient
from trainer_core.ps.sharding import Part, split
from trainer_core.transport import wire
from trainer_core.transport.shm import Segment, SegmentFactory
from trainer_core.transport.wire import Key
from trainer_core.xp import to_host


@dataclass
class KeyMeta:
    """What a worker knows about one key: shape, dtype, parts, and its segments per part."""

    shape: tuple[int, ...]
    dtype: np.dtype
    size: int
    parts: list[Part]
    segments: list[Segment | None] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)  # seq of the last request using each segment (0: none)


def install_excepthook() -> None:
    """Once per process: an uncaught exception in a worker aborts the job at once (naming this worker)
    instead of leaving the others waiting for its pushes."""
    previous = sys.excepthook
    if getattr(previous, "trainer_core", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        for store in list(_OPEN):
            if isinstance(store, DistKVStore):
                store.abort(f"uncaught {kind.__name__}: {value}")

    hook.trainer_core = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def direct_target(outs: list[Any], m: KeyMeta) -> np.ndarray | None:
    """A flat view of the one output array when results can be written into it directly (no temporary)."""
    if len(outs) != 1:
        return None
    out = outs[0]
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != m.dtype
        or out.size != m.size
        or not out.flags.c_contiguous
    ):
        return None
    if not out.flags.writeable:
        return None
    return out.reshape(-1)


class DistKVStore(KVStore):
    """A worker of a parameter-server job."""

    def __init__(self, name: str, cfg: NodeConfig, exit_on_failure: bool = True) -> None:
        self.type = name
        self.sync = "async" not in name
        self.cfg = cfg
        self.log = get_logger(cfg.verbose)
        self.client = WorkerClient(cfg, self.log, exit_on_failure=exit_on_failure)
        self.rank = self.client.rank
        self.num_workers = self.client.book.num_workers
        self.num_servers = self.client.book.num_servers
        self.meta: dict[Key, KeyMeta] = {}
        self.segments = SegmentFactory(cfg.job_id, f"w{self.rank}")
        self._unlink: list[tuple[Segment, int, int]] = []
        self._closed = False
        self.compression: dict[str, Any] | None = None
        self.codec = WorkerCodec()
        _OPEN.add(self)
        install_excepthook()
        self.client.before_exit = self._unlink_names
        try:
            self._to_all_servers(wire.SET_MODE, {"sync": self.sync})
        except BaseException:
            self._cleanup()
            raise

    # -- control ------------------------------------------------------------------------------------

    def _to_all_servers(self, op: str, body: dict[str, Any]) -> None:
        """Rank 0 sends a command to every server and waits for the acks; then every worker meets."""
        if self.rank == 0:
            self.client.wait([self.client.send(s, op, body=body) for s in range(self.num_servers)])
        self.client.barrier()

    def barrier(self) -> None:
        self.client.drain()
        self.client.barrier()

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        """Server-side optimizer for every key (sent as a plain-data spec, see ``optim.py``)."""
        self._to_all_servers(wire.SET_OPTIMIZER, {"spec": to_spec(optimizer, **kwargs)})

    def set_gradient_compression(self, params: Any) -> None:
        """Validate, keep, and forward compression params (see ``gc_hook.py``); every worker calls it
        at the same point (it ends with a barrier). Residuals start from zero."""
        active = resolve_compression(params)
        self.compression = validate_params(params)
        self.client.drain()
        self.codec.set_params(active)
        self._to_all_servers(wire.SET_COMPRESSION, {"params": self.compression})

    def wire_stats(self) -> dict[str, int]:
        """Data bytes this worker sent and received so far (payloads; raw parts at their size;
        ``raw_*``: what 32-bit values would have been; ``exchanges``: data requests)."""
        return self.codec.stats.as_dict()

    def compression_state(self) -> dict[str, dict[str, Any]]:
        """This worker's error-feedback residuals by ``"<key>/<part>"`` (for checkpoints)."""
        return self.codec.state()

    def load_compression_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Restore ``compression_state()`` (after ``set_gradient_compression`` and ``init``)."""
        self.codec.load_state(state, {str(k): k for k in self.meta})

    def server_state(self) -> dict[Key, dict[str, Any]]:
        """The servers' state of every key, for checkpoints (collective: every worker calls it at the
        same point, between rounds; rank 0 gets the state, the others ``{}``).

        Per key: ``value`` (the stored value; with compressed pulls it differs from what workers
        pulled), ``opt/<slot>`` (the server optimizer's arrays, e.g. ``opt/mom``, ``opt/m``,
        ``opt/v``, and its step counter ``opt/t`` as an int), the parts of a split key reassembled
        into the key's shape; ``pull/<part>/<slot>`` (each part's pull compressor state, e.g. its
        error-feedback ``residual``). Every worker first waits for its requests, then all meet, rank
        0 asks every server (``get_state``), and all meet again before anyone pushes."""
        self.client.drain()
        self.client.barrier()
        out: dict[Key, dict[str, Any]] = {}
        if self.rank == 0:
            seqs = [self.client.send(s, wire.GET_STATE, local=False) for s in range(self.num_servers)]
            replies = self.client.wait(seqs)
            for server, seq in enumerate(seqs):
                self._take_state(server, replies[seq], out)
            for k, state in out.items():
                for name in [n for n in state if n.startswith("opt/") and isinstance(state[n], list)]:
                    values = set(state[name])
                    if len(values) != 1:
                        raise KVError(f"key {k!r}: servers disagree on {name} ({sorted(values)})")
                    state[name] = values.pop()
        self.client.barrier()
        return out

    def _take_state(self, server: int, reply: Any, out: dict[Key, dict[str, Any]]) -> None:
        """Check one ``get_state`` reply and copy its arrays into ``out`` (parts into whole keys)."""
        h = reply.header
        slots, scalars = wire.state_body(h)
        if len(reply.frames) != len(h.entries):
            raise KVError(
                f"server {server}: state reply with {len(reply.frames)} frames for {len(h.entries)} entries"
            )

        def part_of(key: Key, index: int) -> tuple[KeyMeta, Part]:
            m = self.meta.get(key)
            if m is None or not 0 <= index < len(m.parts) or m.parts[index].server != server:
                raise KVError(
                    f"server {server} sent state of key {key!r} part {index}, which it does not hold"
                )
            return m, m.parts[index]

        for e, slot, frame in zip(h.entries, slots, reply.frames, strict=True):
            m, p = part_of(e.key, e.part)
            dtype = np.dtype(e.dtype)
            if len(frame.buffer) != e.size * dtype.itemsize:
                raise KVError(f"server {server}: state of key {e.key!r} has a frame of the wrong size")
            arr = np.frombuffer(frame.buffer, dtype=dtype)
            state = out.setdefault(e.key, {})
            if slot.startswith("pull/"):
                state[f"pull/{p.index}/{slot[5:]}"] = arr.copy()
                continue
            if e.size != p.size or (slot == "value" and dtype != m.dtype):
                raise KVError(f"server {server}: state {slot} of key {e.key!r} does not fit the key")
            whole = state.get(slot)
            if whole is None:
                whole = state[slot] = np.zeros(m.shape, dtype=dtype)
            whole.reshape(-1)[p.start : p.stop] = arr
        for key, index, slot, value in scalars:
            part_of(key, index)
            if not slot.startswith("opt/"):
                raise KVError(f"server {server}: unexpected state scalar {slot!r}")
            out.setdefault(key, {}).setdefault(slot, []).append(value)

    def load_server_state(self, state: dict[Key, dict[str, Any]]) -> None:
        """Restore ``server_state()`` on the servers (collective, as ``server_state``: every worker
        calls it at the same point, after ``set_optimizer``, ``set_gradient_compression`` and
        ``init``; rank 0's ``state`` is sent, the others' is ignored). A key named in ``state`` gets
        its value, optimizer state and pull residuals replaced (those missing start from zero);
        other keys are untouched."""
        self.client.drain()
        self.client.barrier()
        if self.rank == 0:
            per_server: dict[int, tuple[list[wire.Entry], list[np.ndarray], list[str], list[list[Any]]]] = {
                s: ([], [], [], []) for s in range(self.num_servers)
            }
            for k, slots in state.items():
                m = self._meta(k)
                for name, value in slots.items():
                    self._put_state(m, k, name, value, per_server)
            seqs = [
                self.client.send(s, wire.SET_STATE, e, a, body={"slots": sl, "scalars": sc}, local=False)
                for s, (e, a, sl, sc) in per_server.items()
                if e or sc
            ]
            self.client.wait(seqs)
        self.client.barrier()

    @staticmethod
    def _put_state(
        m: KeyMeta,
        k: Key,
        name: str,
        value: Any,
        per_server: dict[int, tuple[list[wire.Entry], list[np.ndarray], list[str], list[list[Any]]]],
    ) -> None:
        """Split one state slot of key ``k`` into its parts' messages."""
        if name.startswith("pull/"):
            index_s, _, slot = name[5:].partition("/")
            if not index_s.isdigit() or int(index_s) >= len(m.parts):
                raise KVError(f"key {k!r}: bad state slot {name!r}")
            p = m.parts[int(index_s)]
            arr = np.ascontiguousarray(to_host(value)).reshape(-1)
            entries, arrays, slots, _ = per_server[p.server]
            entries.append(wire.Entry(k, p.index, arr.size, arr.dtype.str))
            arrays.append(arr)
            slots.append(f"pull/{slot}")
            return
        if not (name == "value" or name.startswith("opt/")):
            raise KVError(f"key {k!r}: unknown state slot {name!r}")
        if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
            number = value.item() if isinstance(value, np.generic) else value
            for p in m.parts:
                per_server[p.server][3].append([k, p.index, name, number])
            return
        flat = np.ascontiguousarray(to_host(value)).reshape(-1)
        if flat.size != m.size:
            raise KVError(f"key {k!r}: state {name!r} has {flat.size} elements, the key {m.size}")
        if flat.dtype.str not in wire.DTYPES:
            raise KVError(f"key {k!r}: state {name!r} has an unsupported dtype {flat.dtype}")
        for p in m.parts:
            entries, arrays, slots, _ = per_server[p.server]
            entries.append(wire.Entry(k, p.index, p.size, flat.dtype.str))
            arrays.append(flat[p.start : p.stop])
            slots.append(name)

    # -- data ---------------------------------------------------------------------------------------

    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        """Every worker calls it with the same keys and shapes; rank 0's values are stored."""
        pairs = normalize(key, value)
        per_server: dict[int, tuple[list[wire.Entry], list[Any]]] = {}
        for k, vals in pairs:
            host = to_host(vals[0])
            dtype = np.dtype(host.dtype)
            if dtype.str not in wire.DTYPES:
                raise KVError(f"key {k!r}: unsupported dtype {dtype}")
            parts = split(k, host.size, self.num_servers, self.cfg.bigarray_bound)
            self.meta[k] = KeyMeta(host.shape, dtype, host.size, parts, [None] * len(parts), [0] * len(parts))
            flat = np.ascontiguousarray(host).reshape(-1)
            for p in parts:
                entries, frames = per_server.setdefault(p.server, ([], []))
                entries.append(wire.Entry(k, p.index, p.size, dtype.str))
                frames.append(flat[p.start : p.stop])
        if self.rank == 0:
            self.client.wait([self.client.send(s, wire.INIT, e, f) for s, (e, f) in per_server.items()])
        self.client.barrier()

    def push(self, key: Key | Sequence[Key], value: Any) -> None:
        self._exchange(wire.PUSH, normalize(key, value), None)

    def pull(self, key: Key | Sequence[Key], out: Any) -> Any:
        pairs = normalize(key, out)
        self._exchange(wire.PULL, [(k, []) for k, _ in pairs], pairs)
        return out

    def pushpull(self, key: Key | Sequence[Key], value: Any, out: Any = None) -> Any:
        """Push and pull in one message per server (one round trip)."""
        target = value if out is None else out
        self._exchange(wire.PUSHPULL, normalize(key, value), normalize(key, target))
        return target

    def _meta(self, key: Key) -> KeyMeta:
        try:
            return self.meta[check_key(key)]
        except KeyError:
            raise KVError(f"key {key!r} was not initialized (call init on every worker first)") from None

    def _segment(self, m: KeyMeta, p: Part, writing: bool) -> Segment | None:
        """The part's segment (``None``: not on this host). Before ``writing`` into it, wait until the
        server consumed the previous push from it. A pull needs no wait: the server handles the
        messages of one connection in order, so it reads an earlier push before it writes the result."""
        if not self.client.same_host[p.server]:
            return None
        seg = m.segments[p.index]
        if seg is None:
            seg = m.segments[p.index] = self.segments.create(p.size * m.dtype.itemsize)
        elif writing and m.busy[p.index]:
            self.client.confirm(p.server, m.busy[p.index])
            m.busy[p.index] = 0
        return seg

    def _exchange(
        self, op: str, pushes: list[tuple[Key, list[Any]]], pulls: list[tuple[Key, list[Any]]] | None
    ) -> None:
        self._release_names()
        if len({k for k, _ in pushes}) != len(pushes):
            raise KVError("a key appears more than once in one call")
        per_server: dict[
            int, tuple[list[wire.Entry], list[Any], list[tuple[KeyMeta, Part, Segment | None]]]
        ] = {}
        stats, compressed = self.codec.stats, False
        stats.exchanges += 1
        for k, vals in pushes:
            m = self._meta(k)
            flat = host_sum(vals, m.dtype) if vals else None
            if flat is not None and flat.size != m.size:
                raise KVError(f"key {k!r}: pushed {flat.size} elements, initialized with {m.size}")
            packed = self.codec.active(m.dtype)
            compressed = compressed or packed
            for p in m.parts:
                seg = None if packed else self._segment(m, p, writing=flat is not None)
                entries, frames, where = per_server.setdefault(p.server, ([], [], []))
                raw = p.size * m.dtype.itemsize
                if flat is not None:
                    stats.raw_sent += raw
                if pulls is not None:
                    stats.raw_received += raw
                if packed:
                    if flat is not None:
                        payload, meta = self.codec.encode(k, p.index, flat[p.start : p.stop])
                        entries.append(wire.Entry(k, p.index, p.size, m.dtype.str, comp=meta))
                        frames.append(payload)
                        stats.sent += payload.nbytes
                    else:
                        entries.append(wire.Entry(k, p.index, p.size, m.dtype.str))
                elif seg is not None:
                    view = seg.view(m.dtype, p.size)
                    if flat is not None:
                        np.copyto(view, flat[p.start : p.stop])
                    entries.append(wire.Entry(k, p.index, p.size, m.dtype.str, seg.name))
                else:
                    entries.append(wire.Entry(k, p.index, p.size, m.dtype.str))
                    if flat is not None:
                        # zero-copy when the bytes are gone before the call returns: the call waits for
                        # the reply, or the channel sends from this thread; else a private copy
                        part = flat[p.start : p.stop]
                        now = pulls is not None or self.client.sends_directly(p.server)
                        frames.append(part if now else np.array(part, copy=True))
                if flat is not None and not packed:
                    stats.sent += raw
                where.append((m, p, seg))
        results: dict[int, np.ndarray] = {}
        direct: set[int] = set()  # indexes in ``pulls`` whose output receives the data directly
        for i, (k, outs) in enumerate(pulls or []):
            m = self._meta(k)
            target = direct_target(outs, m)
            if target is not None and id(m) not in results:
                results[id(m)] = target
                direct.add(i)
        sent: dict[int, list[tuple[KeyMeta, Part, Segment | None]]] = {}
        server_of: dict[int, int] = {}
        for server, (entries, frames, where) in per_server.items():
            into = None
            if pulls is not None and not compressed and self.client.sends_directly(server):
                into = [_bytes_of(self._result(results, m)[p.start : p.stop]) for m, p, _ in where]
            seq = self.client.send(
                server, op, entries, frames, keep=pulls is not None, local=not compressed, into=into
            )
            sent[seq] = where
            server_of[seq] = server
            for m, p, seg in where:
                if seg is not None:
                    if seg.named:
                        self._unlink.append((seg, server, seq))
                    m.busy[p.index] = seq
        if pulls is None:
            return
        replies = self.client.wait(list(sent))
        for seq, where in sent.items():
            reply = replies[seq]
            frames_in = iter(reply.frames)
            metas = reply.header.body.get("c")
            metas_in: Iterator[Any] = iter(metas if isinstance(metas, list) else [])
            located = reply.header.entries  # set when values are read from the server's buffers
            for idx, (m, p, seg) in enumerate(where):
                m.busy[p.index] = 0
                dst = self._result(results, m)[p.start : p.stop]
                where_is = located[idx].shm if idx < len(located) else None
                if where_is is not None:
                    np.copyto(dst, self.client.shared_view(server_of[seq], where_is, m.dtype, p.size))
                    stats.received += p.size * m.dtype.itemsize
                elif seg is not None:
                    np.copyto(dst, seg.view(m.dtype, p.size))
                    stats.received += p.size * m.dtype.itemsize
                else:
                    self._read_frame(dst, m, p, next(frames_in, None), next(metas_in, None))
        for i, (k, outs) in enumerate(pulls):
            if i not in direct:
                write_out(results[id(self._meta(k))], outs)

    @staticmethod
    def _result(results: dict[int, np.ndarray], m: KeyMeta) -> np.ndarray:
        """Where key ``m``'s pulled value is assembled (the output itself, or a fresh array)."""
        if id(m) not in results:
            results[id(m)] = np.empty(m.size, dtype=m.dtype)
        return results[id(m)]

    def _read_frame(self, dst: np.ndarray, m: KeyMeta, p: Part, frame: Any, meta: Any) -> None:
        """Copy (or decode, when ``meta`` describes a compressed payload) one reply frame into ``dst``
        (nothing to copy when the channel read it there already)."""
        if frame is None:
            raise KVError("a server's reply is missing data")
        self.codec.stats.received += len(frame.buffer)
        if (
            getattr(frame, "placed", False)
            and meta is None
            and len(frame.buffer) == dst.nbytes
            and np.frombuffer(frame.buffer, np.uint8).ctypes.data == dst.ctypes.data
        ):
            return
        if meta is not None:
            np.copyto(dst, gc_decode(frame.buffer, meta, p.size, m.dtype))
        elif len(frame.buffer) != p.size * m.dtype.itemsize:
            raise KVError("a server's reply is missing data")
        else:
            np.copyto(dst, np.frombuffer(frame.buffer, dtype=m.dtype))

    def _release_names(self) -> None:
        """Unlink segment names the servers have mapped already (answered requests)."""
        if self._unlink:
            keep = []
            for seg, server, seq in self._unlink:
                if self.client.handled(server, seq):
                    seg.unlink()
                else:
                    keep.append((seg, server, seq))
            self._unlink = keep

    # -- end ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for in-flight requests and for every worker to finish, then free sockets and segments."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.client.failure is None:
                self.client.drain()
                self.client.finish()
        finally:
            self._cleanup()

    def abort(self, reason: str) -> None:
        """End the whole job now (an uncaught exception in this worker): tell the scheduler, free everything."""
        if self._closed:
            return
        try:
            self.client.abort(reason)
        finally:
            self._cleanup()

    def _unlink_names(self) -> None:
        """Remove every segment name still in /dev/shm (the mappings stay): safe from any thread."""
        for m in list(self.meta.values()):
            for seg in list(m.segments):
                if seg is not None:
                    seg.unlink()

    def _cleanup(self) -> None:
        self._closed = True
        _OPEN.discard(self)
        for m in self.meta.values():
            for seg in m.segments:
                if seg is not None:
                    seg.close()
        self.client.close()


def _bytes_of(arr: np.ndarray) -> memoryview:
    """A writable byte view of a contiguous 1-D array slice."""
    return arr.view(np.uint8).data
