"""What a stream channel could not hand to the kernel at once: sent in order from one thread.

Either side of a channel may ``post`` (docs/wire.md, "Channels"): what the kernel takes now goes
now, from the caller's thread, and the rest, with every message posted after it, goes from the
channel's sender thread, started on first need. So a node never waits for its peer to read while
it posts, and a ring where every node sends to one neighbour while it receives from the other
cannot deadlock. A channel's sends come from one thread at a time (its owner's); a blocking
``send`` first lets the outbox empty (``drain``), so messages leave in the order they were given.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from trainer_core.errors import KVError
from trainer_core.transport.channel import ChannelClosed

#: sends one queued item, blocking; calls its argument between waits (it raises to give up)
Write = Callable[[Any, Callable[[], None]], None]


class Outbox:
    """The queue of one channel's posted messages and the thread that sends them."""

    def __init__(self, name: str, write: Write, closed: Callable[[], bool]) -> None:
        self.name = name
        self._write = write
        self._closed = closed
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self.pending = 0  # items put and not sent yet
        self.thread: threading.Thread | None = None

    def busy(self) -> bool:
        """Whether earlier messages still wait: a new one must go behind them."""
        return self.pending > 0

    def put(self, item: Any) -> None:
        """Queue ``item`` for the sender thread (started on first use)."""
        with self._lock:
            self.pending += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self.thread.start()
        self._items.put(item)

    def drain(self, alive: Callable[[], None]) -> None:
        """Until every queued item is sent, calling ``alive`` every 0.1 s (it raises to give up);
        ``ChannelClosed`` if the channel closes first."""
        with self._lock:
            while self.pending:
                if self._closed():
                    raise ChannelClosed("the connection closed with messages still queued")
                self._lock.wait(0.1)
                alive()

    def stop(self) -> None:
        """Let the thread send what is queued, then end."""
        if self.thread is not None:
            self._items.put(None)

    def _run(self) -> None:
        def alive() -> None:
            if self._closed():
                raise ChannelClosed("closed")

        while (item := self._items.get()) is not None:
            try:
                self._write(item, alive)
            except (KVError, OSError):  # (``ChannelClosed`` is one: the channel is closed)
                with self._lock:
                    self.pending = 0
                    self._lock.notify_all()
                return
            with self._lock:
                self.pending -= 1
                if not self.pending:
                    self._lock.notify_all()
