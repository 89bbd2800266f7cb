"""The cross-host data channel: one authenticated TCP stream between two nodes on different hosts.

A worker and a server (the parameter server's pushes and pulls) or two workers (the collectives'
links between hosts) exchange their messages on it; registration, barriers and heartbeats stay
on ZeroMQ (``control``).

ZeroMQ moves a message through an I/O thread on each side, allocates a buffer for every received
frame, and pyzmq's zero-copy sends add a garbage-collector hand-off per frame; the worker then
copies each received array into its destination. On a busy host that CPU is most of a cross-host
round trip above the kernel's own copies (bench/HISTORY.md, "Across hosts"). This channel
(``caps.direct``) moves arrays straight between the caller's arrays and the kernel (framing:
``stream.py``) and is symmetric: either side may ``send`` (from the calling thread, so a worker's
push needs no private copy) or ``post`` (never waits for the peer: what the kernel takes at once
goes from the calling thread, usually all of it, and the rest, with any message posted after it,
from one sender thread per connection, ``outbox.py``). A server posts its replies, so it never
stops reading (which rules out a send/send deadlock between workers and servers); workers that all
send to each other at once (a collective's ring) post too. Received arrays are read directly where
the receiver's ``place`` says (a worker's ``pull`` outputs), else into a fresh buffer, or on the
accepting side into a buffer it reuses.

Authentication is the challenge of ``auth.py`` with this channel's own key: the accepting side
(called the server below: a server, or the worker another worker connects to) sends a fresh
16-byte nonce, the connecting side (the client) answers ``HMAC-SHA256(k, "client" + nonce)``, the
server answers ``HMAC-SHA256(k, "server" + nonce)``. The secret never crosses the wire; a peer without it is
closed before any message is read (``TcpListener.stale``: after 10 s, or beyond 64 waiting).
Arrays are not encrypted: ``PS_ENCRYPT=1`` sends them over CURVE (``control``) instead.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainer_core.errors import KVError, WireError
from trainer_core.transport import wire
from trainer_core.transport.auth import PROOF_BYTES, answer_challenge, channel_key, channel_proof, offer_nonce
from trainer_core.transport.channel import (
    HANDSHAKE_TIMEOUT_S,
    Caps,
    Channel,
    ChannelClosed,
    Handshakes,
    Listener,
    Received,
    Trace,
)
from trainer_core.transport.outbox import Outbox
from trainer_core.transport.stream import FramedStream, _bytes_view

_LABEL = b"launchkit-kv-tcp-v1"
STALL_S = 10.0  # a server closes a connection whose started message gets no byte for this long
MESSAGES_PER_TURN = 8  # messages read from one connection before the others get a turn
MALFORMED_FRAMES = 1 << 20  # bytes of frames a message with a bad header may carry (read, dropped)
TCP_CAPS = Caps(frames=True, direct=True, fresh_seq=True)


class TcpChannel(FramedStream, Channel):
    """One connection (client side after ``connect``, server side from ``TcpListener``)."""

    def __init__(self, sock: socket.socket, key: bytes, trace: Trace, nonce: bytes | None = None) -> None:
        FramedStream.__init__(self, sock, reuse=nonce is not None)
        Channel.__init__(self, TCP_CAPS, trace)
        self.key = key
        self.server_side = nonce is not None
        self.nonce = nonce  # server side: set until the client proved the secret
        if self.server_side:
            self.stall_s = STALL_S
        self.ready = nonce is None
        self._proof = b""
        self._outbox = Outbox("tcp-send", self._write_queued, lambda: self.closed)
        self._released = False

    @classmethod
    def connect(cls, endpoint: str, secret: str, trace: Trace) -> TcpChannel:
        """Connect to a node's ``tcp://host:port`` (a server's or a worker's) and pass the handshake
        (``KVError`` if it fails)."""
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        key = channel_key(secret, _LABEL)
        try:
            sock = socket.create_connection((host, int(port)), timeout=HANDSHAKE_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            raise KVError(f"data channel {endpoint}: {exc}") from None
        try:
            nonce = answer_challenge(sock, key)
        except (OSError, KVError) as exc:
            sock.close()
            raise KVError(f"data channel {endpoint}: {exc}") from None
        conn = cls(sock, key, trace)
        conn.start_session(key, nonce, client=True)
        return conn

    def pollable(self) -> int:
        return self.sock.fileno()

    def handshake(self) -> bool | None:
        """Server side, when readable before ``ready``: ``True`` once the client proved the secret
        (the server's proof is sent back), ``False`` while its proof is incomplete, ``None`` (and
        closed) when it failed or the client left."""
        assert self.nonce is not None
        try:
            chunk = self.sock.recv(PROOF_BYTES - len(self._proof), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        self._proof += chunk
        if not chunk or (
            len(self._proof) == PROOF_BYTES
            and not hmac.compare_digest(self._proof, channel_proof(self.key, b"client", self.nonce))
        ):
            self.close()
            return None
        if len(self._proof) < PROOF_BYTES:
            return False
        server_proof = channel_proof(self.key, b"server", self.nonce)
        self.start_session(self.key, self.nonce, client=False)
        self.ready, self.nonce = True, None
        try:
            self._send_all([server_proof], self.alive)
        except KVError:
            self.close()
            return None
        return True

    # -- the Channel interface -----------------------------------------------------------------

    def receive(self, handle: Callable[[Received], None]) -> bool:
        """Finish the handshake, or read up to ``MESSAGES_PER_TURN`` messages, each handled before the
        next is read (a server's frames live in a buffer the next message reuses)."""
        if not self.ready:
            done = self.handshake()
            if done is None:
                self.trace.log.warning("refused a data connection: it failed the handshake")
            return done is not None
        for _ in range(MESSAGES_PER_TURN):
            try:
                header, frames = self.read_message(self._place_raw, self.alive, ready=True)
            except ChannelClosed as exc:
                if exc.violation:
                    self.trace.log.warning("closed a data connection: %s", exc)
                return False
            if isinstance(header, WireError):
                self.trace.log.warning("dropped a malformed message: %s", header)
            else:
                if self.trace.on:
                    self.trace.received(header)
                handle(Received(header, frames, self))
            if self.closed or not self.readable():
                break
        return not self.closed

    def _place_raw(self, raw: bytes, lens: list[int]) -> tuple[wire.Header | WireError, Sequence[Any]]:
        try:
            header = self.headers.decode(raw)
        except WireError as exc:
            if sum(lens) > MALFORMED_FRAMES:
                raise ChannelClosed(
                    f"a malformed message with {sum(lens)} bytes of frames ({exc})", True
                ) from None
            return exc, []
        return header, (self.place(header, lens) if self.place is not None else [])

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send from the calling thread (after what was posted before); returns once the bytes are in
        the kernel, so the caller may change its arrays again. Either side."""
        if fds:
            raise KVError("the TCP data channel carries no file descriptors")
        if self.trace.on:
            self.trace.sent(header, len(frames))
        if self._outbox.busy():
            self._outbox.drain(self.alive)
        self.write(wire.encode(header), frames, self.alive)

    def post(
        self,
        header: wire.Header | bytes,
        frames: Sequence[Any] = (),
        fds: Sequence[int] = (),
        borrowed: bool = False,
    ) -> None:
        """Send without ever waiting for the peer: what the kernel takes at once goes now, from this
        thread; the rest (and any message after it, in order) from this connection's sender thread,
        which reads ``frames`` until it is sent. ``ChannelClosed`` once closed. Either side.
        (``header`` may be given encoded, as to the stream's ``write``.) ``borrowed``: the caller
        may change ``frames`` once this returns, so what the sender thread will send is copied
        first (only that: usually less than the message, often nothing)."""
        if fds:
            raise KVError("the TCP data channel carries no file descriptors")
        if self.closed:
            raise ChannelClosed(self.interrupted or "the connection is closed")
        if isinstance(header, bytes):
            raw = header
        else:
            if self.trace.on:
                self.trace.sent(header, len(frames))
            raw = wire.encode(header)
        if self._outbox.busy():
            self._outbox.put((raw, [bytes(_bytes_view(f)) for f in frames] if borrowed else frames))
            return
        rest = self.send_now(self.frame(raw, frames))
        if rest:
            self._outbox.put((None, [memoryview(bytes(p)) for p in rest] if borrowed else rest))

    def _write_queued(self, item: tuple[bytes | None, Sequence[Any]], alive: Callable[[], None]) -> None:
        """The sender thread: the rest of a message ``post`` began, or a whole queued one."""
        head, parts = item
        if head is None:
            self.send_parts(list(parts), alive)
        else:
            self.write(head, parts, alive)

    def stop_sending(self) -> None:
        """Let the sender thread finish what is queued, then end (see ``close``)."""
        self._outbox.stop()

    def close(self, flush_s: float = 0.0) -> None:
        """Close; with ``flush_s``, first give the sender thread that long to send what is queued.
        The descriptor is released only once no other thread can still use it (it could be reused)."""
        self.stop_sending()
        sender = self._outbox.thread
        on_sender = sender is threading.current_thread()
        if sender is not None and flush_s > 0 and not on_sender:
            sender.join(flush_s)
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        if on_sender:
            return  # the owner's own ``close`` releases the descriptor
        if sender is not None:
            sender.join(1.0)  # shut down: its send fails at once and it ends
            if sender.is_alive():
                return
        if not self._released:
            self._released = True
            self.sock.close()


class TcpListener(Listener):
    """A node's data listener (a server's, or a worker's for the collectives) on ``host`` (``*``:
    every interface), any free port; ``peers`` may be in their handshake at once (``Handshakes``)."""

    def __init__(self, host: str, secret: str, trace: Trace, peers: int = 0) -> None:
        self.key = channel_key(secret, _LABEL)
        self.trace = trace
        self.handshakes = Handshakes(trace, "data connection(s)", peers)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("" if host == "*" else host, 0))
            self.sock.listen(self.handshakes.backlog)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.port: int = self.sock.getsockname()[1]

    def pollable(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[Channel]:
        """The connections waiting, each sent its nonce; their ``receive`` drives the handshake."""
        conns: list[Channel] = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:  # none waiting (or none can be taken now)
                return conns
            nonce = offer_nonce(sock)
            if nonce is not None:
                conn = TcpChannel(sock, self.key, self.trace, nonce)
                self.handshakes.add(conn)
                conns.append(conn)

    def stale(self) -> list[Channel]:
        """Connections that did not prove the secret within ``HANDSHAKE_TIMEOUT_S``, and the oldest
        beyond ``MAX_PENDING`` still in their handshake."""
        return self.handshakes.stale(_proved)

    def close(self) -> None:
        self.sock.close()


def _proved(ch: Channel) -> bool:
    return isinstance(ch, TcpChannel) and ch.ready
