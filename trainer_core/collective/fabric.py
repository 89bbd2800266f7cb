"""An in-process ``Links`` implementation: N endpoints linked through memory, for tests.

``Fabric(n)`` makes the mailboxes; ``fabric.endpoint(r)`` is rank ``r``'s ``Links`` (one thread per
rank drives it). A send and a receive are matched by (source, destination, tag) in posting order;
whichever is posted second copies the bytes, so nothing needs a progress thread.

``eager=True`` (the default) copies a send's bytes when it is posted and completes it at once (a
buffered channel). ``eager=False`` keeps a reference and completes the send only when the matching
receive took the bytes (a synchronous, rendezvous channel): an algorithm that waits on a send
before posting the receive its peer is waiting on deadlocks there, and the wait fails with
``PeerTimeout`` naming the peer instead of hanging.

Each endpoint counts the bytes and messages it sent (``sent_bytes``, ``sent_messages``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .primitives.links import DEFAULT_TIMEOUT, LinkError, PeerTimeout

T = TypeVar("T")


def _bytes_of(buffer: np.ndarray, writable: bool) -> memoryview:
    if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous:
        raise TypeError("a collective buffer must be a C-contiguous numpy array")
    if writable and not buffer.flags.writeable:
        raise TypeError("a receive buffer must be writable")
    return buffer.reshape(-1).view(np.uint8).data


class _Op:
    """One posted send or receive: a ``Handle``."""

    def __init__(self, fabric: Fabric, key: tuple[int, int, int], kind: str, data: memoryview) -> None:
        self.fabric, self.key, self.kind, self.data = fabric, key, kind, data
        self._event = threading.Event()
        self._error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> None:
        limit = self.fabric.timeout if timeout is None else timeout
        if not self._event.wait(limit) and not self.fabric.cancel(self):
            self._event.wait()  # matched as the wait ran out: the copy is finishing
        if not self._event.is_set():
            src, dst, tag = self.key
            me, peer = (src, dst) if self.kind == "send" else (dst, src)
            what = "did not take a message from" if self.kind == "send" else "sent nothing to"
            raise PeerTimeout(
                f"collective: rank {peer} {what} rank {me} within {limit:g} s (tag {tag:#x}); "
                f"rank {peer} is stalled or gone",
                peer,
            )
        if self._error is not None:
            raise self._error


@dataclass
class _Box:
    sends: deque[_Op] = field(default_factory=deque)
    recvs: deque[_Op] = field(default_factory=deque)


class Fabric:
    """The mailboxes of ``size`` linked endpoints."""

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT, eager: bool = True) -> None:
        if size < 1:
            raise ValueError(f"a fabric needs at least one endpoint, not {size}")
        self.size, self.timeout, self.eager = size, timeout, eager
        self._lock = threading.Lock()
        self._boxes: dict[tuple[int, int, int], _Box] = {}
        self.endpoints = [Endpoint(self, r) for r in range(size)]

    def endpoint(self, rank: int) -> Endpoint:
        return self.endpoints[rank]

    def post(self, op: _Op) -> _Op:
        with self._lock:
            box = self._boxes.setdefault(op.key, _Box())
            mine, other = (box.sends, box.recvs) if op.kind == "send" else (box.recvs, box.sends)
            if not other:
                mine.append(op)
                return op
            peer = other.popleft()
            if not box.sends and not box.recvs:
                del self._boxes[op.key]
        send, recv = (op, peer) if op.kind == "send" else (peer, op)
        _deliver(send, recv)
        return op

    def cancel(self, op: _Op) -> bool:
        """Withdraw a pending op; False when it was matched meanwhile."""
        with self._lock:
            box = self._boxes.get(op.key)
            queue = None if box is None else box.sends if op.kind == "send" else box.recvs
            if queue is None or op not in queue:
                return False
            queue.remove(op)
            return True


def _deliver(send: _Op, recv: _Op) -> None:
    src, dst, tag = send.key
    if len(send.data) != len(recv.data):
        err = LinkError(
            f"collective: rank {src} sent {len(send.data)} bytes to rank {dst} (tag {tag:#x}), "
            f"which expected {len(recv.data)}; the ranks disagree on the operation",
            src,
        )
        send.finish(LinkError(str(err), dst))
        recv.finish(err)
        return
    recv.data[:] = send.data
    send.finish()
    recv.finish()


class _Done:
    """The handle of a send that completed when it was posted (an eager fabric)."""

    def wait(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


class Endpoint:
    """Rank ``rank``'s ``Links`` on a ``Fabric``."""

    def __init__(self, fabric: Fabric, rank: int) -> None:
        self.fabric = fabric
        self._rank = rank
        self.sent_bytes = 0
        self.sent_messages = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.fabric.size

    def _check(self, peer: int) -> None:
        if not 0 <= peer < self.fabric.size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no link to rank {peer} (group of {self.fabric.size})")

    def send(self, peer: int, tag: int, buffer: np.ndarray) -> _Op | _Done:
        self._check(peer)
        data = _bytes_of(buffer, writable=False)
        self.sent_bytes += len(data)
        self.sent_messages += 1
        if self.fabric.eager:
            copy = memoryview(bytearray(data))
            self.fabric.post(_Op(self.fabric, (self._rank, peer, tag), "send", copy))
            return _Done()
        return self.fabric.post(_Op(self.fabric, (self._rank, peer, tag), "send", data))

    def recv(self, peer: int, tag: int, out: np.ndarray) -> _Op:
        self._check(peer)
        return self.fabric.post(_Op(self.fabric, (peer, self._rank, tag), "recv", _bytes_of(out, True)))


def run_ranks(size: int, fn: Callable[[int], T], timeout: float = 60.0) -> list[T]:
    """Run ``fn(rank)`` on ``size`` threads; the results by rank, or the first rank's error raised
    (test helper). A thread still running after ``timeout`` seconds is an error."""
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(r: int) -> None:
        try:
            results[r] = fn(r)
        except BaseException as exc:
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"ranks {stuck} did not finish within {timeout:g} s")
    for err in errors:
        if err is not None:
            raise err
    return results
