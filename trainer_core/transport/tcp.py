"""The cross-host data channel: one authenticated TCP stream between a worker and a server.

ZeroMQ moves a message through an I/O thread on each side, allocates a buffer for every
received frame, and pyzmq's zero-copy sends add a garbage-collector hand-off per frame; the
worker then copies each received array into its destination. On a busy host that CPU is most
of a cross-host round trip above the kernel's own copies (docs/performance.md). This channel
moves arrays straight between the caller's arrays and the kernel: a worker sends its arrays
from the calling thread (so a push needs no private copy: it returns once the bytes are in
the kernel) and reads a reply's arrays directly into the ``pull`` outputs (``recv_into``); a
server reads a request's arrays into a per-connection buffer it reuses, and sends replies
from one sender thread per connection, so it never blocks on a slow reader and never stops
reading (which is what rules out a send/send deadlock between workers and servers).

Every wait is a 0.1 s slice followed by an ``alive`` check supplied by the caller (the
heartbeat state), so a dead or stopped peer never hangs a node.

Authentication is the same challenge as the same-host channel (``unixsock.py``): the server
sends a fresh 16-byte nonce, the client answers ``HMAC-SHA256(k, "client" + nonce)``, the
server answers ``HMAC-SHA256(k, "server" + nonce)``, ``k`` derived from the job secret (its own
label). The secret never crosses the wire; a peer without it is closed before any message is
read. Arrays are not encrypted: ``PS_ENCRYPT=1`` sends them over CURVE instead.

A message is ``[u32 header length][u32 frame count][u64 length of each frame][header][frames]``
(little-endian), see docs/wire.md; a length out of bounds closes the connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainer_core.errors import KVError
from trainer_core.transport import wire
from trainer_core.transport.auth import channel_key, channel_proof
from trainer_core.transport.unix import PROOF_BYTES, answer_challenge, offer_nonce

_PREFIX = struct.Struct("<II")
_U64 = struct.Struct("<Q")
_LABEL = b"launchkit-kv-tcp-v1"
_TAG = 16  # bytes of HMAC-SHA256 that tag each message
MAX_FRAMES = 1 << 16
MAX_FRAME_BYTES = wire.MAX_ELEMENTS * 8
HANDSHAKE_TIMEOUT_S = 10.0
SLICE_MS = 100
_ALIGN = 64

#: Given a message's header bytes and frame lengths: (what ``read_message`` returns with the
#: frames, the writable buffer each frame goes into or ``None`` for a fresh one).
Place = Callable[[bytes, list[int]], tuple[Any, Sequence[memoryview | None]]]


class ChannelClosed(KVError):
    """The connection closed; ``violation`` when the peer broke the protocol (then it was closed on it)."""

    def __init__(self, reason: str, violation: bool = False) -> None:
        super().__init__(reason)
        self.violation = violation


class Payload:
    """One received frame: ``buffer`` holds its bytes; ``placed`` when they were read into the
    buffer the ``Place`` callback chose (the caller's array), so there is nothing to copy."""

    __slots__ = ("buffer", "placed")

    def __init__(self, buffer: memoryview, placed: bool) -> None:
        self.buffer = buffer
        self.placed = placed


def _noop() -> None:
    return None


class TcpConn:
    """One connection (client side after ``connect``, server side after the handshake)."""

    def __init__(self, sock: socket.socket, key: bytes, nonce: bytes | None = None) -> None:
        # Blocking calls that the kernel cuts into 0.1 s slices (SO_RCVTIMEO/SO_SNDTIMEO): a whole
        # array moves in one or a few system calls, and every slice ends in an ``alive`` check.
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        slice_tv = struct.pack("ll", 0, SLICE_MS * 1000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, slice_tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, slice_tv)
        self.sock = sock
        self.key = key
        self.nonce = nonce  # server side: set until the client proved the secret
        self.ready = nonce is None
        self.closed = False
        self.born = time.monotonic()
        self._proof = b""
        self._rpoll = select.poll()
        self._rpoll.register(sock.fileno(), select.POLLIN)
        # Server side: frames without a place share one buffer, reused by the next message (a
        # server handles each request before reading the next). Client side: fresh buffers, as
        # replies may wait in a queue while later ones are read.
        self.reuse = nonce is not None
        self._scratch = np.empty(0, np.uint8)
        self._outbox: queue.SimpleQueue[tuple[bytes, Sequence[Any]] | None] | None = None
        self._sender: threading.Thread | None = None
        self.interrupted = ""  # why a message was abandoned half-way (the stream is closed then)
        self._tag_out = self._tag_in = b""  # per-connection MAC keys, one per direction
        self._count_out = self._count_in = 0
        self._released = False

    def _start_session(self, nonce: bytes, client: bool) -> None:
        """Keys that tag every message of this connection, derived from the handshake's nonce (so a
        message of another connection, or a replayed or reordered one, fails its tag)."""
        to_server = channel_proof(self.key, b"session to server", nonce)
        to_client = channel_proof(self.key, b"session to client", nonce)
        self._tag_out, self._tag_in = (to_server, to_client) if client else (to_client, to_server)

    def _tag(self, key: bytes, count: int, head: bytes) -> bytes:
        return hmac.new(key, _U64.pack(count) + head, hashlib.sha256).digest()[:_TAG]

    # -- setup ---------------------------------------------------------------------------------

    @classmethod
    def connect(cls, endpoint: str, secret: str) -> TcpConn:
        """Connect to a server's ``tcp://host:port`` and pass the handshake (``KVError`` if it fails)."""
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
        conn = cls(sock, key)
        conn._start_session(nonce, client=True)
        return conn

    def fileno(self) -> int:
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
            self.close()
            return None
        if not chunk:
            self.close()
            return None
        self._proof += chunk
        if len(self._proof) < PROOF_BYTES:
            return False
        if not hmac.compare_digest(self._proof, channel_proof(self.key, b"client", self.nonce)):
            self.close()
            return None
        server_proof = channel_proof(self.key, b"server", self.nonce)
        self._start_session(self.nonce, client=False)
        self.ready, self.nonce = True, None
        try:
            self._send_all([server_proof], _noop)
        except KVError:
            self.close()
            return None
        return True

    # -- receiving -----------------------------------------------------------------------------

    def readable(self) -> bool:
        """Whether bytes (or the peer's close) are waiting, without blocking."""
        return bool(self._rpoll.poll(0))

    def read_message(self, place: Place, alive: Callable[[], None] = _noop) -> tuple[Any, list[Payload]]:
        """Read one whole message (waiting in slices, calling ``alive`` between them, which raises to
        give up). Frames go where ``place`` says when the buffer it gives has the frame's exact length,
        else into a fresh buffer (client side) or this connection's reusable one (server side: valid
        until the next call).
        ``ChannelClosed`` when the peer left or broke the framing (the connection is closed)."""
        if self.closed:
            raise ChannelClosed(self.interrupted or "the connection is closed")
        while not self._rpoll.poll(SLICE_MS):  # giving up here leaves the stream in step
            alive()
        try:
            head = self._read(_PREFIX.size, alive)
            hlen, count = _PREFIX.unpack(head)
            if hlen > wire.MAX_HEADER_BYTES or count > MAX_FRAMES:
                raise ChannelClosed(
                    "a message declares a header or frame count out of bounds", violation=True
                )
            raw_lens = self._read(_U64.size * count, alive) if count else b""
            lens = [_U64.unpack_from(raw_lens, i * _U64.size)[0] for i in range(count)]
            if any(n > MAX_FRAME_BYTES for n in lens):
                raise ChannelClosed("a message declares a frame out of bounds", violation=True)
            header = self._read(hlen, alive)
            tag = self._read(_TAG, alive)
            if not hmac.compare_digest(
                tag, self._tag(self._tag_in, self._count_in, head + raw_lens + header)
            ):
                raise ChannelClosed(
                    "a message with a wrong tag (altered, replayed or out of order)", violation=True
                )
            self._count_in += 1
            state, wanted = place(header, lens)
            out: list[Payload] = []
            try:
                spare = self._spare(lens, wanted)
            except MemoryError:
                raise ChannelClosed(
                    f"a message declares {sum(lens)} bytes, more than fit in memory", violation=True
                ) from None
            for i, n in enumerate(lens):
                dest = wanted[i] if i < len(wanted) else None
                placed = dest is not None and dest.nbytes == n
                buf = dest if placed and dest is not None else spare[i]
                self._read_into(buf, alive)
                out.append(Payload(buf, placed))
            return state, out
        except BaseException as exc:  # the rest of this message is unread: the stream is unusable
            self._abandon(exc)
            raise

    def _spare(self, lens: list[int], wanted: Sequence[memoryview | None]) -> list[memoryview]:
        """Views of this connection's reusable buffer for the frames ``place`` did not give a home."""
        offsets, total = [], 0
        for i, n in enumerate(lens):
            dest = wanted[i] if i < len(wanted) else None
            offsets.append(total)
            if dest is None or dest.nbytes != n:
                total += -(-n // _ALIGN) * _ALIGN
        if not self.reuse:
            view = np.empty(total, np.uint8).data
        else:
            if self._scratch.nbytes < total:
                self._scratch = np.empty(total, np.uint8)
            view = self._scratch.data
        return [view[o : o + n] for o, n in zip(offsets, lens, strict=True)]

    def _read(self, n: int, alive: Callable[[], None]) -> bytes:
        buf = bytearray(n)
        self._read_into(memoryview(buf), alive)
        return bytes(buf)

    def _read_into(self, buf: memoryview, alive: Callable[[], None]) -> None:
        view = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
        got, n = 0, view.nbytes
        while got < n:
            try:
                r = self.sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except (BlockingIOError, InterruptedError):  # a slice passed with nothing
                alive()
                continue
            except OSError as exc:
                raise ChannelClosed(f"connection lost: {exc}") from None
            if r == 0:
                raise ChannelClosed("the peer closed the connection")
            got += r
            if got < n:  # a slice passed with part of it
                alive()

    # -- sending -------------------------------------------------------------------------------

    def send(self, header: bytes, frames: Sequence[Any] = (), alive: Callable[[], None] = _noop) -> None:
        """Send one message from the calling thread; returns when every byte is in the kernel."""
        if self.closed:
            raise ChannelClosed(self.interrupted or "the connection is closed")
        views = [_bytes_view(f) for f in frames]
        head = _PREFIX.pack(len(header), len(views)) + b"".join(_U64.pack(v.nbytes) for v in views) + header
        tag = self._tag(self._tag_out, self._count_out, head)
        self._count_out += 1
        try:
            self._send_all([head + tag, *views], alive)
        except BaseException as exc:  # part of the message may be out: the stream is unusable
            self._abandon(exc)
            raise

    def _send_all(self, parts: Sequence[Any], alive: Callable[[], None]) -> None:
        pending = [memoryview(p).cast("B") for p in parts if len(p)]
        while pending:
            try:
                n = self.sock.sendmsg(pending[:64])
            except (BlockingIOError, InterruptedError):  # a slice passed with nothing sent
                alive()
                continue
            except OSError as exc:
                raise ChannelClosed(f"connection lost: {exc}") from None
            while n:
                if n >= pending[0].nbytes:
                    n -= pending[0].nbytes
                    pending.pop(0)
                else:
                    pending[0] = pending[0][n:]
                    n = 0

    def post(self, header: bytes, frames: Sequence[Any] = ()) -> None:
        """Queue a message for this connection's sender thread (server side: never blocks)."""
        if self.closed:
            return
        if self._outbox is None:
            self._outbox = queue.SimpleQueue()
            self._sender = threading.Thread(target=self._send_loop, name="tcpchan-send", daemon=True)
            self._sender.start()
        self._outbox.put((header, frames))

    def _send_loop(self) -> None:
        assert self._outbox is not None

        def alive() -> None:
            if self.closed:
                raise ChannelClosed("closed")

        while (item := self._outbox.get()) is not None:
            try:
                self.send(item[0], item[1], alive)
            except KVError:
                return

    # -- end -----------------------------------------------------------------------------------

    def _abandon(self, exc: BaseException) -> None:
        """A message was cut off half-way by ``exc``: nothing after it can be framed, so close. When
        this side cut it (``alive`` raised, an interrupt), ``interrupted`` says so."""
        if not self.closed:
            if not isinstance(exc, ChannelClosed | OSError):
                self.interrupted = f"the data channel was closed after a message was cut off ({exc!r})"
            self.close()

    def stop_sending(self) -> None:
        """Let the sender thread finish what is queued, then end (see ``close``)."""
        if self._sender is not None and self._outbox is not None:
            self._outbox.put(None)

    def close(self, flush_s: float = 0.0) -> None:
        """Close; with ``flush_s``, first give the sender thread that long to send what is queued.
        The descriptor is released only once no other thread can still use it (it could be reused)."""
        self.stop_sending()
        sender = self._sender
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


class TcpListener:
    """A server's data listener on ``host`` (``*``: every interface), any free port."""

    def __init__(self, host: str, secret: str) -> None:
        self.key = channel_key(secret, _LABEL)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("" if host == "*" else host, 0))
        self.sock.listen(256)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[TcpConn]:
        """The connections waiting, each sent its nonce; call ``handshake`` on them when readable."""
        conns: list[TcpConn] = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:  # none waiting (or none can be taken now)
                return conns
            nonce = offer_nonce(sock)
            if nonce is not None:
                conns.append(TcpConn(sock, self.key, nonce))

    def close(self) -> None:
        self.sock.close()


def _bytes_view(obj: Any) -> memoryview:
    """A flat byte view of an array or buffer, without copying (a non-contiguous array is copied)."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            obj = np.ascontiguousarray(obj)
        return obj.reshape(-1).view(np.uint8).data
    view = memoryview(obj)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
