"""The worker role's connection to the job: scheduler, servers, heartbeats, request tracking.

``WorkerClient`` sends messages to servers, tracks outstanding requests by sequence number,
and waits for replies. Every wait polls the sockets in short slices and checks the heartbeat
thread between them, so it is bounded by the peers' liveness, never by a wall-clock timeout.
``kv.DistKVStore`` builds the KV API on top of it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import numpy as np
import zmq

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError, NodeFailure, WireError
from trainer_core.ps.liveness import Liveness
from trainer_core.ps.membership import Book, join, scheduler_endpoint
from trainer_core.transport import wire
from trainer_core.transport.control import Received, Transport, poll
from trainer_core.transport.shm import MemBuffer, host_key
from trainer_core.transport.tcp import ChannelClosed, TcpConn
from trainer_core.transport.unix import UnixConn


class WorkerClient:
    """One worker's sockets and in-flight requests."""

    def __init__(self, cfg: NodeConfig, log: logging.Logger, exit_on_failure: bool = True) -> None:
        self.cfg = cfg
        self.log = log
        self.transport = Transport(cfg.secret, log, cfg.verbose)
        self._closed = False
        self._raised = threading.Event()
        try:
            self.sched, self.book = join(self.transport, cfg, cfg.env.node_host or "", None, log)
            self.live = Liveness(
                self.transport,
                scheduler_endpoint(cfg),
                self.book.name,
                cfg.heartbeat_interval,
                cfg.heartbeat_timeout,
                log,
                on_failure=self._on_failure if exit_on_failure else None,
            )
            self.live.start()
            mine = host_key(cfg.env.node_host)
            n = len(self.book.servers)
            self.same_host = [cfg.use_shm and s.host_key == mine for s in self.book.servers]
            self.local: list[UnixConn | None] = [self._connect_local(i) for i in range(n)]
            # Another host's server (or any, with PS_SHM=0) is reached on its data channel
            # (tcpchan.py) unless PS_ENCRYPT=1: then on CURVE, as every control connection.
            self.tcp: list[TcpConn | None] = [
                TcpConn.connect(s.data, cfg.secret) if s.data and not same else None
                for s, same in zip(self.book.servers, self.same_host, strict=True)
            ]
            self.servers: list[zmq.Socket[Any] | None] = [
                None if t is not None else self.transport.connect_dealer(s.endpoint)
                for s, t in zip(self.book.servers, self.tcp, strict=True)
            ]
        except BaseException:
            for conn in [*getattr(self, "local", []), *getattr(self, "tcp", [])]:
                if conn is not None:
                    conn.close()
            self.transport.close()
            raise
        self._index: dict[Any, int] = {id(s): i for i, s in enumerate(self.servers) if s is not None}
        self._last_reply = [0] * n
        self._poller = zmq.Poller()
        for i, sock in enumerate(self.servers):
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)
            for conn in (self.local[i], self.tcp[i]):
                if conn is not None:
                    self._poller.register(conn.fileno(), zmq.POLLIN)
                    self._index[conn.fileno()] = i
        self._places: dict[int, list[memoryview]] = {}  # seq -> where the reply's frames go (tcp channel)
        self._last_push = [0] * n
        self._seq = itertools.count(1)
        self.outstanding: set[int] = set()
        self._replies: dict[int, Received] = {}
        self._async_error: KVError | None = None
        self.local_failure: NodeFailure | None = None
        self._buffers: dict[tuple[int, int], MemBuffer] = {}  # (server, id): servers' shared key storage
        self.before_exit: Callable[[], None] | None = None  # e.g. unlink shared-memory names

    def _connect_local(self, server: int) -> UnixConn | None:
        """The same-host channel to ``server``, or ``None`` (then also no shared memory with it: a
        server whose channel cannot be reached is not really on this host, e.g. another namespace)."""
        info = self.book.servers[server]
        if not (self.same_host[server] and info.local):
            return None
        try:
            return UnixConn.connect(info.local, self.cfg.secret)
        except KVError as exc:
            self.log.warning("server %d: no same-host channel (%s); using TCP", server, exc)
            self.same_host[server] = False
            return None

    @property
    def rank(self) -> int:
        return self.book.rank

    @property
    def info(self) -> Book:
        return self.book

    def send(
        self,
        server: int,
        op: str,
        entries: Sequence[wire.Entry] = (),
        frames: Sequence[Any] = (),
        body: dict[str, Any] | None = None,
        keep: bool = True,
        local: bool = True,
        into: list[memoryview] | None = None,
    ) -> int:
        """Send one request to ``server``. With ``keep`` its reply is awaited with ``wait``; without, the
        request is a push that gets no reply (unless refused): ``confirm`` tells when it was handled.
        ``local=False`` keeps a request off the same-host channel (its reply carries data frames).
        ``into``: where the reply's frames go, one byte view per frame, when the server is on the
        TCP data channel (read there directly, see ``sends_directly``)."""
        self.check()
        seq = next(self._seq)
        header = wire.Header(
            op=op,
            seq=seq,
            src=self.book.name,
            entries=tuple(entries),
            body={"rank": self.rank, **(body or {})},
        )
        conn = self.local[server]
        if conn is not None and local and not frames:  # same host: headers only, on the local channel
            try:
                conn.send(wire.encode(header))
            except OSError:
                self._peer_closed(server)
        elif (tcp := self.tcp[server]) is not None:
            if into is not None:
                self._places[seq] = into
            self.transport.trace_send(header, len(frames))
            try:
                tcp.send(wire.encode(header), frames, self._job_alive)
            except ChannelClosed:
                self._channel_lost(server)
        else:
            sock = self.servers[server]
            assert sock is not None
            self.transport.send(sock, header, frames)
        if keep:
            self.outstanding.add(seq)
        else:
            self._last_push[server] = seq
        return seq

    def sends_directly(self, server: int) -> bool:
        """Whether requests to ``server`` leave from the caller's arrays before ``send`` returns (the
        TCP data channel): then a push needs no private copy and replies can be read in place."""
        return self.tcp[server] is not None

    def confirm(self, server: int, seq: int) -> None:
        """Until ``server`` has handled request ``seq``: a server handles one connection's messages in
        order, so any answered later request proves it; else ask with an empty request."""
        if self._last_reply[server] > seq:
            return
        self.wait([self.send(server, wire.PULL)])

    def wait(self, seqs: Iterable[int]) -> dict[int, Received]:
        """The replies of ``seqs`` (raises ``KVError`` for an error reply, ``NodeFailure`` when the job dies)."""
        want = list(seqs)
        while any(s not in self._replies for s in want):
            self._pump()
        out = {s: self._replies.pop(s) for s in want}
        for msg in out.values():
            if msg.header.op == wire.ERROR:
                raise KVError(f"server refused the request: {msg.header.body.get('reason')}")
        return out

    def handled(self, server: int, seq: int) -> bool:
        """Whether ``server`` is known to have handled request ``seq`` (without waiting)."""
        return self._last_reply[server] >= seq and seq not in self.outstanding

    def drain(self) -> None:
        """Until every request has been answered and every push handled."""
        while self.outstanding:
            self._pump()
        for server, seq in enumerate(self._last_push):
            if seq:
                self.confirm(server, seq)
        self.check()

    def _pump(self) -> None:
        self.check()
        for item, _ in self._poller.poll(100):
            if isinstance(item, int):
                server = self._index[item]
                if self.tcp[server] is not None:
                    self._recv_tcp(server)
                    continue
                for msg in self._recv_local(server):
                    self._dispatch(server, msg)
            else:
                server = self._index[id(item)]
                while (zmsg := self.transport.recv(item, router=False)) is not None:
                    self._dispatch(server, zmsg)

    def _recv_tcp(self, server: int) -> None:
        """Read the messages waiting on ``server``'s data channel, reply frames into their places."""
        conn = self.tcp[server]
        assert conn is not None
        fd = conn.fileno()
        while True:
            try:
                header, payloads = conn.read_message(self._place, self._job_alive)
            except ChannelClosed:
                self._poller.unregister(fd)
                self._channel_lost(server)
            if isinstance(header, wire.Header):
                self.transport.trace_recv(header)
                self._dispatch(server, Received(ident=None, header=header, frames=payloads))
            else:
                self.log.warning("dropped a malformed message from server %d: %s", server, header)
            if not conn.readable():
                return

    def _job_alive(self) -> None:
        """Between the slices of a data-channel transfer: raise only if the job failed (an error reply
        to an earlier push is reported between messages, by ``check``, never in the middle of one)."""
        failure = self.failure
        if failure is not None:
            self._raised.set()
            raise failure

    def _channel_lost(self, server: int) -> NoReturn:
        """``server``'s data channel closed: this side cut a message off (an interrupt), or the peer left."""
        conn = self.tcp[server]
        if conn is not None and conn.interrupted:
            self.check()
            raise KVError(f"server {server}: {conn.interrupted}; this KV store cannot be used any more")
        self._peer_closed(server)

    def _place(self, raw: bytes, lens: list[int]) -> tuple[wire.Header | WireError, list[memoryview]]:
        try:
            header = wire.decode(raw)
        except WireError as exc:
            return exc, []
        into = self._places.pop(header.seq, None)
        return header, into if into is not None and header.op == wire.REPLY else []

    def _recv_local(self, server: int) -> list[Received]:
        conn = self.local[server]
        assert conn is not None
        fd = conn.fileno()
        raw = conn.recv()
        if raw is None:
            self._poller.unregister(fd)
            self._peer_closed(server)
        out = []
        for frame in raw:
            try:
                msg = Received(ident=None, header=wire.decode(frame), frames=[])
                self._map_buffers(server, conn, msg.header)
            except (WireError, KVError, ValueError, TypeError, OSError) as exc:
                self.log.warning("dropped a malformed message from server %d: %s", server, exc)
                continue
            out.append(msg)
        return out

    def _map_buffers(self, server: int, conn: UnixConn, header: wire.Header) -> None:
        """Map the shared buffers whose descriptors came with this reply (``[[id, nbytes], ...]``)."""
        announced = header.body.get("fds") or []
        if not isinstance(announced, list):
            raise WireError("fds must be a list")
        fds = conn.take_fds(len(announced))
        for (ident, nbytes), fd in zip(announced, fds, strict=True):
            if not (isinstance(ident, int) and isinstance(nbytes, int)):
                os.close(fd)
                raise WireError("bad shared buffer announcement")
            self._buffers[(server, ident)] = MemBuffer(nbytes, fd=fd, ident=ident)

    def shared_view(self, server: int, name: str, dtype: np.dtype, n: int) -> np.ndarray:
        """A view of ``n`` elements of server buffer ``launchkit-mem-<id>`` (mapped on an earlier reply)."""
        try:
            buf = self._buffers[(server, int(name.rsplit("-", 1)[1]))]
        except (KeyError, ValueError):
            raise KVError(f"server {server} named an unknown shared buffer {name}") from None
        if n * dtype.itemsize > buf.nbytes:
            raise KVError(f"server {server}: shared buffer {name} is too small")
        return buf.view(dtype, n)

    def _peer_closed(self, server: int) -> NoReturn:
        """A server's local channel closed: the server died or is leaving because the job ends. Give
        the heartbeat thread its timeout to learn the cause from the scheduler, else blame the server."""
        self.live.failed.wait(
            self.cfg.heartbeat_timeout + self.cfg.heartbeat_interval if self.cfg.liveness_on else 1.0
        )
        if self.live.failure is None:
            name = f"server {server}"
            self.local_failure = NodeFailure(f"{name} closed its connection: it died", node=name)
            self.abort(str(self.local_failure), node=name)
        self.check()
        raise AssertionError("unreachable")

    def _dispatch(self, server: int, msg: Received) -> None:
        seq = msg.header.seq
        self._last_reply[server] = max(self._last_reply[server], seq)
        if seq in self.outstanding:
            self.outstanding.discard(seq)
            self._replies[seq] = msg
        elif msg.header.op == wire.ERROR and self._async_error is None:
            self._async_error = KVError(f"server refused a push: {msg.header.body.get('reason')}")

    def check(self) -> None:
        """Raise a failure of the job, or an error reply to an earlier push."""
        self._job_alive()
        if self._async_error is not None:
            err, self._async_error = self._async_error, None
            raise err

    def barrier(self) -> None:
        """Until every worker has called ``barrier`` (bounded by heartbeats)."""
        self._scheduler_call(wire.BARRIER, wire.BARRIER_DONE)

    def finish(self) -> None:
        """Tell the servers and the scheduler this worker is done; wait until every worker is (MXNet's finalize)."""
        self.wait([self.send(s, wire.FINISH) for s in range(len(self.servers))])
        self._scheduler_call(wire.FINISH, wire.FINISHED)

    def abort(self, reason: str, node: str | None = None) -> None:
        """Ask the scheduler to end the job now (``node`` failed, by default this worker); does not wait."""
        if self.live.failure is None:
            body = {"reason": reason, "node": node or self.book.name}
            self.transport.send(self.sched, wire.Header(op=wire.ABORT, src=self.book.name, body=body))

    @property
    def failure(self) -> NodeFailure | None:
        """The failure that ended the job for this worker, if any."""
        return self.live.failure or self.local_failure

    def _scheduler_call(self, op: str, reply_op: str) -> None:
        self.check()
        seq = next(self._seq)
        self.transport.send(self.sched, wire.Header(op=op, seq=seq, src=self.book.name))
        while True:
            self.check()
            if not poll([self.sched], 0.1):
                continue
            while (msg := self.transport.recv(self.sched, router=False)) is not None:
                if msg.header.op == reply_op and msg.header.seq == seq:
                    return

    def _on_failure(self, failure: NodeFailure) -> None:
        """From the heartbeat thread: if the user's code does not meet the failure in a KV call soon
        (a long computation), end the process, as the rest of the job is ending."""

        def watchdog() -> None:
            if not self._raised.wait(max(self.cfg.heartbeat_timeout, 2.0)) and not self._closed:
                self.log.error("trainer_core %s: exiting: %s", self.book.name, failure)
                if self.before_exit is not None:
                    self.before_exit()
                os._exit(1)

        threading.Thread(target=watchdog, daemon=True).start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in [*getattr(self, "local", []), *getattr(self, "tcp", [])]:
            if conn is not None:
                conn.close()
        for buf in getattr(self, "_buffers", {}).values():
            buf.close()
        self.live.stop()
        self.transport.close(linger_ms=0 if self.live.failure else 1000)
