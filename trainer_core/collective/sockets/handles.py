"""The handles and helpers of ``netlinks.NetLinks``: a posted receive (``Recv``), a completed send
(``DONE``), and the eventfd that wakes the receiving thread (``Wake``).

A ``Recv``'s ``wait`` checks the job's health every 0.1 s (the scheduler's word on a failure is
raised first), and gives up after the links' timeout with ``PeerTimeout`` naming the peer.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from trainer_core.transport.channel import Received, Source

from ..primitives.links import PeerTimeout


class Owner(Protocol):
    """What a ``Recv`` asks of its links (``netlinks.NetLinks``)."""

    timeout: float

    @property
    def rank(self) -> int: ...

    def raise_failure(self) -> None: ...

    def cancel(self, op: Recv) -> bool: ...

    def where(self, peer: int) -> str: ...

    def mismatch(self, op: Recv, got: int) -> Exception: ...


SLICE_S = 0.1  # a wait checks the job's health this often


def bytes_of(buffer: np.ndarray, writable: bool) -> memoryview:
    if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous:
        raise TypeError("a collective buffer must be a C-contiguous numpy array")
    if writable and not buffer.flags.writeable:
        raise TypeError("a receive buffer must be writable")
    return buffer.reshape(-1).view(np.uint8).data


class Wake(Source):
    """An eventfd in the receiving thread's poller: rung to make it look at new channels or stop."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def pollable(self) -> int:
        return self.fd

    def ring(self) -> None:
        os.eventfd_write(self.fd, 1)

    def receive(self, handle: Callable[[Received], None]) -> bool:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        return True

    def close(self, flush_s: float = 0.0) -> None:
        os.close(self.fd)


class Done:
    """The handle of a send: complete once posted (the bytes were copied)."""

    def wait(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


DONE = Done()


class Recv:
    """A posted receive: a ``Handle``."""

    __slots__ = ("error", "event", "links", "peer", "tag", "view")

    def __init__(self, links: Owner, peer: int, tag: int, view: memoryview) -> None:
        self.links, self.peer, self.tag, self.view = links, peer, tag, view
        self.event = threading.Event()
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.event.set()

    def fill(self, data: memoryview | bytes) -> None:
        """Complete with ``data`` (an error naming the sender if its length is not the expected one)."""
        if len(data) != len(self.view):
            self.finish(self.links.mismatch(self, len(data)))
            return
        self.view[:] = data
        self.finish()

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout: float | None = None) -> None:
        links = self.links
        limit = links.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self.event.wait(SLICE_S):
            links.raise_failure()  # the job failed (a stopped worker, an abort): its word
            if time.monotonic() >= deadline:
                if links.cancel(self):
                    raise PeerTimeout(
                        f"collective: rank {self.peer} ({links.where(self.peer)}) sent nothing to rank "
                        f"{links.rank} within {limit:g} s (tag {self.tag:#x}); it is stalled or gone",
                        self.peer,
                    )
                self.event.wait()  # matched as the wait ran out: the bytes are arriving
        if self.error is not None:
            links.raise_failure()
            raise self.error
