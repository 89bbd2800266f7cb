"""An in-process channel pair: the ``Channel`` interface without sockets, for tests of the roles.

``MemoryChannel.pair(caps)`` returns two connected ends. A message sent on one end is encoded
exactly as on a socket (``wire.encode``), its frames copied as the kernel would (the sender may
change its arrays once ``send`` returns), and queued on the other end, whose ``receive`` decodes it
and hands it on; where ``caps.direct``, a frame is copied straight into the buffer the receiver's
``place`` gives (``Payload.placed``). Descriptors sent with ``caps.shared_memory`` are duplicated, as
SCM_RIGHTS does. Each end has an ``eventfd`` that is readable while messages wait, so ``Poller``
and ``wait`` work as for sockets, from any thread. Closing an end makes the other end's
``receive`` return ``False`` once its queue is empty, and its ``send`` raise ``ChannelClosed``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainer_core.errors import KVError
from trainer_core.transport import wire
from trainer_core.transport.channel import Caps, Channel, ChannelClosed, Payload, Received, Trace

MEMORY_CAPS = Caps(frames=True, direct=True)


class MemoryChannel(Channel):
    """One end of an in-process pair."""

    def __init__(self, caps: Caps, trace: Trace) -> None:
        super().__init__(caps, trace)
        self.other: MemoryChannel | None = None
        self._inbox: collections.deque[tuple[bytes, list[bytearray], list[int]]] = collections.deque()
        self._fds: list[int] = []
        self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self.peer_closed = False

    @classmethod
    def pair(
        cls, caps: Caps = MEMORY_CAPS, log: logging.Logger | None = None, schema: wire.Schema = wire.OPAQUE
    ) -> tuple[MemoryChannel, MemoryChannel]:
        """Two connected ends with ``caps`` (both alike), logging to ``log``, decoding with ``schema``."""
        trace = Trace(log or logging.getLogger("trainer_core.memory"), schema=schema)
        a, b = cls(caps, trace), cls(caps, trace)
        a.other, b.other = b, a
        return a, b

    def pollable(self) -> int:
        return self._event

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        if frames and not self.caps.frames:
            raise KVError("this channel carries headers only")
        if fds and not self.caps.shared_memory:
            raise KVError("this channel carries no file descriptors")
        other = self.other
        if self.closed or other is None:
            raise ChannelClosed("the peer closed the channel")
        if self.trace.on:
            self.trace.sent(header, len(frames))
        copies = [bytearray(_bytes(f)) for f in frames]
        other._deliver(wire.encode(header), copies, [os.dup(fd) for fd in fds])

    def _deliver(self, raw: bytes, frames: list[bytearray], fds: list[int]) -> None:
        with self._lock:
            if self.closed:
                for fd in fds:
                    os.close(fd)
                raise ChannelClosed("the peer closed the channel")
            self._inbox.append((raw, frames, fds))
            os.eventfd_write(self._event, 1)

    def _peer_left(self) -> None:
        with self._lock:
            if not self.closed:
                self.peer_closed = True
                os.eventfd_write(self._event, 1)

    def receive(self, handle: Callable[[Received], None]) -> bool:
        with self._lock:
            if self.closed:
                return False
            with contextlib.suppress(BlockingIOError):  # before draining: a later message wakes us again
                os.eventfd_read(self._event)
        while True:
            with self._lock:
                if not self._inbox:
                    break
                raw, frames, fds = self._inbox.popleft()
            self._fds.extend(fds)
            header = self.trace.decode(raw, self.headers)
            if header is not None:
                handle(Received(header, self._place(header, frames), self))
            if self.closed:
                return False
        return not self.peer_closed

    def _place(self, header: wire.Header, frames: list[bytearray]) -> list[Any]:
        wanted = self.place(header, [len(f) for f in frames]) if self.place and self.caps.direct else []
        out: list[Any] = []
        for i, f in enumerate(frames):
            dest = wanted[i] if i < len(wanted) else None
            if dest is not None and dest.nbytes == len(f):
                memoryview(dest).cast("B")[:] = f
                out.append(Payload(dest, placed=True))
            else:
                out.append(Payload(memoryview(f)))
        return out

    def take_fds(self, n: int) -> list[int]:
        if n > len(self._fds):
            raise KVError("a message names file descriptors that did not arrive")
        taken, self._fds = self._fds[:n], self._fds[n:]
        return taken

    def close(self, flush_s: float = 0.0) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for _, _, fds in self._inbox:
                self._fds.extend(fds)
            self._inbox.clear()
            os.close(self._event)  # under the lock: no sender writes to a reused descriptor
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self.other is not None:
            self.other._peer_left()


def _bytes(obj: Any) -> memoryview:
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj).reshape(-1).view(np.uint8).data
    view = memoryview(obj)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
