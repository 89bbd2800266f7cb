"""The same-host channel: Unix-domain stream sockets in the abstract namespace, headers only.

Between a worker and a server on the same host the arrays travel through shared memory, so the
messages are headers only (``caps``: no frames, shared memory). Sending them through a Unix socket
costs one system call each way, where ZeroMQ adds two I/O-thread hand-offs per message: on a busy
host that is most of a small round trip.

Authentication: before anything else a server sends a random 16-byte nonce; the client answers
``HMAC-SHA256(k, "client" + nonce)`` and the server answers ``HMAC-SHA256(k, "server" + nonce)``,
with ``k`` derived from the job secret by keyed BLAKE2b (``auth.py``). A peer without the secret
cannot pass; the secret never crosses the socket; a fresh nonce per connection defeats replay, and
a stream socket cannot be joined by a third process afterwards. Frames are ``[u32 little-endian
length][header]``; a length above ``wire.MAX_HEADER_BYTES`` or a failed handshake closes the
connection. A server may attach file descriptors (SCM_RIGHTS) to a reply: its own shared-memory
buffers (``memfd``), which the worker maps once and reads results from; the header lists them.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from trainer_core.errors import KVError
from trainer_core.transport import wire
from trainer_core.transport.auth import PROOF_BYTES, answer_challenge, channel_key, channel_proof, offer_nonce
from trainer_core.transport.channel import Caps, Channel, ChannelClosed, Listener, Received, Trace

_LEN = struct.Struct("<I")
HANDSHAKE_TIMEOUT_S = 10.0
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
        self.accept_fds = nonce is None  # only a client takes file descriptors (a server's shared memory)
        self.fds: list[int] = []  # received descriptors, in order, until the messages naming them take them
        self._buf = bytearray()

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
        """Send one header, with file descriptors attached (SCM_RIGHTS) when given."""
        if frames:
            raise KVError("the same-host channel carries headers only")
        if self.closed:
            raise ChannelClosed("the same-host channel is closed")
        if self.trace.on:
            self.trace.sent(header, 0)
        raw = wire.encode(header)
        data = _LEN.pack(len(raw)) + raw
        try:
            if fds:
                sent = socket.send_fds(self.sock, [data], list(fds))
                if sent < len(data):
                    self.sock.sendall(data[sent:])
            else:
                self.sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"the same-host channel closed: {exc}") from None

    def receive(self, handle: Callable[[Received], None]) -> bool:
        messages = None if self.closed else self._recv()
        if messages is None:
            return False
        for raw in messages:
            header = self.trace.decode(raw)
            if header is not None:
                handle(Received(header, [], self))
        return True

    def _recv(self) -> list[bytes] | None:
        """The complete messages received so far; ``None`` when the peer closed or misbehaved."""
        while True:
            try:
                chunk, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 64, socket.MSG_DONTWAIT)
                if fds:
                    if self.accept_fds and self.ready:
                        self.fds.extend(fds)
                    else:
                        for fd in fds:
                            os.close(fd)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return None
            if not chunk:
                self.close()
                return None
            self._buf += chunk
            if len(chunk) < 1 << 16:
                break
        if not self.ready and not self._authenticate():
            return None if self.closed else []
        out = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > wire.MAX_HEADER_BYTES:
                self.close()
                return None
            if len(self._buf) < _LEN.size + n:
                break
            out.append(bytes(self._buf[_LEN.size : _LEN.size + n]))
            del self._buf[: _LEN.size + n]
        return out

    def _authenticate(self) -> bool:
        """Server side: check the client's proof once it is whole, answer with ours (closed if wrong)."""
        if len(self._buf) < PROOF_BYTES:
            return False
        assert self.nonce is not None
        proof, self._buf = bytes(self._buf[:PROOF_BYTES]), self._buf[PROOF_BYTES:]
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

    def close(self, flush_s: float = 0.0) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
            for fd in self.fds:
                os.close(fd)
            self.fds = []


class UnixListener(Listener):
    """A server's listener, bound in the abstract namespace (no file to remove)."""

    def __init__(self, job_id: str, secret: str, trace: Trace) -> None:
        self.name = f"launchkit-{job_id}-s-{os.getpid()}-{os.urandom(4).hex()}"
        self.key = _key(secret)
        self.trace = trace
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind("\0" + self.name)
            self.sock.listen(256)
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
                conns.append(UnixChannel(sock, self.key, self.trace, nonce))

    def close(self) -> None:
        self.sock.close()
