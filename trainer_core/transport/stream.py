"""The framing under the TCP data channel: tagged messages on a blocking stream socket, read in place.

A message is ``[u32 header length][u32 frame count][u64 length of each frame][header][tag][frames]``
(little-endian, docs/wire.md). The 16-byte tag is ``HMAC-SHA256(session key, u64 message counter
|| everything before it)`` truncated, one session key per direction derived from the handshake's
nonce, so a message altered, injected, replayed, reordered or taken from another connection fails
its tag and closes the stream. A length out of bounds closes it too, before anything is allocated.

Frames move straight between the caller's arrays and the kernel: ``write`` sends from the
caller's buffers (``sendmsg``), ``read_message`` reads each frame into the buffer its ``place``
callback chooses (``recv_into``), else into a fresh buffer or, where ``reuse``, into one buffer
kept per stream. Every wait is a 0.1 s slice (``SO_RCVTIMEO``/``SO_SNDTIMEO``) followed by an
``alive`` check supplied by the caller, which raises to give up: before a message that leaves the
stream in step; inside one it closes the stream (nothing after it could be framed).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainer_core.transport import wire
from trainer_core.transport.auth import channel_proof
from trainer_core.transport.channel import ChannelClosed, Payload

_PREFIX = struct.Struct("<II")
_U64 = struct.Struct("<Q")
_TAG = 16  # bytes of HMAC-SHA256 that tag each message
MAX_FRAMES = 1 << 16
MAX_FRAME_BYTES = wire.MAX_FRAME_BYTES
SLICE_MS = 100
_ALIGN = 64

#: Given a message's header bytes and frame lengths: (what ``read_message`` returns with the
#: frames, the writable buffer each frame goes into or ``None`` for a fresh one).
RawPlace = Callable[[bytes, list[int]], tuple[Any, Sequence[memoryview | None]]]


def _noop() -> None:
    return None


class FramedStream:
    """One connected stream socket carrying tagged messages."""

    def __init__(self, sock: socket.socket, reuse: bool) -> None:
        # Blocking calls that the kernel cuts into 0.1 s slices: a whole array moves in one or a few
        # system calls, and every slice ends in an ``alive`` check.
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        slice_tv = struct.pack("ll", 0, SLICE_MS * 1000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, slice_tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, slice_tv)
        self.sock = sock
        self.closed = False
        #: seconds a message that has begun may go without a byte before the stream is closed (0: no
        #: bound). A server sets it: it reads each message whole before serving anything else, so a
        #: peer stopping half-way would otherwise stall it until the job ends.
        self.stall_s = 0.0
        self.interrupted = ""  # why a message was abandoned half-way (the stream is closed then)
        self._rpoll = select.poll()
        self._rpoll.register(sock.fileno(), select.POLLIN)
        # Frames without a place share one buffer, reused by the next message where ``reuse`` (a
        # server handles each request before reading the next); else fresh buffers (a client's
        # replies may wait in a queue while later ones are read).
        self.reuse = reuse
        self._scratch = np.empty(0, np.uint8)
        # per-connection MACs, one per direction, keyed once (each tag copies its keyed state)
        self._tag_out = self._tag_in = _keyed(b"")
        self._count_out = self._count_in = 0

    def start_session(self, key: bytes, nonce: bytes, client: bool) -> None:
        """Keys that tag every message of this stream, derived from the handshake's nonce."""
        to_server = channel_proof(key, b"session to server", nonce)
        to_client = channel_proof(key, b"session to client", nonce)
        out_key, in_key = (to_server, to_client) if client else (to_client, to_server)
        self._tag_out = _keyed(out_key)
        self._tag_in = _keyed(in_key)

    def _tag(self, mac: Any, count: int, head: bytes) -> bytes:
        h = mac.copy()
        h.update(_U64.pack(count) + head)
        return h.digest()[:_TAG]

    # -- receiving -----------------------------------------------------------------------------

    def readable(self) -> bool:
        """Whether bytes (or the peer's close) are waiting, without blocking."""
        return bool(self._rpoll.poll(0))

    def read_message(
        self, place: RawPlace, alive: Callable[[], None] = _noop, ready: bool = False
    ) -> tuple[Any, list[Payload]]:
        """Read one whole message (waiting in slices, calling ``alive`` between them; ``ready``: the
        caller saw the stream readable, so no wait before it). Frames go where ``place`` says when
        the buffer it gives has the frame's exact length, else into a fresh or the reusable buffer
        (valid until the next call). ``ChannelClosed`` when the peer left or broke the framing (the
        stream is closed)."""
        if self.closed:
            raise ChannelClosed(self.interrupted or "the connection is closed")
        if not ready:
            while not self._rpoll.poll(SLICE_MS):  # giving up here leaves the stream in step
                alive()
        try:
            head = self._read(_PREFIX.size, alive)
            hlen, count = _PREFIX.unpack(head)
            if hlen > wire.MAX_HEADER_BYTES or count > MAX_FRAMES:
                raise ChannelClosed(
                    "a message declares a header or frame count out of bounds", violation=True
                )
            signed = _U64.size * count + hlen  # the frame lengths and the header, then the tag
            rest = self._read(signed + _TAG, alive)
            lens = list(struct.unpack_from(f"<{count}Q", rest)) if count else []
            if any(n > MAX_FRAME_BYTES for n in lens):
                raise ChannelClosed("a message declares a frame out of bounds", violation=True)
            if not hmac.compare_digest(
                rest[signed:], self._tag(self._tag_in, self._count_in, head + rest[:signed])
            ):
                raise ChannelClosed(
                    "a message with a wrong tag (altered, replayed or out of order)", violation=True
                )
            self._count_in += 1
            state, wanted = place(rest[_U64.size * count : signed], lens)
            return state, self._read_frames(lens, wanted, alive)
        except BaseException as exc:  # the rest of this message is unread: the stream is unusable
            self._abandon(exc)
            raise

    def _read_frames(
        self, lens: list[int], wanted: Sequence[memoryview | None], alive: Callable[[], None]
    ) -> list[Payload]:
        try:
            spare = self._spare(lens, wanted)
        except MemoryError:
            raise ChannelClosed(
                f"a message declares {sum(lens)} bytes, more than fit in memory", violation=True
            ) from None
        out: list[Payload] = []
        for i, n in enumerate(lens):
            dest = wanted[i] if i < len(wanted) else None
            placed = dest is not None and dest.nbytes == n
            buf = dest if placed and dest is not None else spare[i]
            self._read_into(buf, alive)
            out.append(Payload(buf, placed))
        return out

    def _spare(self, lens: list[int], wanted: Sequence[memoryview | None]) -> list[memoryview]:
        """Views of a buffer for the frames ``place`` did not give a home."""
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
        last = time.monotonic() if self.stall_s else 0.0  # when a byte last came
        while got < n:
            try:
                r = self.sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except (BlockingIOError, InterruptedError):  # a slice passed with nothing
                if self.stall_s and time.monotonic() - last > self.stall_s:
                    raise ChannelClosed(
                        f"the peer sent no byte of a started message for {self.stall_s:g} s", violation=True
                    ) from None
                alive()
                continue
            except OSError as exc:
                raise ChannelClosed(f"connection lost: {exc}") from None
            if r == 0:
                raise ChannelClosed("the peer closed the connection")
            got += r
            if got < n:  # a slice passed with part of it
                if self.stall_s:
                    last = time.monotonic()
                alive()

    # -- sending -------------------------------------------------------------------------------

    def write(self, header: bytes, frames: Sequence[Any] = (), alive: Callable[[], None] = _noop) -> None:
        """Send one message from the calling thread; returns when every byte is in the kernel."""
        self.send_parts(self.frame(header, frames), alive)

    def frame(self, header: bytes, frames: Sequence[Any] = ()) -> list[memoryview]:
        """One message as the parts to send: its tagged head, then its frames (not copied). Tags
        count messages, so each framed message must be sent, in the order framed."""
        if self.closed:
            raise ChannelClosed(self.interrupted or "the connection is closed")
        views = [_bytes_view(f) for f in frames]
        head = _PREFIX.pack(len(header), len(views)) + b"".join(_U64.pack(v.nbytes) for v in views) + header
        tag = self._tag(self._tag_out, self._count_out, head)
        self._count_out += 1
        return [memoryview(head + tag), *(v for v in views if v.nbytes)]

    def send_parts(self, parts: list[memoryview], alive: Callable[[], None] = _noop) -> None:
        """Send what ``frame`` (or ``send_now``) left, waiting in slices; returns when all is in the kernel."""
        try:
            self._send_all(parts, alive)
        except BaseException as exc:  # part of the message may be out: the stream is unusable
            self._abandon(exc)
            raise

    def send_now(self, parts: list[memoryview]) -> list[memoryview]:
        """Send as much of ``parts`` as the kernel takes without waiting; returns the rest (empty: all
        sent), which ``send_parts`` sends later."""
        try:
            return self._push(list(parts), socket.MSG_DONTWAIT)
        except BaseException as exc:  # part of the message may be out: the stream is unusable
            self._abandon(exc)
            raise

    def _send_all(self, parts: Sequence[Any], alive: Callable[[], None]) -> None:
        pending = [memoryview(p).cast("B") for p in parts if len(p)]
        while pending:
            try:
                pending = self._push(pending, 0)
            except (BlockingIOError, InterruptedError):  # a slice passed with nothing sent
                alive()

    def _push(self, pending: list[memoryview], flags: int) -> list[memoryview]:
        """Send from ``pending`` (consumed in place); returns what is left. Blocking (``flags`` 0): one
        ``sendmsg``, which may come back short when a slice passed (``BlockingIOError``: nothing
        sent). ``MSG_DONTWAIT``: until all is sent or the kernel takes no more now."""
        while pending:
            try:
                n = self.sock.sendmsg(pending[:64], (), flags)
            except (BlockingIOError, InterruptedError):
                if flags:
                    return pending
                raise
            except OSError as exc:
                raise ChannelClosed(f"connection lost: {exc}") from None
            while n:
                if n >= pending[0].nbytes:
                    n -= pending[0].nbytes
                    pending.pop(0)
                else:
                    pending[0] = pending[0][n:]
                    n = 0
            if not flags:
                break
        return pending

    # -- end -----------------------------------------------------------------------------------

    def _abandon(self, exc: BaseException) -> None:
        """A message was cut off half-way by ``exc``: nothing after it can be framed, so close. When
        this side cut it (``alive`` raised, an interrupt), ``interrupted`` says so."""
        if not self.closed:
            if not isinstance(exc, ChannelClosed | OSError):
                self.interrupted = f"the data channel was closed after a message was cut off ({exc!r})"
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()


def _keyed(key: bytes) -> Any:
    """A keyed HMAC-SHA256 state to copy per message: OpenSSL's own object where ``hmac`` wraps one
    (its ``copy``, ``update`` and ``digest`` are then C calls, not Python methods around them)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    return getattr(mac, "_hmac", None) or mac


def _bytes_view(obj: Any) -> memoryview:
    """A flat byte view of an array or buffer, without copying (a non-contiguous array is copied)."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            obj = np.ascontiguousarray(obj)
        return obj.reshape(-1).view(np.uint8).data
    view = memoryview(obj)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
