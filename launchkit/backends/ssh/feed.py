"""A host's remote output into the local pipes the supervisor reads: one thread for every stream
of the host (it was a thread per stream: 2 per remote process, 2048 threads at 1024 processes).

The channel's reader only queues (``put``, ``close``); this thread alone writes and closes the
pipes, so nothing is written to a descriptor after it was closed. Its writes never block: what a
full pipe does not take waits for that pipe alone (the watchdog's window, ``agent.WINDOW``, bounds
it), so one process whose output is not being read does not hold back the others of its host.
Each chunk is acknowledged once it is all in its pipe, which opens the window again: every
chunk written in one round of the thread in one ``acks`` message (the processes of a host that
start together say their first lines together), sent before the round closes any pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import threading
from collections import deque
from collections.abc import Callable


class Pipe:
    """The write end of one stream's local pipe and what waits to be written to it."""

    def __init__(self, fd: int, ident: int, stream: str) -> None:
        self.fd = fd
        self.ident = ident
        self.stream = stream
        #: chunks not yet written (the view of what is left, the bytes to acknowledge), then None
        #: once the stream has ended
        self.pending: deque[tuple[memoryview, int] | None] = deque()
        self.broken = False  # nobody reads it any more: chunks are dropped, still acknowledged
        fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)  # (a new pipe's end: no other flag to keep)


class Feeder:
    def __init__(self, ack: Callable[[list[tuple[int, str, int]]], None], name: str = "feed") -> None:
        self._ack = ack
        self._name = name
        self._lock = threading.Lock()
        self._inbox: deque[tuple[Pipe, bytes | None, bool]] = deque()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def put(self, pipe: Pipe, data: bytes, acked: bool) -> None:
        """Queue ``data`` for ``pipe`` (``acked``: acknowledge it to the watchdog once written)."""
        self._queue(pipe, data, acked)

    def close(self, pipe: Pipe) -> None:
        """``pipe``'s stream ended: its write end is closed once what is queued before is written."""
        self._queue(pipe, None, False)

    def _queue(self, pipe: Pipe, data: bytes | None, acked: bool) -> None:
        with self._lock:
            self._inbox.append((pipe, data, acked))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
        with contextlib.suppress(BlockingIOError):  # (full: a wake-up is pending anyway)
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        waiting: dict[int, Pipe] = {}  # pipes with something pending, by id
        while True:
            for ready, _ in sel.select():
                if ready.fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
            with self._lock:
                items, self._inbox = self._inbox, deque()
            for pipe, data, acked in items:
                if data is None:
                    pipe.pending.append(None)
                elif data:
                    pipe.pending.append((memoryview(data), len(data) if acked else 0))
                waiting[id(pipe)] = pipe
            acks: list[tuple[int, str, int]] = []
            ended: list[Pipe] = []
            for key, pipe in list(waiting.items()):
                registered = pipe.fd in sel.get_map()
                if not self._flush(pipe, acks):
                    if not registered:
                        sel.register(pipe.fd, selectors.EVENT_WRITE)
                    continue
                del waiting[key]  # all written: nothing to wait for
                if registered:
                    sel.unregister(pipe.fd)
                if pipe.pending and pipe.pending[0] is None:  # the stream ended: close it
                    pipe.pending.clear()
                    ended.append(pipe)
            if acks:  # every stream's of this round in one message
                self._ack(acks)
            for pipe in ended:  # after: a reader that sees a stream's end finds it all acknowledged
                with contextlib.suppress(OSError):
                    os.close(pipe.fd)

    def _flush(self, pipe: Pipe, acks: list[tuple[int, str, int]]) -> bool:
        """Write what ``pipe`` can take now, adding what is to be acknowledged to ``acks``; True
        when no chunk of it waits any more (the end of its stream may: the caller closes it)."""
        while pipe.pending:
            head = pipe.pending[0]
            if head is None:
                return True
            view, n = head
            while view and not pipe.broken:
                try:
                    view = view[os.write(pipe.fd, view) :]
                except BlockingIOError:
                    pipe.pending[0] = (view, n)
                    return False
                except OSError:  # nobody reads this stream any more: drop, keep acknowledging
                    pipe.broken = True
            pipe.pending.popleft()
            if n:
                acks.append((pipe.ident, pipe.stream, n))
        return True
