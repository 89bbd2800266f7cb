"""The same-host channel: Unix-domain stream sockets in the abstract namespace, headers only.

Between two nodes on the same host (a worker and a server, or two workers of a collective) the
arrays travel through shared memory, so the messages are headers only (``caps``: no frames, shared memory). Sending them through a Unix socket
costs one system call each way, where ZeroMQ adds two I/O-thread hand-offs per message: on a busy
host that is most of a small round trip.

Authentication: before anything else a server sends a random 16-byte nonce; the client answers
``HMAC-SHA256(k, "client" + nonce)`` and the server answers ``HMAC-SHA256(k, "server" + nonce)``,
with ``k`` derived from the job secret by keyed BLAKE2b (``auth.py``). A peer without the secret
cannot pass; the secret never crosses the socket; a fresh nonce per connection defeats replay, and
a stream socket cannot be joined by a third process afterwards. Frames are ``[u32 little-endian
length][header]``; a length above ``wire.MAX_HEADER_BYTES`` or a failed handshake closes the
connection. Either side may attach file descriptors (SCM_RIGHTS) to a message, e.g. a server to
a reply: its own shared-memory buffers (``memfd``), which the worker maps once and reads results
from; the header lists them. Either side may ``send`` (from the calling thread) or ``post``
(never waits for the peer: what the socket does not take at once goes from a sender thread,
``outbox.py``), so nodes that all send to each other at once do not deadlock.
"""

from __future__ import annotations

import array
import contextlib
import hmac
import os
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainer_core.errors import KVError
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

_LEN = struct.Struct("<I")
_READ = 1 << 16  # bytes asked of one read
MAX_FDS = 64  # descriptors sent with one sendmsg (the kernel takes at most 253) and read with one recvmsg
_ANC_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_CTRUNC = int(socket.MSG_CTRUNC)  # (the enum's ``&`` runs in Python, on every read)
UNIX_CAPS = Caps(frames=False, shared_memory=True)


def _key(secret: str) -> bytes:
    return channel_key(secret, b"launchkit-kv-unix-v1")


