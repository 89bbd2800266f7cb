"""The server role: holds key parts and serves workers' init/push/pull/pushpull requests.

Run it with ``python -m trainer_core.ps.server`` or by importing trainer_core with
``DMLC_ROLE=server``. It binds a ROUTER on ``DMLC_INTERFACE``'s address (else
``DMLC_NODE_HOST``) on a free port, registers with the scheduler, and serves until the
scheduler ends the job (exit 0) or aborts it (exit 1). Arrays of workers on the same host
are read from and written to their shared-memory segments; the rest travel as frames.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from trainer_core.compression.codec import decode as gc_decode
from trainer_core.compression.codec import resolve_compression
from trainer_core.config import NodeConfig
from trainer_core.errors import KVError, WireError
from trainer_core.log import get_logger
from trainer_core.optim import server as optim
from trainer_core.ps.liveness import Liveness
from trainer_core.ps.membership import join, scheduler_endpoint
from trainer_core.ps.store import Request, Store, StoreError
from trainer_core.transport import wire
from trainer_core.transport.control import Received, Transport, bind_and_publish_hosts
from trainer_core.transport.shm import MemBuffer, Segment, job_prefix
from trainer_core.transport.tcp import HANDSHAKE_TIMEOUT_S, ChannelClosed, TcpConn, TcpListener
from trainer_core.transport.unix import UnixConn, UnixListener


class Server:
    """One server node; ``run()`` returns the exit code."""

    def __init__(self, cfg: NodeConfig, log: logging.Logger | None = None) -> None:
        self.cfg = cfg
        self.log = log or get_logger(cfg.verbose)
        self.transport = Transport(cfg.secret, self.log, cfg.verbose)
        self.segments: dict[str, Segment] = {}
        self.buffers: dict[int, MemBuffer] = {}  # by data address: this server's shared key storage
        self.prefix = job_prefix(cfg.job_id)

    def run(self) -> int:
        try:
            return self._run()
        finally:
            for seg in self.segments.values():
                seg.close()
            self.segments.clear()
            for buf in self.buffers.values():
                buf.close()
            self.buffers.clear()
            self.transport.close(linger_ms=1000)

    def _run(self) -> int:
        cfg = self.cfg
        bind_host, publish_host = bind_and_publish_hosts(cfg.env.interface, cfg.env.node_host)
        self.sock, endpoint = self.transport.bind_router(bind_host)
        port = endpoint.rsplit(":", 1)[1]
        self.listener = UnixListener(cfg.job_id, cfg.secret) if cfg.use_shm else None
        local = self.listener.name if self.listener else ""
        data = ""
        self.data_listener: TcpListener | None = None
        if not cfg.encrypt:
            try:
                self.data_listener = TcpListener(bind_host, cfg.secret)
            except OSError as exc:
                raise KVError(f"cannot listen for the data channel on {bind_host}: {exc}") from None
            data = f"tcp://{publish_host}:{self.data_listener.port}"
        self.data_seq: dict[int, int] = {}  # per worker rank: the last sequence number on the data channel
        _, book = join(
            self.transport,
            cfg,
            publish_host,
            f"tcp://{publish_host}:{port}",
            self.log,
            local=local,
            data=data,
        )
        self.name = book.name
        self.store = Store(book.num_workers, alloc=self._alloc if self.listener is not None else None)
        self.num_workers = book.num_workers
        live = Liveness(
            self.transport,
            scheduler_endpoint(cfg),
            book.name,
            cfg.heartbeat_interval,
            cfg.heartbeat_timeout,
            self.log,
        )
        live.start()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        data_fd = -1
        if self.data_listener is not None:
            data_fd = self.data_listener.fileno()
            poller.register(data_fd, zmq.POLLIN)
        if self.listener is not None:
            poller.register(self.listener.fileno(), zmq.POLLIN)
        conns: dict[int, UnixConn] = {}
        self.tcp_conns: dict[int, TcpConn] = {}

        def alive() -> None:
            if live.failed.is_set() or live.terminated.is_set():
                raise ChannelClosed("the job is ending")

        try:
            while True:
                if live.failed.is_set():
                    return 1
                if live.terminated.is_set():
                    return 0
                self._expire_handshakes(poller)
                for item, _ in poller.poll(100):
                    if item is self.sock:
                        while (msg := self.transport.recv(self.sock, router=True)) is not None:
                            self._serve(msg)
                    elif item == data_fd and self.data_listener is not None:
                        for tconn in self.data_listener.accept():
                            self.tcp_conns[tconn.fileno()] = tconn
                            poller.register(tconn.fileno(), zmq.POLLIN)
                        self._limit_handshakes(poller)
                    elif item in self.tcp_conns:
                        self._serve_tcp(self.tcp_conns[item], poller, alive)
                    elif self.listener is not None and item == self.listener.fileno():
                        for conn in self.listener.accept():
                            conns[conn.fileno()] = conn
                            poller.register(conn.fileno(), zmq.POLLIN)
                    elif item in conns:
                        self._serve_local(conns, poller, item)
        finally:
            live.stop()
            for conn in conns.values():
                conn.close()
            for tconn in self.tcp_conns.values():  # queued replies go out in parallel, for at most 1 s
                tconn.stop_sending()
            deadline = time.monotonic() + (0.0 if live.failed.is_set() else 1.0)
            for tconn in self.tcp_conns.values():
                tconn.close(flush_s=max(0.0, deadline - time.monotonic()))
            if self.listener is not None:
                self.listener.close()
            if self.data_listener is not None:
                self.data_listener.close()

    def _expire_handshakes(self, poller: zmq.Poller) -> None:
        """Close data connections that did not prove the secret within the handshake timeout."""
        for fd, tconn in list(self.tcp_conns.items()):
            if not tconn.ready and time.monotonic() - tconn.born > HANDSHAKE_TIMEOUT_S:
                self.log.warning("closed a data connection that did not authenticate in time")
                self._drop_tcp(fd, poller)

    def _limit_handshakes(self, poller: zmq.Poller) -> None:
        """At most ``_MAX_PENDING`` unauthenticated data connections: close the oldest beyond it."""
        pending = sorted((c.born, fd) for fd, c in self.tcp_conns.items() if not c.ready)
        for _, fd in pending[: max(0, len(pending) - _MAX_PENDING)]:
            self._drop_tcp(fd, poller)

    def _drop_tcp(self, fd: int, poller: zmq.Poller) -> None:
        poller.unregister(fd)
        self.tcp_conns.pop(fd).close()

    def _place(self, raw: bytes, lens: list[int]) -> tuple[wire.Header | WireError, list[memoryview | None]]:
        """A data-channel request's header, decoded, and where its frames go: a push that opens a sync
        round straight into the key's accumulator (``Store.landing``), the rest into the connection's
        reusable buffer (the store consumes a request's arrays while handling it, copying any it keeps)."""
        declared = sum(lens)
        try:
            h = wire.decode(raw)
        except WireError as exc:
            if declared > _SMALL_FRAMES:
                raise ChannelClosed(
                    f"a malformed message with {declared} bytes of frames ({exc})", True
                ) from None
            return exc, []
        # a request's frames are its entries' arrays (compressed ones are smaller): refuse to read
        # more than they can hold before allocating anything
        holds = sum(e.size * np.dtype(e.dtype).itemsize for e in h.entries)
        if declared > 2 * holds + _SMALL_FRAMES:
            raise ChannelClosed(f"a message declares {declared} bytes of frames for entries of {holds}", True)
        rank = h.body.get("rank")
        if h.op not in (wire.PUSH, wire.PUSHPULL) or len(lens) != len(h.entries) or not isinstance(rank, int):
            return h, []
        dests: list[memoryview | None] = []
        for e in h.entries:
            acc = self.store.landing(rank, e)
            dests.append(None if acc is None else acc.view(np.uint8).data)
        return h, dests

    def _serve_tcp(self, conn: TcpConn, poller: zmq.Poller, alive: Callable[[], None]) -> None:
        """A data connection is readable: finish its handshake, or serve the messages waiting."""
        fd = conn.fileno()
        if not conn.ready:
            done = conn.handshake()
            if done is None:
                self.log.warning("refused a data connection: it failed the handshake")
                self._drop_tcp(fd, poller)
            return
        for _ in range(_MESSAGES_PER_TURN):  # then the other connections get their turn
            try:
                header, frames = conn.read_message(self._place, alive)
            except ChannelClosed as exc:
                if exc.violation:
                    self.log.warning("closed a data connection: %s", exc)
                self._drop_tcp(fd, poller)
                return
            if isinstance(header, WireError):
                self.log.warning("dropped a malformed message: %s", header)
            else:
                self.transport.trace_recv(header)
                msg = Received(ident=conn, header=header, frames=frames)
                if self._fresh(msg):
                    self._serve(msg)
            if not conn.readable():
                return

    def _serve_local(self, conns: dict[int, UnixConn], poller: zmq.Poller, fd: int) -> None:
        conn = conns[fd]
        messages = None if conn.closed else conn.recv()
        if messages is None:
            poller.unregister(fd)
            del conns[fd]
            return
        for raw in messages:
            try:
                header = wire.decode(raw)
            except WireError as exc:
                self.log.warning("dropped a malformed message: %s", exc)
                continue
            self._serve(Received(ident=conn, header=header, frames=[]))

    def _fresh(self, msg: Received) -> bool:
        """Replay protection on the data channel: each worker's sequence numbers must increase."""
        rank = msg.header.body.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.num_workers:
            return False
        if msg.header.seq <= self.data_seq.get(rank, 0):
            self.log.warning(
                "dropped a replayed or reordered message (seq %d) of worker %d", msg.header.seq, rank
            )
            return False
        self.data_seq[rank] = msg.header.seq
        return True

    def _send(self, ident: Any, header: wire.Header, frames: list[Any] | None = None) -> None:
        """Answer a worker on the channel its request came from."""
        if isinstance(ident, TcpConn):
            self.transport.trace_send(header, len(frames or ()))
            ident.post(wire.encode(header), frames or ())
            return
        if isinstance(ident, UnixConn):
            if frames:
                header = wire.Header(
                    op=wire.ERROR, seq=header.seq, body={"reason": "data frames on the local channel"}
                )
            if not ident.closed:
                try:
                    ident.send(wire.encode(header))
                except OSError:
                    ident.close()
        else:
            self.transport.send(self.sock, header, frames or (), ident=ident)

    def _serve(self, msg: Received) -> None:
        h = msg.header
        assert msg.ident is not None
        try:
            rank = wire.body_int(h, "rank")
            if not 0 <= rank < self.num_workers:
                raise WireError(f"bad worker rank {rank}")
            if h.op in wire.DATA_OPS:
                req = self._request(msg, rank)
                done = [req] if not h.entries else self.store.handle(req)
                for r in done:
                    self._reply(r)
                return
            if h.op == wire.GET_STATE:
                entries, arrays, slots, scalars = self.store.get_state()
                body = {"slots": slots, "scalars": scalars}
                self._send(
                    msg.ident,
                    wire.Header(op=wire.REPLY, seq=h.seq, entries=tuple(entries), body=body),
                    arrays,
                )
                return
            if h.op == wire.SET_STATE:
                self.store.set_state(h.entries, self._state_arrays(msg), *wire.state_body(h))
            elif h.op == wire.SET_MODE:
                sync = h.body.get("sync")
                if not isinstance(sync, bool):
                    raise WireError("sync must be true or false")
                self.store.sync = sync
            elif h.op == wire.SET_OPTIMIZER:
                spec = h.body.get("spec")
                if not isinstance(spec, dict):
                    raise WireError("spec must be an object")
                self.store.set_optimizer(optim.validate(spec))
            elif h.op == wire.FINISH:
                for req in self.store.worker_finished(rank):
                    reason = f"worker {rank} finished while this request waited for its push (sync mode)"
                    self._send(
                        req.ident, wire.Header(op=wire.ERROR, seq=req.header.seq, body={"reason": reason})
                    )
            elif h.op == wire.SET_COMPRESSION:
                params = h.body.get("params")
                if not isinstance(params, dict):
                    raise WireError("params must be an object")
                self.store.set_compression(resolve_compression(params))
            else:
                raise WireError(f"op {h.op} is not served by a server")
            self._send(msg.ident, wire.Header(op=wire.REPLY, seq=h.seq))
        except (KVError, ValueError, TypeError) as exc:
            self.log.warning("%s: refused %s from worker: %s", getattr(self, "name", "server"), h.op, exc)
            self._send(msg.ident, wire.Header(op=wire.ERROR, seq=h.seq, body={"reason": str(exc)}))

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
        carries_data = h.op in (wire.INIT, wire.PUSH, wire.PUSHPULL)
        answers = h.op in (wire.PULL, wire.PUSHPULL)
        for e in h.entries:
            dtype = np.dtype(e.dtype)
            view = self._segment(e, dtype) if e.shm is not None else None
            data: np.ndarray | None = None
            if carries_data:
                if view is not None:
                    data = view
                elif e.comp is not None:
                    frame = next(frames, None)
                    if frame is None:
                        raise WireError(f"key {e.key!r}: compressed payload missing")
                    data = gc_decode(frame.buffer, e.comp, e.size, dtype)
                else:
                    frame = next(frames, None)
                    if frame is None or len(frame.buffer) != e.size * dtype.itemsize:
                        raise WireError(f"key {e.key!r}: data frame missing or of the wrong size")
                    data = np.frombuffer(frame.buffer, dtype=dtype)
            inputs.append(data)
            outputs.append(view if answers else None)
        share = isinstance(msg.ident, UnixConn) and all(e.shm is not None for e in h.entries)
        return Request(ident=msg.ident, header=h, rank=rank, inputs=inputs, outputs=outputs, share=share)

    def _segment(self, e: wire.Entry, dtype: np.dtype) -> np.ndarray:
        assert e.shm is not None
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
        return seg.view(dtype, e.size)

    def _reply(self, req: Request) -> None:
        if req.header.op == wire.PUSH and not req.header.body.get("ack"):
            return  # pushes are not acknowledged (a later reply proves they were handled)
        if any(req.shared):
            self._reply_shared(req)
            return
        frames: list[Any] = [r for r in req.results if r is not None]
        metas = [m for r, m in zip(req.results, req.metas, strict=True) if r is not None]
        body = {"c": metas} if any(m is not None for m in metas) else {}
        self._send(req.ident, wire.Header(op=wire.REPLY, seq=req.header.seq, body=body), frames)

    def _alloc(self, dtype: np.dtype, n: int) -> np.ndarray:
        """Key storage in an anonymous shared buffer that same-host workers can map."""
        buf = MemBuffer(n * dtype.itemsize)
        arr = buf.view(dtype, n)
        self.buffers[arr.__array_interface__["data"][0]] = buf
        return arr

    def _reply_shared(self, req: Request) -> None:
        """Answer with where each value lies in this server's buffers (``launchkit-mem-<id>``),
        passing the descriptors of buffers this worker has not mapped yet."""
        conn = req.ident
        assert isinstance(conn, UnixConn)
        entries, fds, announced = [], [], []
        for e, result, shared in zip(req.header.entries, req.results, req.shared, strict=True):
            if not shared or result is None:
                entries.append(wire.Entry(e.key, e.part, e.size, e.dtype))
                continue
            buf = self.buffers[result.__array_interface__["data"][0]]
            entries.append(wire.Entry(e.key, e.part, e.size, e.dtype, f"launchkit-mem-{buf.id}"))
            if buf.id not in conn.sent_fds and buf.fd is not None:
                conn.sent_fds.add(buf.id)
                fds.append(buf.fd)
                announced.append([buf.id, buf.nbytes])
        header = wire.Header(
            op=wire.REPLY, seq=req.header.seq, entries=tuple(entries), body={"fds": announced}
        )
        if not conn.closed:
            try:
                conn.send(wire.encode(header), fds)
            except OSError:
                conn.close()


_SMALL_FRAMES = 1 << 20  # bytes of frames a request may carry beyond what its entries justify
_MESSAGES_PER_TURN = 8  # messages served from one data connection before the others get a turn
_MAX_PENDING = 64  # data connections still in their handshake; beyond it the oldest is closed


def main(environ: dict[str, str] | None = None) -> int:
    """Entry point of ``python -m trainer_core.ps.server``."""
    cfg = NodeConfig.from_environ(environ, role="server")
    return Server(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
