"""The shared-memory segment of the workers of one host, and the counters that order their steps.

One anonymous file (``memfd``) per host and group, made once when the group is set up by the
host's lowest rank and handed to the others over their authenticated same-host channels
(``sockets.netlinks``), as every descriptor is; nothing is left in ``/dev/shm``. Its layout:

* a header page: one 32-bit step counter per local rank, each on a cache line of its own, written
  only by its rank and read by the others, and beside it the rank's 32-bit note (``note``);
* ``size`` slots of ``cap`` bytes each, one per local rank, after the header. ``cap`` grows (to
  the next power of two) when an operation needs more: every local rank makes the same operations
  in the same order, so all grow alike, between operations, and re-map their view of the slots.

A rank ``post``s a step by storing its counter and waking the futex on it; a rank waits for
another's counter by spinning briefly, then sleeping on the futex (``futex``), checking the job's
health (``health``, which raises the scheduler's word or a dead peer's error) every ``SLICE_S``.
A live rank is waited for: after ``stall.check_s`` (and every ``check_s`` again) the wait says
which local ranks have not posted the step, and the operation (``stall.warning``); it fails with
``PeerTimeout`` naming the rank that did not come only after ``stall.shutdown_s`` (opt-in) or
``timeout`` (the fixed limit where the peers' liveness is not known; None: none).
Counters only grow (modulo 2**32), so a wait for step ``s`` is also met by any later step.
Stores to the slots happen before the counter's store in program order, and x86 and the
interpreter's own locking keep that order for the reader, which loads the counter first.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from trainer_core.config import StallPolicy
from trainer_core.sharedmap import map_shared

from . import futex
from . import stall as stalls
from .links import DEFAULT_TIMEOUT, PeerTimeout

HEADER = 4096
LINE = 64  # bytes between two ranks' counters
MAX_LOCAL = HEADER // LINE
MIN_CAP = 1 << 16
SLICE_S = 0.1
SPIN = 50  # microseconds of reading the counter before sleeping on the futex
_MASK = 0xFFFFFFFF


class Segment:
    """One process's mapping of a host's segment (``fd`` stays open until ``close``)."""

    def __init__(self, fd: int, size: int) -> None:
        if not 1 <= size <= MAX_LOCAL:
            raise ValueError(f"a shared-memory segment serves 1..{MAX_LOCAL} local ranks, not {size}")
        self.fd, self.size, self.cap = fd, size, 0
        if os.fstat(fd).st_size < HEADER:
            os.ftruncate(fd, HEADER)
        self._head = mmap.mmap(fd, HEADER)
        self.counters = memoryview(self._head).cast("I")
        self._anchor = ctypes.c_char.from_buffer(self._head)
        self.base_address = ctypes.addressof(self._anchor)
        self._data: mmap.mmap | None = None
        self._bytes = np.zeros(0, np.uint8)

    @classmethod
    def create(cls, size: int) -> Segment:
        """A fresh segment for ``size`` local ranks (its counters at 0)."""
        return cls(os.memfd_create("launchkit-collective", os.MFD_CLOEXEC), size)

    def ensure(self, nbytes: int) -> None:
        """Slots of at least ``nbytes`` (growing the file, and this mapping, if needed)."""
        if nbytes <= self.cap:
            return
        cap = max(MIN_CAP, 1 << (nbytes - 1).bit_length())
        need = HEADER + self.size * cap
        if os.fstat(self.fd).st_size < need:
            os.ftruncate(self.fd, need)  # only ever grows; a peer may have grown it already
        old = self._data
        what = f"the host's collective slots ({self.size} local ranks x {cap} bytes)"
        self._data = map_shared(self.fd, self.size * cap, what, offset=HEADER)
        self._bytes = np.frombuffer(self._data, np.uint8)
        self.cap = cap
        if old is not None:
            with contextlib.suppress(BufferError):  # a view still held elsewhere keeps it mapped
                old.close()

    def slot(self, rank: int, dtype: np.dtype, n: int) -> np.ndarray:
        """The first ``n`` elements of ``dtype`` of ``rank``'s slot (after ``ensure``)."""
        start = rank * self.cap
        return self._bytes[start : start + n * dtype.itemsize].view(dtype)

    def close(self) -> None:
        self._bytes = np.zeros(0, np.uint8)
        self.counters.release()
        del self._anchor
        for m in (self._data, self._head):
            if m is not None:
                with contextlib.suppress(BufferError):
                    m.close()
        self._data = None
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _behind(value: int, target: int) -> bool:
    """Whether a counter at ``value`` has not reached ``target`` yet (modulo 2**32)."""
    return 0 < ((target - value) & _MASK) < 0x80000000


