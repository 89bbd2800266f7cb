"""The same-host header channel: Unix-domain stream sockets in the abstract namespace.

Between a worker and a server on the same host the arrays travel through shared memory, so the
messages are headers only. Sending them through a Unix socket costs one system call each way,
where ZeroMQ adds two I/O-thread hand-offs per message: on a busy host that is most of a small
round trip. This module is the only one besides ``transport.py`` that touches sockets.

Authentication: before anything else a server sends a random 16-byte nonce; the client answers
``HMAC-SHA256(k, "client" + nonce)`` and the server answers ``HMAC-SHA256(k, "server" + nonce)``,
with ``k`` derived from the job secret by keyed BLAKE2b. A peer without the secret cannot pass;
the secret never crosses the socket; a fresh nonce per connection defeats replay, and a stream
socket cannot be joined by a third process afterwards. Frames are ``[u32 little-endian length]
[header]``; a length above ``wire.MAX_HEADER_BYTES`` or a failed handshake closes the connection.
A server may attach file descriptors (SCM_RIGHTS) to a reply: its own shared-memory buffers
(``memfd``), which the worker maps once and reads results from; the header lists them.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct

from trainer_core.errors import KVError
from trainer_core.transport import wire
from trainer_core.transport.auth import channel_key, channel_proof

_LEN = struct.Struct("<I")
NONCE_BYTES = 16
PROOF_BYTES = 32
HANDSHAKE_TIMEOUT_S = 10.0


def _key(secret: str) -> bytes:
    return channel_key(secret, b"launchkit-kv-unix-v1")


_mac = channel_proof


class UnixConn:
    """One authenticated connection; ``send`` a header, ``recv`` the complete ones that arrived."""

    def __init__(self, sock: socket.socket, key: bytes, nonce: bytes | None = None) -> None:
        self.sock = sock
        self.key = key
        self.nonce = nonce  # server side: set until the client proved the secret
        self.ready = nonce is None
        self.accept_fds = nonce is None  # only a client takes file descriptors (a server's shared memory)
        self.fds: list[int] = []  # received descriptors, in order, until the messages naming them take them
        self.sent_fds: set[int] = set()  # server side: ids of the buffers this peer has received
        self.closed = False
        self._buf = bytearray()

    @classmethod
    def connect(cls, name: str, secret: str) -> UnixConn:
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
        return cls(sock, key)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, header: bytes, fds: list[int] | None = None) -> None:
        """Send one header, with file descriptors attached (SCM_RIGHTS) when given."""
        data = _LEN.pack(len(header)) + header
        if fds:
            sent = socket.send_fds(self.sock, [data], fds)
            if sent < len(data):
                self.sock.sendall(data[sent:])
        else:
            self.sock.sendall(data)

    def recv(self) -> list[bytes] | None:
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
        if not self.ready:
            if len(self._buf) < PROOF_BYTES:
                return []
            assert self.nonce is not None
            proof, self._buf = bytes(self._buf[:PROOF_BYTES]), self._buf[PROOF_BYTES:]
            if not hmac.compare_digest(proof, _mac(self.key, b"client", self.nonce)):
                self.close()
                return None
            self.ready = True
            self.sock.sendall(_mac(self.key, b"server", self.nonce))
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

    def take_fds(self, n: int) -> list[int]:
        """The next ``n`` received descriptors (the caller owns them); ``KVError`` if they did not come."""
        if n > len(self.fds):
            raise KVError("a message names file descriptors that did not arrive")
        taken, self.fds = self.fds[:n], self.fds[n:]
        return taken

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
            for fd in self.fds:
                os.close(fd)
            self.fds = []


class UnixListener:
    """A server's listener, bound in the abstract namespace (no file to remove)."""

    def __init__(self, job_id: str, secret: str) -> None:
        self.name = f"launchkit-{job_id}-s-{os.getpid()}-{os.urandom(4).hex()}"
        self.key = _key(secret)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.name)
        self.sock.listen(256)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[UnixConn]:
        """The connections waiting; each is sent its nonce and must prove the secret first."""
        conns: list[UnixConn] = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return conns
            nonce = offer_nonce(sock)
            if nonce is not None:
                conns.append(UnixConn(sock, self.key, nonce))

    def close(self) -> None:
        self.sock.close()


def offer_nonce(sock: socket.socket) -> bytes | None:
    """Server side of the challenge (this channel's and ``tcpchan``'s): send a just-accepted
    connection a fresh nonce, leaving it blocking; ``None`` (and closed) if that fails."""
    nonce = os.urandom(NONCE_BYTES)
    try:
        sock.setblocking(True)
        sock.settimeout(1.0)
        sock.sendall(nonce)
        sock.settimeout(None)
    except OSError:
        sock.close()
        return None
    return nonce


def answer_challenge(sock: socket.socket, key: bytes) -> bytes:
    """Client side of the challenge on a connected socket: read the server's nonce, prove the
    secret, check the server's proof; returns the nonce (``KVError`` if the server lacks the secret)."""
    nonce = _recv_exact(sock, NONCE_BYTES)
    sock.sendall(_mac(key, b"client", nonce))
    if not hmac.compare_digest(_recv_exact(sock, PROOF_BYTES), _mac(key, b"server", nonce)):
        raise KVError("the server does not hold the job secret")
    return nonce


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise KVError("connection closed during the handshake")
        data += chunk
    return data
