"""``DistKVStore``: the worker side of ``dist_sync``/``dist_async`` (and their ``_device`` variants).

Each key is split into parts (``sharding.py``); one message per server carries all the parts
of a call for that server. A part exchanged with a server whose channel shares this host's memory
goes through a shared-memory segment owned by this worker (the channel carries only the header);
otherwise the part travels as a frame. Pushes do not wait for the server: a part's segment is
reused only after the server has handled the previous push from it (pushes get no reply; any
later answered request to the same server proves it, see ``WorkerClient.confirm``). A pull of
exactly the keys of the push before it costs no message of its own: the push went out as a
``pushpull`` whose replies the pull takes, or was held until the pull (at most ``held.HOLD_S``) and
goes out with it as one ``pushpull`` (``held.py``). The servers' state for checkpoints is in
``dist_state.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import dmlc_env
import trainer_core.metrics as metrics
from trainer_core.compression.codec import (
    WorkerCodec,
    agreed_compression,
    resolve_compression,
    validate_params,
)
from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError, KVError, NodeFailure
from trainer_core.kv import dist_state
from trainer_core.kv.api import _OPEN, KVStore, check_key, normalize
from trainer_core.kv.excepthook import install_excepthook
from trainer_core.kv.figures import for_store, timed
from trainer_core.kv.held import Asked, Held, PushHold, askable, serial
from trainer_core.kv.keys import KeyMeta, Outgoing, Where
from trainer_core.kv.results import Results
from trainer_core.log import get_logger
from trainer_core.optim.server import to_spec
from trainer_core.ps import protocol
from trainer_core.ps.client import WorkerClient
from trainer_core.ps.protocol import Key
from trainer_core.ps.sharding import Part, split
from trainer_core.transport.channel import Received
from trainer_core.transport.devshm import Segment, SegmentFactory
from trainer_core.xp import flat_sum, to_host


class DistKVStore(KVStore):
    """A worker of a parameter-server job."""

    def __init__(
        self, name: str, cfg: NodeConfig, exit_on_failure: bool = True, client: WorkerClient | None = None
    ) -> None:
        """Join the job (or use ``client``, already connected: tests on in-memory channels)."""
        if client is None and cfg.env.num_servers < 1:
            raise ConfigError(
                f"kvstore {name!r} needs at least one parameter server, and this job has none "
                "(DMLC_NUM_SERVER=0, launched with -s 0): start it with -s 1 or more"
            )
        self.type = name
        self.sync = "async" not in name
        self.cfg = cfg
        self.log = get_logger(cfg.verbose)
        self.client = client or WorkerClient.join(cfg, self.log, exit_on_failure=exit_on_failure)
        self.num_servers = self.client.book.num_servers
        self.meta: dict[Key, KeyMeta] = {}
        self.segments = SegmentFactory(cfg.job_id, f"w{self.client.worker_id}")  # (never reused)
        self._unlink: list[tuple[Segment, int, int]] = []
        self._closed = False
        self.compression: dict[str, Any] | None = None
        self.codec = WorkerCodec()
        self.hold = PushHold(self._send_held, self.client.forget)
        self.timing, self._figures = for_store(self.codec.stats, self.client.live)
        metrics.add_source(self._figures)
        _OPEN.add(self)
        install_excepthook()
        self.client.before_exit = self._unlink_names
        #: it joined a running elastic job: the others set the mode and the keys already
        self.late = self.client.node.joined_late
        try:
            if not self.late:
                self._agree("create()", {"sync": self.sync})
                self._to_all_servers(protocol.SET_MODE, {"sync": self.sync}, "create()")
        except BaseException:
            self._cleanup()
            raise
        if cfg.env.elastic is not None:  # for the launcher: the survivors of a change run on
            metrics.report(**{dmlc_env.ELASTIC_IN_PROCESS_FIGURE: 1})

    @property
    def rank(self) -> int:
        """This worker's rank in the current book: in an elastic job it changes with the membership
        (dense ranks at every epoch; a survivor's only goes down), read each time as MXNet's."""
        return self.client.book.rank

    @property
    def num_workers(self) -> int:
        """The job's workers in the current book (an elastic job's members of the current epoch)."""
        return self.client.book.num_workers

    # -- control ------------------------------------------------------------------------------------

    def _to_all_servers(self, op: str, body: dict[str, Any], at: str) -> None:
        """Rank 0 sends a command to every server and waits for the acks; then every worker meets."""
        if self.rank == 0:
            self.client.wait([self.client.send(s, op, body=body) for s in range(self.num_servers)])
        self._meet(at)

    def _meet(self, at: str) -> None:
        """A barrier of API call ``at``: this worker's requests answered, the servers told that it
        waits at the scheduler (a request waiting for its push then fails, naming both), then the
        scheduler's barrier (an error naming who is where when another worker is in another call)."""
        self.client.drain()
        self.client.away(at)
        self.client.barrier(at)

    def _agree(self, at: str, value: Any) -> Any:
        """A job-wide setting of API call ``at``, agreed with every other worker (as ``_meet``, at the
        scheduler): returns it, or raises ``KVError`` on every worker, naming each worker's value."""
        self.client.drain()
        self.client.away(at)
        return self.client.agree(at, value)

    @serial()
    def agree(self, at: str, value: Any) -> Any:
        """Collective: every worker gives ``value`` (plain data: dicts, lists, strings, numbers,
        booleans) for the job-wide setting named ``at``; returns it when every worker gave the same,
        else raises ``KVError`` on every worker naming each value and the ranks that gave it."""
        return self._agree(at, value)

    @serial()
    def barrier(self) -> None:
        self._meet("barrier()")

    @serial()
    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        """Server-side optimizer for every key (sent as a plain-data spec, see ``optim/server.py``);
        every worker calls it with the same optimizer (agreed: else an error on every worker)."""
        spec = to_spec(optimizer, **kwargs)
        self._agree("set_optimizer()", spec)
        self._to_all_servers(protocol.SET_OPTIMIZER, {"spec": spec}, "set_optimizer()")

    @serial()
    def set_gradient_compression(self, params: Any) -> None:
        """Validate, keep, and forward compression params (see ``compression/codec.py``); every worker
        calls it at the same point with the same params (agreed: else an error on every worker; it
        ends with a barrier). Residuals start from zero."""
        active = resolve_compression(params)
        self.compression = validate_params(params)
        self._agree("set_gradient_compression()", agreed_compression(active))
        self.client.drain()
        self.codec.set_params(active)
        self._to_all_servers(
            protocol.SET_COMPRESSION, {"params": self.compression}, "set_gradient_compression()"
        )

    def wire_stats(self) -> dict[str, int]:
        """Data bytes sent and received (payloads; raw parts at their size), ``raw_*`` (what 32-bit
        values would have been), ``exchanges`` (data requests); ``metrics`` reports them too."""
        return self.codec.stats.as_dict()

    def compression_state(self) -> dict[str, dict[str, Any]]:
        """This worker's error-feedback residuals by ``"<key>/<part>"`` (for checkpoints)."""
        return self.codec.state()

    def load_compression_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Restore ``compression_state()`` (after ``set_gradient_compression`` and ``init``)."""
        self.codec.load_state(state, {str(k): k for k in self.meta})

    @serial()
    def server_state(self) -> dict[Key, dict[str, Any]]:
        """The servers' state of every key, for checkpoints (collective; see ``dist_state.server_state``)."""
        return dist_state.server_state(self.client, self.meta)

    @serial()
    def load_server_state(self, state: dict[Key, dict[str, Any]]) -> None:
        """Restore ``server_state()`` on the servers (collective; see ``dist_state.load_server_state``)."""
        dist_state.load_server_state(self.client, self._meta, state)

    # -- data ---------------------------------------------------------------------------------------

    @serial()
    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        """Every worker calls it with the same keys and shapes; rank 0's values are stored. A key
        that holds a value already may only be given the same values again: else the servers
        refuse, and every worker raises that error. A worker that joined a running elastic job
        calls it alone: its ``value`` arrays get the keys' current values (it pulls them)."""
        pairs = normalize(key, value)
        per_server: dict[int, Outgoing] = {}
        metas: dict[Key, KeyMeta] = {}
        for k, vals in pairs:
            host = to_host(vals[0])
            dtype = np.dtype(host.dtype)
            if dtype.str not in protocol.DTYPES:
                raise KVError(f"key {k!r}: unsupported dtype {dtype}")
            parts = split(k, host.size, self.num_servers, self.cfg.bigarray_bound)
            old = self.meta.get(k)
            if old is not None and old.shape == host.shape and old.dtype == dtype:
                metas[k] = old  # (its segments stay)
            else:
                metas[k] = KeyMeta(host.shape, dtype, host.size, parts, [None] * len(parts), [0] * len(parts))
            flat = np.ascontiguousarray(host).reshape(-1)
            for p in parts:
                out = per_server.setdefault(p.server, Outgoing())
                out.entries.append(protocol.Entry(k, p.index, p.size, dtype.str))
                out.frames.append(flat[p.start : p.stop])
        if self.late:  # the keys hold the job's values: this worker takes them before its first push
            self.meta.update(metas)
            self._exchange(protocol.PULL, [(k, []) for k, _ in pairs], pairs)
            return
        refused = None
        if self.rank == 0:
            try:
                self.client.wait(
                    [self.client.send(s, protocol.INIT, o.entries, o.frames) for s, o in per_server.items()]
                )
            except NodeFailure:
                raise
            except KVError as exc:  # every worker raises it (after the agreement below)
                refused = {"error": str(exc)}
        outcome = self._agree("init()", refused)
        if isinstance(outcome, dict) and "error" in outcome:
            raise KVError(str(outcome["error"]))
        self.meta.update(metas)

    @serial(flush=False)
    def push(self, key: Key | Sequence[Key], value: Any) -> None:
        self._exchange(protocol.PUSH, normalize(key, value), None)

    @serial(flush=False)
    def pull(self, key: Key | Sequence[Key], out: Any) -> Any:
        pairs = normalize(key, out)
        self._exchange(protocol.PULL, [(k, []) for k, _ in pairs], pairs)
        return out

    @serial(flush=False)
    def pushpull(self, key: Key | Sequence[Key], value: Any, out: Any = None) -> Any:
        """Push and pull in one message per server (one round trip)."""
        target = value if out is None else out
        self._exchange(protocol.PUSHPULL, normalize(key, value), normalize(key, target))
        return target

    def initialized(self, key: Key) -> bool:
        return key in self.meta

    def _meta(self, key: Key) -> KeyMeta:
        m = self.meta.get(key) if type(key) is str or type(key) is int else None
        if m is None:
            check_key(key)
            raise KVError(f"key {key!r} was not initialized (call init on every worker first)")
        return m

    def _segment(self, m: KeyMeta, p: Part, writing: bool) -> Segment | None:
        """The part's segment (``None``: the server shares no memory with this worker). Before
        ``writing`` into it, wait until the server consumed the previous push from it. A pull needs
        no wait: the server handles the messages of one channel in order, so it reads an earlier
        push before it writes the result."""
        if not self.client.same_host[p.server]:
            return None
        seg = m.segments[p.index]
        if seg is None:
            seg = m.segments[p.index] = self.segments.create(p.size * m.dtype.itemsize)
        elif writing and m.busy[p.index]:
            self.client.confirm(p.server, m.busy[p.index])
            m.busy[p.index] = 0
        return seg

    @timed
    def _exchange(
        self, op: str, pushes: list[tuple[Key, list[Any]]], pulls: list[tuple[Key, list[Any]]] | None
    ) -> None:
        """One push, pull or pushpull call: one message per server, then (pulls) the replies. A push
        is asked or held (``held.py``); a pull of exactly its keys takes its replies or sends it as
        a ``pushpull``."""
        keys = frozenset([k for k, _ in pushes])
        if len(keys) != len(pushes):
            twice = sorted({repr(k) for k, _ in pushes if sum(k == j for j, _ in pushes) > 1})
            raise KVError(f"key {', '.join(twice)} appears more than once in one call")
        taken = self.hold.take(keys) if op == protocol.PULL else None
        self.hold.flush()  # before packing: a held push's segments must be sent before reuse
        self._release_names()
        self.codec.stats.exchanges += 1
        if taken is None:
            per_server, compressed = self._pack(pushes, pulls is not None)
        else:
            for where in taken.wheres():
                self.codec.stats.raw_received += sum(p.size * m.dtype.itemsize for m, p, _ in where)
            per_server, compressed = taken.per_server, taken.compressed
            op = protocol.PUSHPULL
        if pulls is None:  # a push: asked or held (``held.py``) unless it left from the caller's array
            if any(o.borrowed for o in per_server.values()):
                self._send(op, per_server, compressed, None)
            elif askable(
                self.sync and not compressed, per_server, self.client.same_host, self.client.unclaimed
            ):
                sent = self._send(protocol.PUSHPULL, per_server, False, None, asked=True)
                self.hold.ask(Asked(per_server, False, keys, sent))
            else:
                self.hold.hold(Held(per_server, compressed, keys))
                self.client.check()  # an error reply to an earlier push, as a send would raise it
            return
        results = Results()  # where each key's pulled value is assembled (an output where it can)
        results.plan(pulls, self._meta)
        sent = taken.sent if isinstance(taken, Asked) else self._send(op, per_server, compressed, results)
        replies = self.client.wait(list(sent))
        for seq, (server, where) in sent.items():
            self._unpack(server, where, replies[seq], results)
        results.finish(pulls, self._meta)

    def _pack(self, pushes: list[tuple[Key, list[Any]]], pulling: bool) -> tuple[dict[int, Outgoing], bool]:
        """The message for each server, and whether any part is compressed."""
        per_server: dict[int, Outgoing] = {}
        compressed = False
        for k, vals in pushes:
            m = self._meta(k)
            packed = self.codec.active(m.dtype)  # compressed: summed and encoded on the values' device
            flat = flat_sum(vals, m.dtype, device=packed) if vals else None
            if flat is not None and flat.size != m.size:
                raise KVError(f"key {k!r}: pushed {flat.size} elements, initialized with {m.size}")
            compressed = compressed or packed
            whole = len(m.parts) == 1
            for p in m.parts:
                out = per_server.get(p.server)
                if out is None:
                    out = per_server[p.server] = Outgoing()
                part = (flat if whole else flat[p.start : p.stop]) if flat is not None else None
                self._pack_part(out, k, m, p, part, packed, pulling)
        return per_server, compressed

    def _pack_part(
        self, out: Outgoing, k: Key, m: KeyMeta, p: Part, data: np.ndarray | None, packed: bool, pulling: bool
    ) -> None:
        """Add one part to its server's message: compressed in a frame, in a segment, or raw in a frame."""
        stats = self.codec.stats
        raw = p.size * m.dtype.itemsize
        if data is not None:
            stats.raw_sent += raw
        if pulling:
            stats.raw_received += raw
        seg = None if packed else self._segment(m, p, writing=data is not None)
        if packed and data is not None:
            payload, meta = self.codec.encode(k, p.index, data)
            out.entries.append(protocol.Entry(k, p.index, p.size, m.dtype.str, comp=meta))
            out.frames.append(payload)
            stats.sent += payload.nbytes
        elif seg is not None:
            if data is not None:
                np.copyto(seg.view(m.dtype, p.size), data)
                stats.sent += raw
            out.entries.append(protocol.Entry(k, p.index, p.size, m.dtype.str, seg.name))
        else:
            out.entries.append(protocol.Entry(k, p.index, p.size, m.dtype.str))
            if data is not None and not packed:
                # zero-copy when the bytes are gone before the call returns: the call waits for the
                # reply, or the channel sends from this thread (``caps.direct``); else a private copy
                now = pulling or self.client.sends_directly(p.server)
                out.frames.append(data if now else np.array(data, copy=True))
                out.borrowed = out.borrowed or (now and not pulling)
                stats.sent += raw
        out.where.append((m, p, seg))

    def _send_held(self, held: Held) -> None:
        """Send a held push as plain pushes (not once the job failed: the next call raises that)."""
        if self.client.failure is None:
            self._send(protocol.PUSH, held.per_server, held.compressed, None)

    def _send(
        self,
        op: str,
        per_server: dict[int, Outgoing],
        compressed: bool,
        results: Results | None,
        asked: bool = False,
    ) -> dict[int, tuple[int, Where]]:
        """Send each server its message; returns ``seq -> (server, parts)``. ``results``: where a
        pull's values go (``None`` for pushes, which get no reply unless ``asked``)."""
        pulling = results is not None or asked
        sent: dict[int, tuple[int, Where]] = {}
        for server, out in per_server.items():
            into = None
            if results is not None and not compressed and self.client.sends_directly(server):
                into = results.into(out.where)
            seq = self.client.send(
                server, op, out.entries, out.frames, keep=pulling, local=not compressed, into=into
            )
            sent[seq] = (server, out.where)
            for m, p, seg in out.where:
                if seg is not None:
                    if seg.named:
                        self._unlink.append((seg, server, seq))
                    m.busy[p.index] = seq
        return sent

    def _unpack(self, server: int, where: Where, reply: Received, results: Results) -> None:
        """Copy one reply's values into the results: from the server's shared buffer, from this
        worker's segment, or from (or already in) a frame."""
        stats = self.codec.stats
        frames_in = iter(reply.frames)
        metas = reply.header.body.get("c")
        metas_in: Iterator[Any] = iter(metas if isinstance(metas, list) else [])
        located = reply.header.entries  # set when values are read from the server's buffers
        for idx, (m, p, seg) in enumerate(where):
            m.busy[p.index] = 0
            where_is = located[idx].shm if idx < len(located) else None
            if where_is is not None:
                results.put(m, p, self.client.shared_view(server, where_is, m.dtype, p.size))
                stats.received += p.size * m.dtype.itemsize
            elif seg is not None:
                results.put(m, p, seg.view(m.dtype, p.size))
                stats.received += p.size * m.dtype.itemsize
            else:
                results.read_frame(m, p, next(frames_in, None), next(metas_in, None), stats)

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
        """Wait for in-flight requests and for every worker to finish, then free channels and segments."""
        if self._closed:
            return
        self._closed = True
        try:
            with self.hold.lock:
                if self.client.failure is None:
                    self.hold.flush()
                    self.client.drain()
                    self.client.finish()
        finally:
            self._cleanup()

    def abort(self, reason: str) -> None:
        """End the whole job now (an uncaught exception in this worker): tell the scheduler, free everything."""
        if self._closed:
            return
        self.hold.drop()
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
        self.hold.close()
        _OPEN.discard(self)
        metrics.remove_source(self._figures)
        for m in self.meta.values():
            for seg in m.segments:
                if seg is not None:
                    seg.close()
        self.client.close()
