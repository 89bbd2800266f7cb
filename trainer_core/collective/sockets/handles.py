"""The handles and helpers of ``netlinks.NetLinks``: a posted receive (``Recv``), a completed send
(``DONE``), and the eventfd that wakes the receiving thread (``Wake``).

A ``Recv``'s ``wait`` checks the job's health every 0.1 s (the scheduler's word on a failure is
raised first: a dead or stopped peer ends it within the heartbeat timeout). A live peer is waited
for: after the links' ``stall.check_s`` the wait logs a stall warning naming the peer and the
operation, and again every ``check_s``; it gives up with ``PeerTimeout`` naming the peer only
after ``stall.shutdown_s`` (opt-in), or after ``bound_s`` where the links cannot tell a live peer
(no heartbeats), or after the ``timeout`` a caller gives ``wait``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from trainer_core.config import StallPolicy
from trainer_core.transport.channel import Received, Source

from ..primitives import stall
from ..primitives.links import PeerTimeout


class Owner(Protocol):
    """What a ``Recv`` asks of its links (``netlinks.NetLinks``)."""

    stall: StallPolicy
    bound_s: float | None  # a wait's fixed limit (None: the peers' liveness bounds it)

    @property
    def rank(self) -> int: ...

    def raise_failure(self) -> None: ...

    def failed(self, error: BaseException) -> BaseException: ...

    def warn(self, message: str) -> None: ...

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
        if self.event.is_set():
            return self._end()
        start = time.monotonic()
        clock: stall.Clock | None = None  # (made once the wait is not short)
        while not self.event.wait(SLICE_S):
            links.raise_failure()  # the job failed (a dead or stopped worker, an abort): its word
            if clock is None:
                policy = links.stall if timeout is None else StallPolicy(0.0)
                clock = stall.Clock(policy, start, links.bound_s if timeout is None else timeout)
            due = clock.tick(time.monotonic())
            if due is stall.Due.NOTHING:
                continue
            me, late, op = (
                f"rank {links.rank}",
                f"rank {self.peer} ({links.where(self.peer)})",
                stall.current(),
            )
            waited = clock.waited(time.monotonic())
            if due is stall.Due.WARN:
                why = f"has not sent its part (tag {self.tag:#x})"
                links.warn(stall.warning(me, waited, op, late, why, alive=clock.bound_s is None))
            elif links.cancel(self):
                text = stall.gave_up(late, f"sent nothing to {me}", waited, op, clock.policy, clock.bound_s)
                raise links.failed(PeerTimeout(f"{text} (tag {self.tag:#x})", self.peer))
            else:
                self.event.wait()  # matched as the wait ran out: the bytes are arriving
        self._end()

    def _end(self) -> None:
        if self.error is not None:
            self.links.raise_failure()
            raise self.links.failed(self.error)
