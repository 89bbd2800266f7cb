"""Runs a group's operations in order on one background thread; each submission returns a ``Work``.

Every rank must submit the same operations in the same order (as with Horovod and
torch.distributed); the executor numbers them, and the number is the operation's tag namespace.
Operations run one at a time, in submission order, so the caller's thread is free to compute while
they run (``Work.wait()`` later); ``call`` runs a synchronous operation on the caller's own thread
when nothing is queued (the same numbering and order, without the hand-over). After an operation failed, the group is broken (its peers may be
anywhere in the sequence): every later operation fails at once with the same error. The thread
that runs an operation is marked with it (``primitives.stall.running``): its waits name it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from trainer_core.errors import KVError

from .primitives import stall


class CollectiveClosed(KVError):
    """An operation was submitted to, or was pending in, a closed group."""


class Work:
    """The handle of one submitted operation."""

    def __init__(self, name: str, seq: int) -> None:
        self.name, self.seq = name, seq
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        #: called when a caller starts waiting for the unfinished operation (``negotiator``: a
        #: fusion cycle ends early then)
        self.on_wait: Callable[[], None] | None = None
        self.waiting = False  # a caller waits (or waited) for it

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._event.set()

    def done(self) -> bool:
        """Whether the operation finished (successfully or not)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """The operation's result, once it finished; its error raised if it failed. ``timeout``:
        seconds to wait at most (``TimeoutError`` then; the operation goes on)."""
        if not self._event.is_set():
            self.waiting = True
            if self.on_wait is not None:
                self.on_wait()
        if not self._event.wait(timeout):
            raise TimeoutError(f"collective {self.name} (op {self.seq}) still running after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done() else "pending"
        return f"<Work {self.name} op {self.seq} {state}>"


_STOP = object()


class Executor:
    """One background thread that runs submitted operations in order."""

    def __init__(self, name: str = "collective") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = threading.Lock()  # held while an operation runs (on either thread)
        self._pending = 0  # submitted, not finished
        self._seq = 0
        self._closed = False
        self._broken: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, fn: Callable[[int], Any]) -> Work:
        """Queue ``fn(seq)``; returns its ``Work`` at once."""
        with self._lock:
            if self._closed:
                raise CollectiveClosed(f"collective {name}: the group is closed")
            work = Work(name, self._seq)
            self._seq += 1
            self._pending += 1
            self._queue.put((work, fn))
        return work

    def call(self, name: str, fn: Callable[[int], Any]) -> Any:
        """Run ``fn(seq)`` on the calling thread when nothing is queued (saving the hand-over to the
        background thread), else queue it and wait; its result, or its error raised."""
        with self._lock:
            if self._closed:
                raise CollectiveClosed(f"collective {name}: the group is closed")
            inline = self._pending == 0 and self._broken is None and self._running.acquire(blocking=False)
            if inline:
                seq = self._seq
                self._seq += 1
        if not inline:
            return self.submit(name, fn).wait()
        try:
            with stall.running(name, seq):
                return fn(seq)
        except BaseException as exc:
            self._broken = exc
            raise
        finally:
            self._running.release()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            work, fn = item
            if self._broken is not None:
                work._finish(error=self._broken)
                with self._lock:
                    self._pending -= 1
                continue
            error: BaseException | None = None
            result = None
            try:
                with self._running, stall.running(work.name, work.seq):
                    result = fn(work.seq)
            except BaseException as exc:
                error = self._broken = exc
            with self._lock:  # before the caller hears of it, so that its next ``call`` runs inline
                self._pending -= 1
            work._finish(result, error)

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the thread (waits ``timeout`` seconds at most)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