class UnixChannel(Channel):
    """One authenticated connection (client side after ``connect``, server side from ``UnixListener``)."""

    def __init__(self, sock: socket.socket, key: bytes, trace: Trace, nonce: bytes | None = None) -> None:
        super().__init__(UNIX_CAPS, trace)
        self.sock = sock
        self.key = key
        self.nonce = nonce  # server side: set until the client proved the secret
        self.ready = nonce is None
        self.fds: list[int] = []  # received descriptors, in order, until the messages naming them take them
        self._buf: bytes | bytearray = b""  # what was read and not yet cut into messages
        self._outbox = Outbox("unix-send", self._write_queued, lambda: self.closed)

    @classmethod
    def connect(cls, name: str, secret: str, trace: Trace) -> UnixChannel:
        """Connect to a server's listener and pass the handshake (``KVError`` if it fails)."""
        key = _key(secret)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            sock.connect("\0" + name)
            answer_challenge(sock, key)
            sock.settimeout(None)
        except (OSError, KVError) as exc:
            sock.close()
            raise KVError(f"local channel {name}: {exc}") from None
        return cls(sock, key, trace)

    def pollable(self) -> int:
        return self.sock.fileno()

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send one header from the calling thread (after what was posted before), with file
        descriptors attached (SCM_RIGHTS) when given."""
        data = self._message(header, frames)
        try:
            if self._outbox.busy():
                self._outbox.drain(self.alive)
            if fds:
                self._send_with_fds(data, list(fds))
            else:
                self.sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"the same-host channel closed: {exc}") from None

    def post(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send one header without waiting for the peer: what the socket takes at once goes now, the
        rest (and any message posted after it) from this channel's sender thread."""
        data = self._message(header, frames)
        if self._outbox.busy():
            self._outbox.put((data, list(fds)))
            return
        try:
            rest = self._send_now(data, list(fds))
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"the same-host channel closed: {exc}") from None
        if rest[0]:
            self._outbox.put(rest)

    def _message(self, header: wire.Header, frames: Sequence[Any]) -> bytes:
        if frames:
            raise KVError("the same-host channel carries headers only")
        if self.closed:
            raise ChannelClosed("the same-host channel is closed")
        if self.trace.on:
            self.trace.sent(header, 0)
        raw = wire.encode(header)
        return _LEN.pack(len(raw)) + raw

    def _send_now(self, data: bytes, fds: list[int]) -> tuple[bytes, list[int]]:
        """Send what the socket takes without waiting; returns the rest (empty bytes: all sent) and
        the descriptors that did not go with it (as ``_send_with_fds`` splits them)."""
        at = 0
        pieces = -(-len(fds) // MAX_FDS)
        for i in range(pieces):
            end = len(data) if i == pieces - 1 else at + 1
            chunk = fds[i * MAX_FDS : (i + 1) * MAX_FDS]
            try:
                at += socket.send_fds(self.sock, [data[at:end]], chunk, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return data[at:], fds[i * MAX_FDS :]
        while at < len(data):
            try:
                at += self.sock.send(data[at:], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
        return data[at:], []

    def _write_queued(self, item: tuple[bytes, list[int]], alive: Any) -> None:
        """The sender thread: one queued message (or the rest of one), blocking."""
        data, fds = item
        if fds:
            self._send_with_fds(data, fds)
        else:
            self.sock.sendall(data)

    def _send_with_fds(self, data: bytes, fds: list[int]) -> None:
        """``data`` with ``fds`` attached, at most ``MAX_FDS`` to a ``sendmsg`` (each with at least
        one byte of the message): the peer reads them in order, as many as its buffer has room for."""
        pieces = -(-len(fds) // MAX_FDS)
        if pieces > len(data):
            raise OSError(f"{len(fds)} descriptors for a message of {len(data)} bytes")
        at = 0
        for i in range(pieces):
            end = len(data) if i == pieces - 1 else at + 1
            sent = socket.send_fds(self.sock, [data[at:end]], fds[i * MAX_FDS : (i + 1) * MAX_FDS])
            if sent < end - at:
                self.sock.sendall(data[at + sent : end])
            at = end

    def receive(self, handle: Callable[[Received], None]) -> bool:
        messages = None if self.closed else self._recv()
        if messages is None:
            return False
        for raw in messages:
            header = self.trace.decode(raw, self.headers)
            if header is not None:
                handle(Received(header, [], self))
        return True

    def _recv(self) -> list[bytes | bytearray] | None:
        """The complete messages received so far; ``None`` when the peer closed or misbehaved.

        One ``recvmsg`` per call in the common case (a message is far smaller than a read); either
        side takes descriptors, once the peer proved the secret (any before are closed)."""
        while True:
            try:
                chunk, anc, flags, _ = self.sock.recvmsg(_READ, _ANC_SPACE, socket.MSG_DONTWAIT)
                if anc:
                    self._take_ancillary(anc)
                if flags & _CTRUNC:  # descriptors were lost: nothing after can be matched
                    self.interrupted = f"the peer sent more than {MAX_FDS} descriptors at once"
                    self.close()
                    return None
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return None
            if not chunk:
                self.close()
                return None
            if self._buf:
                self._buf += chunk
            else:
                self._buf = bytearray(chunk) if len(chunk) == _READ or not self.ready else chunk
            if len(chunk) < _READ:
                break
        if not self.ready and not self._authenticate():
            return None if self.closed else []
        return self._split()

    def _split(self) -> list[bytes | bytearray] | None:
        """Cut the complete messages off the front of what was read (``None``: one is too long)."""
        buf, out, at = self._buf, [], 0
        while len(buf) - at >= _LEN.size:
            (n,) = _LEN.unpack_from(buf, at)
            if n > wire.MAX_HEADER_BYTES:
                self.close()
                return None
            if len(buf) - at < _LEN.size + n:
                break
            out.append(buf[at + _LEN.size : at + _LEN.size + n])
            at += _LEN.size + n
        self._buf = bytearray(buf[at:]) if at < len(buf) else b""
        return out

    def _take_ancillary(self, anc: list[tuple[int, int, bytes]]) -> None:
        """Keep the descriptors that came with a reply (closed unless this side takes them)."""
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                if self.ready:
                    self.fds.extend(fds)
                else:
                    for fd in fds:
                        os.close(fd)

    def _authenticate(self) -> bool:
        """Server side: check the client's proof once it is whole, answer with ours (closed if wrong)."""
        if len(self._buf) < PROOF_BYTES:
            return False
        assert self.nonce is not None
        proof, self._buf = bytes(self._buf[:PROOF_BYTES]), bytearray(self._buf[PROOF_BYTES:])
        if not hmac.compare_digest(proof, channel_proof(self.key, b"client", self.nonce)):
            self.close()
            return False
        self.ready = True
        self.sock.sendall(channel_proof(self.key, b"server", self.nonce))
        return True

    def take_fds(self, n: int) -> list[int]:
        if n > len(self.fds):
            raise KVError("a message names file descriptors that did not arrive")
        taken, self.fds = self.fds[:n], self.fds[n:]
        return taken

    def stop_sending(self) -> None:
        self._outbox.stop()

    def close(self, flush_s: float = 0.0) -> None:
        """Close; with ``flush_s``, first give the sender thread that long to send what is queued."""
        self._outbox.stop()
        sender = self._outbox.thread
        on_sender = sender is threading.current_thread()
        if sender is not None and flush_s > 0 and not on_sender:
            sender.join(flush_s)
        if self.closed:
            return
        self.closed = True
        if sender is not None:  # wake a send blocked in the sender thread; it ends
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            if not on_sender:
                sender.join(1.0)
        self.sock.close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class UnixListener(Listener):
    """A server's listener, bound in the abstract namespace (no file to remove); ``peers`` may be
    in their handshake at once (``Handshakes``)."""

    def __init__(self, job_id: str, secret: str, trace: Trace, peers: int = 0) -> None:
        self.name = f"launchkit-{job_id}-s-{os.getpid()}-{os.urandom(4).hex()}"
        self.key = _key(secret)
        self.trace = trace
        self.handshakes = Handshakes(trace, "same-host connection(s)", peers)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind("\0" + self.name)
            self.sock.listen(self.handshakes.backlog)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def pollable(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[Channel]:
        """The connections waiting; each is sent its nonce and must prove the secret first."""
        conns: list[Channel] = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return conns
            nonce = offer_nonce(sock)
            if nonce is not None:
                conn = UnixChannel(sock, self.key, self.trace, nonce)
                self.handshakes.add(conn)
                conns.append(conn)

    def stale(self) -> list[Channel]:
        """Connections that did not prove the secret within ``HANDSHAKE_TIMEOUT_S`` (a same-host peer
        that connects and never answers the nonce), and the oldest beyond ``MAX_PENDING``."""
        return self.handshakes.stale(_proved)

    def close(self) -> None:
        self.sock.close()


def _proved(ch: Channel) -> bool:
    return isinstance(ch, UnixChannel) and ch.ready