class Local:
    """One local rank's use of a host's segment: its steps, and the waits for the others'.

    ``members``: the group ranks of the host's ranks, in order (``rank`` indexes it); ``health``:
    raises the job's failure, if any (called while waiting); ``where(group_rank)``: how to name a
    rank in errors; ``timeout``: seconds a wait lasts at most (None: no limit, the job's liveness
    ends a wait for a dead rank through ``health``); ``stall``: the warnings of a long wait, and
    its opt-in end (``warn`` says them); ``spin``: microseconds of reading the counter before
    sleeping on the futex."""

    def __init__(
        self,
        segment: Segment,
        rank: int,
        members: Sequence[int],
        health: Callable[[], None] | None = None,
        where: Callable[[int], str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        spin: int | None = None,
        stall: StallPolicy | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        if len(members) != segment.size or not 0 <= rank < segment.size:
            raise ValueError(f"local rank {rank} of {len(members)} on a segment of {segment.size}")
        self.segment, self.rank, self.members = segment, rank, tuple(members)
        self.size = segment.size
        self.health = health or (lambda: None)
        self.where = where or (lambda r: f"rank {r}")
        self.timeout = timeout
        self.stall = stall or StallPolicy()
        self.warn = warn or (lambda message: None)
        cores = os.cpu_count() or 1
        # spinning helps only while every local rank has a core of its own (measured: docs/collectives.md)
        self.spin = spin if spin is not None else (SPIN if self.size <= cores else 0)
        self.ops = 0  # operations begun (every local rank counts alike)

    def note(self, value: int) -> None:
        """Set this rank's note: a uint32 beside its counter that the others read once they saw
        the step this rank posts next (what its slot holds: ``shmreduce``'s published result)."""
        self.segment.counters[self.rank * (LINE // 4) + 1] = value & _MASK

    def noted(self, peer: int) -> int:
        """Local rank ``peer``'s note (read after waiting for the step it posted with it)."""
        return int(self.segment.counters[peer * (LINE // 4) + 1])

    def post(self, step: int) -> None:
        seg = self.segment
        seg.counters[self.rank * (LINE // 4)] = step & _MASK
        futex.wake(seg.base_address + self.rank * LINE)

    def wait_for(self, peer: int, step: int, what: str) -> None:
        """Return once local rank ``peer`` posted ``step`` (or later)."""
        counters, at = self.segment.counters, peer * (LINE // 4)
        step &= _MASK
        if not _behind(counters[at], step):
            return
        if self.spin:
            until = time.perf_counter() + self.spin * 1e-6
            while True:
                for _ in range(32):
                    if ((step - counters[at]) & _MASK) - 1 >= 0x7FFFFFFF:  # (``_behind``, inlined)
                        return
                if time.perf_counter() > until:
                    break
        address = self.segment.base_address + peer * LINE
        start = time.monotonic()
        check = start + SLICE_S
        clock: stalls.Clock | None = None  # (made once the wait is not short)
        while True:
            value = counters[at]
            if not _behind(value, step):
                return
            futex.wait(address, value, SLICE_S)
            if not _behind(counters[at], step):
                return
            now = time.monotonic()
            if now >= check:
                self.health()
                check = now + SLICE_S
                clock = clock or stalls.Clock(self.stall, start, self.timeout)
                self._late(clock, now, peer, step, what)

    def _late(self, clock: stalls.Clock, now: float, peer: int, step: int, what: str) -> None:
        """A wait for local rank ``peer``'s ``step`` is long: warn, or give up (``stall.Clock``)."""
        due = clock.tick(now)
        if due is stalls.Due.NOTHING:
            return
        g, me, op = self.members[peer], f"rank {self.members[self.rank]}", stalls.current()
        if due is stalls.Due.WARN:
            behind = [
                self.members[p]
                for p in range(self.size)
                if p != self.rank and _behind(self.segment.counters[p * (LINE // 4)], step)
            ]
            late = ", ".join(f"rank {r} ({self.where(r)})" for r in behind or [g])
            why = f"did not {what} yet (shared-memory allreduce)"
            self.warn(stalls.warning(me, clock.waited(now), op, late, why, alive=clock.bound_s is None))
            return
        late = f"rank {g} ({self.where(g)})"
        text = stalls.gave_up(late, f"did not {what}", clock.waited(now), op, self.stall, clock.bound_s)
        raise PeerTimeout(f"{text} (shared-memory allreduce)", g)

    def posted_all(self, step: int) -> bool:
        """Whether every local rank posted ``step`` (or later); does not wait."""
        c = self.segment.counters
        return not any(_behind(c[p * (LINE // 4)], step) for p in range(self.size) if p != self.rank)

    def wait_all(self, step: int, what: str) -> None:
        for p in range(self.size):
            if p != self.rank:
                self.wait_for(p, step, what)

    def begin(self, x: np.ndarray, ops: int) -> tuple[int, list[np.ndarray]]:
        """Start an operation of ``ops`` counted operations on ``x``: once every local rank finished
        the previous one, the segment holds ``x``'s size; the operation's first step and each local
        rank's slot (a view of ``x``'s dtype and size)."""
        base = 3 * self.ops
        self.ops += ops
        self.wait_all(base, "finish the previous operation")
        self.segment.ensure(x.nbytes)
        return base, [self.segment.slot(r, x.dtype, x.size) for r in range(self.size)]

    def close(self) -> None:
        self.segment.close()
