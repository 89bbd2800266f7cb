"""A server's request handling: one received message in, its replies out, on whatever channel it came.

``RequestHandler.handle(msg)`` serves one worker message (init/push/pull/pushpull, mode, optimizer,
compression, state, finish) against the server's ``Store`` and answers on ``msg.reply``; it never
touches a socket or a poller, so tests drive it in one process with ``transport.memory``
channels. What differs between channels is read from their ``caps``: replies with data frames
are refused on a channel that carries headers only; a worker whose channel shares this host's
memory (``caps.shared_memory``) gets pushed data and results through its shared-memory segments,
and in sync mode is pointed at this server's own buffers (descriptors passed once per channel:
``mapped`` records which, until ``channel_closed``);
on channels with ``caps.fresh_seq`` each worker's ``seq`` must increase (replays are dropped);
``place`` tells a ``caps.direct`` channel where a push's frames can land without a copy.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from trainer_core.compression.codec import decode as gc_decode
from trainer_core.compression.codec import resolve_compression
from trainer_core.errors import KVError, WireError
from trainer_core.optim import server as optim
from trainer_core.ps import protocol
from trainer_core.ps.request import Request
from trainer_core.ps.store import Store, StoreError, dtype_of
from trainer_core.transport.channel import ChannelClosed, Peer, Received
from trainer_core.transport.devshm import MemBuffer, Segment

SMALL_FRAMES = 1 << 20  # bytes of frames a request may carry beyond what its entries justify
SHARED_PREFIX = "launchkit-mem-"  # how a reply names one of this server's buffers


class RequestHandler:
    """The server's logic for one job: ``handle`` each message; ``close`` frees shared memory.

    ``prefix`` is the job's shared-memory name prefix (segments of other jobs are refused);
    ``shared``: keep key values in anonymous shared buffers that same-host workers can map.
    """

    def __init__(
        self,
        num_workers: int,
        prefix: str,
        log: logging.Logger,
        shared: bool = False,
        name: str = "server",
        elastic: bool = False,
    ) -> None:
        self.num_workers = num_workers
        #: the workers that may send requests, by id (``membership.worker_id``: the rank in a fixed job)
        self.members = set(range(num_workers))
        self.known = set(self.members)  # every worker id a book has named (members and leavers)
        self.prefix = prefix
        self.log = log
        self.name = name
        self.segments: dict[str, Segment] = {}
        # this server's shared key storage, by ``id`` of the array over each buffer (kept alive here)
        self.buffers: dict[int, tuple[MemBuffer, np.ndarray]] = {}
        self._views: dict[tuple[str, str, int], np.ndarray] = {}  # segment views, by (name, dtype, size)
        #: per same-host channel: the ids of this server's buffers whose descriptors it was sent
        self.mapped: dict[Peer, set[int]] = {}
        self.data_seq: dict[int, int] = {}  # per worker rank: the last seq on ``fresh_seq`` channels
        self.store = Store(num_workers, alloc=self._alloc if shared else None)
        self.store.elastic = elastic

    def channel_closed(self, channel: Peer) -> None:
        """A channel closed: forget which buffers it was sent (a new one is sent them again)."""
        self.mapped.pop(channel, None)

    def close(self) -> None:
        self.mapped.clear()
        self._views.clear()  # before the mappings under them
        for seg in self.segments.values():
            seg.close()
        self.segments.clear()
        for buf, _ in self.buffers.values():
            buf.close()
        self.buffers.clear()

    # -- one message ---------------------------------------------------------------------------

    def handle(self, msg: Received) -> None:
        """Serve one message and answer it (an ``error`` reply when it is refused)."""
        if msg.reply.caps.fresh_seq and not self._fresh(msg):
            return
        h = msg.header
        try:
            rank = protocol.body_int(h, "rank")
            if rank not in self.members:
                raise WireError(f"bad worker rank {rank}")
            self.store.release(rank)
            if h.op != protocol.AWAY:
                self.store.back(rank)
            if h.op in protocol.DATA_OPS:
                req = self._request(msg, rank)
                for r in [req] if not h.entries else self.store.handle(req):
                    self._reply(r)
            elif h.op == protocol.GET_STATE:
                entries, arrays, slots, scalars = self.store.get_state()
                body = {"slots": slots, "scalars": scalars}
                self._send(
                    msg.reply,
                    protocol.Header(protocol.REPLY, h.seq, entries=tuple(entries), body=body),
                    arrays,
                )
            else:
                self._command(msg, rank)
                self._send(msg.reply, protocol.Header(op=protocol.REPLY, seq=h.seq))
        except (KVError, ValueError, TypeError) as exc:
            self.log.warning("%s: refused %s from worker: %s", self.name, h.op, exc)
            refused: dict[str, object] = {"reason": str(exc)}
            if isinstance(exc, StoreError) and exc.finished is not None:
                refused["finished"] = exc.finished  # (the refused worker names it: ``client``)
            self._send(msg.reply, protocol.Header(op=protocol.ERROR, seq=h.seq, body=refused))
        if self.store.failed:
            self._fail_stuck()

    def workers_changed(self, num_workers: int, left: set[int], joined: set[int]) -> None:
        """An elastic job's next epoch (workers by id): the rounds count its members, the pushes of
        the workers that left are dropped from them, and the requests complete now are answered."""
        self.members = (self.members - left) | joined
        self.known |= joined
        self.num_workers = num_workers
        for req in self.store.workers_changed(num_workers, left, joined):
            self._reply(req)

    def newcomer(self, msg: Received) -> int | None:
        """In an elastic job, the worker id of a message from a worker no book has named yet: a
        newcomer whose admission is still on its way here (the book comes on the heartbeat channel,
        the newcomer's requests on others, in no set order); else ``None``."""
        rank = msg.header.body.get("rank")
        if (
            not self.store.elastic
            or not isinstance(rank, int)
            or isinstance(rank, bool)
            or rank in self.known
        ):
            return None
        return rank

    def _fail_stuck(self) -> None:
        """Answer the requests that can never complete (``Store.stuck``) with an error saying why,
        marked ``stuck``: a worker waiting for one ends the job with it (``WorkerClient.wait``)."""
        failed, self.store.failed = self.store.failed, []
        for req, reason in failed:
            self.log.error("%s: %s", self.name, reason)
            body = {"reason": reason, "stuck": True}
            self._send(req.ident, protocol.Header(op=protocol.ERROR, seq=req.header.seq, body=body))

    def _command(self, msg: Received, rank: int) -> None:
        """A request that changes the server's settings or state (answered with an empty reply)."""
        h = msg.header
        if h.op == protocol.SET_STATE:
            self.store.set_state(h.entries, self._state_arrays(msg), *protocol.state_body(h))
        elif h.op == protocol.SET_MODE:
            sync = h.body.get("sync")
            if not isinstance(sync, bool):
                raise WireError("sync must be true or false")
            self.store.sync = sync
        elif h.op == protocol.SET_OPTIMIZER:
            spec = h.body.get("spec")
            if not isinstance(spec, dict):
                raise WireError("spec must be an object")
            self.store.set_optimizer(optim.validate(spec))
        elif h.op == protocol.FINISH:
            for req in self.store.worker_finished(rank):
                reason = f"worker {rank} finished while this request waited for its push (sync mode)"
                body = {"reason": reason, "finished": rank}  # (the waiting worker names it: ``client``)
                self._send(req.ident, protocol.Header(op=protocol.ERROR, seq=req.header.seq, body=body))
        elif h.op == protocol.AWAY:
            at = h.body.get("at")
            if not isinstance(at, str) or not 0 < len(at) <= 64:
                raise WireError("at must be a short string")
            self.store.enter(rank, at, protocol.body_int(h, "n"))
        elif h.op == protocol.SET_COMPRESSION:
            params = h.body.get("params")
            if not isinstance(params, dict):
                raise WireError("params must be an object")
            self.store.set_compression(resolve_compression(params))
        else:
            raise WireError(f"op {h.op} is not served by a server")

    def _fresh(self, msg: Received) -> bool:
        """Replay protection: each worker's sequence numbers must increase (a bad rank is dropped too)."""
        rank = msg.header.body.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank not in self.members:
            return False
        if msg.header.seq <= self.data_seq.get(rank, 0):
            self.log.warning(
                "dropped a replayed or reordered message (seq %d) of worker %d", msg.header.seq, rank
            )
            return False
        self.data_seq[rank] = msg.header.seq
        return True

    def place(self, h: protocol.Header, lens: list[int]) -> list[memoryview | None]:
        """Where a request's frames land on a ``caps.direct`` channel: a push that opens a sync round
        straight into the key's accumulator (``Store.landings``), the rest anywhere (the store
        consumes a request's arrays while handling it, copying any it keeps). A request declaring
        more frame bytes than its entries can hold closes the channel before anything is read."""
        if not lens:
            return []
        declared = sum(lens)
        holds = sum(e.size * dtype_of(e.dtype).itemsize for e in h.entries)  # compressed ones are smaller
        if declared > 2 * holds + SMALL_FRAMES:
            raise ChannelClosed(f"a message declares {declared} bytes of frames for entries of {holds}", True)
        rank = h.body.get("rank")
        if (
            h.op not in (protocol.PUSH, protocol.PUSHPULL)
            or len(lens) != len(h.entries)
            or not isinstance(rank, int)
        ):
            return []
        return [
            None if acc is None else acc.view(np.uint8).data for acc in self.store.landings(rank, h.entries)
        ]

    # -- reading a request ---------------------------------------------------------------------

    @staticmethod
    def _state_arrays(msg: Received) -> list[np.ndarray]:
        """The arrays of a ``set_state`` request: one raw frame per entry, of exactly its size."""
        h = msg.header
        if len(msg.frames) != len(h.entries):
            raise WireError("set_state needs one frame per entry")
        out = []
        for e, frame in zip(h.entries, msg.frames, strict=True):
            dtype = np.dtype(e.dtype)
            if e.shm is not None or e.comp is not None or len(frame.buffer) != e.size * dtype.itemsize:
                raise WireError(f"key {e.key!r}: state frame missing or of the wrong size")
            out.append(np.frombuffer(frame.buffer, dtype=dtype))
        return out

    def _request(self, msg: Received, rank: int) -> Request:
        h = msg.header
        frames = iter(msg.frames)
        inputs: list[np.ndarray | None] = []
        outputs: list[np.ndarray | None] = []
        carries_data = h.op in (protocol.INIT, protocol.PUSH, protocol.PUSHPULL)
        answers = h.op in (protocol.PULL, protocol.PUSHPULL)
        for e in h.entries:
            view = self._segment(e, dtype_of(e.dtype)) if e.shm is not None else None
            if not carries_data:
                inputs.append(None)
            elif view is not None:
                inputs.append(view)
            else:
                inputs.append(self._frame_data(e, dtype_of(e.dtype), next(frames, None), h.op))
            outputs.append(view if answers else None)
        share = msg.reply.caps.shared_memory and all(e.shm is not None for e in h.entries)
        # a pushpull's segments: its worker waits for the answer before it writes them again
        lends = share and h.op == protocol.PUSHPULL
        return Request(msg.reply, h, rank, inputs, outputs, share=share, lends=lends)

    def _frame_data(self, e: protocol.Entry, dtype: np.dtype, frame: Any, op: str) -> np.ndarray:
        """A pushed part's values from its frame: decoded when compressed, else viewed in place.

        A compressed part (never an ``init``) must name a stored key part of its size and dtype
        before it is decoded (so a declared size never drives the decoder's allocation), and what the codec raises
        on a payload it cannot read refuses the request: the payload comes from the network."""
        if e.comp is not None:
            if frame is None:
                raise WireError(f"key {e.key!r}: compressed payload missing")
            stored = self.store.keys.get((e.key, e.part))
            if (
                op == protocol.INIT
                or stored is None
                or stored.weight.size != e.size
                or stored.weight.dtype != dtype
            ):
                raise WireError(
                    f"key {e.key!r} (part {e.part}): a compressed payload must be pushed to a stored part "
                    f"of its size and dtype ({e.size} of {e.dtype} given)"
                )
            try:
                return gc_decode(frame.buffer, e.comp, e.size, dtype)
            except (KeyError, IndexError, ArithmeticError, MemoryError) as exc:
                raise WireError(
                    f"key {e.key!r}: cannot decode its {e.comp.get('type')} payload ({exc!r})"
                ) from None
        if frame is None or len(frame.buffer) != e.size * dtype.itemsize:
            raise WireError(f"key {e.key!r}: data frame missing or of the wrong size")
        return np.frombuffer(frame.buffer, dtype=dtype)

    def _segment(self, e: protocol.Entry, dtype: np.dtype) -> np.ndarray:
        assert e.shm is not None
        view = self._views.get((e.shm, e.dtype, e.size))
        if view is not None:
            return view
        if not e.shm.startswith(self.prefix):
            raise StoreError(f"segment {e.shm} does not belong to this job")
        nbytes = e.size * dtype.itemsize
        seg = self.segments.get(e.shm)
        if seg is None:
            try:
                seg = Segment(e.shm, max(nbytes, 1), create=False)
            except (OSError, ValueError) as exc:
                raise StoreError(f"cannot map segment {e.shm}: {exc}") from None
            self.segments[e.shm] = seg
        if seg.nbytes < nbytes:
            raise StoreError(f"segment {e.shm} is too small")
        view = self._views[(e.shm, e.dtype, e.size)] = seg.view(dtype, e.size)
        return view

    # -- answering -----------------------------------------------------------------------------

    def _send(self, peer: Peer, header: protocol.Header, frames: list[Any] | None = None) -> None:
        """Answer on the channel the request came from (a gone peer is no error: its channel closes)."""
        if frames and not peer.caps.frames:
            reason = "data frames on a channel that carries headers only"
            header, frames = protocol.Header(op=protocol.ERROR, seq=header.seq, body={"reason": reason}), None
        try:
            peer.post(header, frames or ())  # a server never waits for a worker to read
        except ChannelClosed:
            return

    def _reply(self, req: Request) -> None:
        if req.failed:
            return  # answered with an error already (``_fail_stuck``)
        if req.header.op == protocol.PUSH and not req.header.body.get("ack"):
            return  # pushes are not acknowledged (a later reply proves they were handled)
        if any(req.shared):
            self._reply_shared(req)
            return
        frames: list[Any] = [r for r in req.results if r is not None]
        metas = [m for r, m in zip(req.results, req.metas, strict=True) if r is not None]
        body = {"c": metas} if any(m is not None for m in metas) else {}
        self._send(req.ident, protocol.Header(op=protocol.REPLY, seq=req.header.seq, body=body), frames)

    def _alloc(self, dtype: np.dtype, n: int) -> np.ndarray:
        """Key storage in an anonymous shared buffer that same-host workers can map."""
        buf = MemBuffer(n * dtype.itemsize)
        arr = buf.view(dtype, n)
        self.buffers[id(arr)] = (buf, arr)
        return arr

    def _reply_shared(self, req: Request) -> None:
        """Answer with where each value lies in this server's buffers (``launchkit-mem-<id>``),
        passing the descriptors of buffers this channel has not received yet."""
        channel = req.ident  # a channel with ``caps.shared_memory`` (``Request.share``)
        entries, fds, announced = [], [], []
        mapped = self.mapped.setdefault(channel, set())
        for e, result, shared in zip(req.header.entries, req.results, req.shared, strict=True):
            if not shared or result is None:
                entries.append(protocol.Entry(e.key, e.part, e.size, e.dtype))
                continue
            buf = self.buffers[id(result)][0]
            entries.append(protocol.Entry(e.key, e.part, e.size, e.dtype, SHARED_PREFIX + str(buf.id)))
            if buf.id not in mapped and buf.fd is not None:
                mapped.add(buf.id)
                fds.append(buf.fd)
                announced.append([buf.id, buf.nbytes])
        body = {"fds": announced} if announced else {}
        try:
            channel.post(protocol.Header(protocol.REPLY, req.header.seq, "", tuple(entries), body), fds=fds)
        except ChannelClosed:
            self.mapped.pop(channel, None)  # a gone peer is no error: its channel closes
