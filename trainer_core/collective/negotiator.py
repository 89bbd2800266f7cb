"""Runs a group's operations in an order every rank agrees on, each only once every rank submitted
it with the same descriptor (``agreement``); each submission returns a ``Work``.

Operations wait in a per-rank queue. One thread at a time (the group's background thread, or a
caller's own for a synchronous operation when nothing else is queued) drives the slots: slot
``k`` shows every rank the ``agreement.record`` of the head of each queue, and when all are equal
(the common case: every rank submits the same operations in the same order) that operation runs
as the group's ``k``-th (``k`` its tag namespace). Otherwise every rank hands the others its whole
queue and ``agreement.decide`` says what the slot does: run the operation of a name every rank
holds (threads may submit in different orders), fail one on every rank
(``CollectiveMismatch``: the group goes on), or wait for more submissions (then the slot is
tried again, polling).

The records travel through the host's shared-memory segment where every rank is on one host
(beside each rank's counter, in the header; an operation with ``fast`` shows its record in its
own first step, so an agreed allreduce costs no extra step), else through rank 0 over the links
(two small messages); the queues, on the slow path only, from every rank to every other. A failure
of the data path (a peer gone, a timeout) breaks the group: every later operation fails at once
with the same error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .agreement import (
    RECORD_BYTES,
    CollectiveMismatch,
    Descriptor,
    agreed,
    decide,
    decode,
    encode,
    record_nbytes,
)
from .executor import CollectiveClosed, Work
from .primitives import stall
from .primitives.hostsegment import LINE, Local
from .primitives.links import Ctx, Links, wait_all

#: ``fast(seq, record)``: runs the operation with ``record`` shown in its first step; returns every
#: rank's record and, where they agreed, the result (else ``NOT_RUN``)
Fast = Callable[[int, bytes], tuple[list[bytes], Any]]
NOT_RUN = object()
_POLL_S = (0.001, 0.1)  # a slot that found no common operation is tried again after this (doubling)
_WORDS = RECORD_BYTES // 4
_SLOW = 0, 1, 2  # segments of the control step: record, every rank's records, a queue's length/bytes


def control_bytes(rank: int, size: int) -> int:
    """The bytes ``rank`` sends over the links to agree on one operation whose records match (where
    the records do not travel through a host's segment): its record to rank 0, or rank 0's table
    of every record to each other rank."""
    if size < 2:
        return 0
    return (size - 1) * size * RECORD_BYTES if rank == 0 else RECORD_BYTES


@dataclass
class Op:
    """One submitted operation: its descriptor, its data path ``run(seq)``, and its ``Work``s (a
    name submitted twice while pending fails both)."""

    desc: Descriptor
    run: Callable[[int], Any]
    nbytes: int = 0
    fast: Fast | None = None
    works: list[Work] = field(default_factory=list)


class Exchange:
    """How the ranks of one group show each other their records and queues."""

    def __init__(self, links: Links, local: Local | None) -> None:
        self.links = links
        #: the segment, where it holds every rank of the group
        self.local = local if local is not None and local.size == links.size else None

    def put(self, rec: bytes) -> None:
        """Show ``rec`` in this rank's header line (before posting the step it rides with)."""
        assert self.local is not None
        at = self.local.rank * (LINE // 4) + 2
        self.local.segment.counters[at : at + _WORDS] = memoryview(rec).cast("I")

    def read(self) -> list[bytes]:
        """Every rank's shown record (after waiting for the step each posted with it)."""
        assert self.local is not None
        c = self.local.segment.counters
        return [
            c[r * (LINE // 4) + 2 : r * (LINE // 4) + 2 + _WORDS].tobytes() for r in range(self.local.size)
        ]

    def resync(self, records: list[bytes]) -> None:
        """After a disagreement: every rank's view of the slots as large as the largest asked for
        (the segment's slots grow alike on every rank)."""
        if self.local is not None:
            self.local.segment.ensure(max(record_nbytes(r) for r in records))

    def show(self, rec: bytes) -> int:
        """Through the segment: show ``rec`` as this rank's record of the next slot, once every rank
        finished the previous one; the slot's first step (``shown``, ``records_at``)."""
        loc = self.local
        assert loc is not None
        base = 3 * loc.ops
        loc.ops += 1
        loc.wait_all(base, "finish the previous operation")
        self.put(rec)
        loc.post(base + 1)
        return base

    def shown(self, base: int) -> list[bytes] | None:
        """Every rank's record of the slot ``show`` began at ``base``, if every rank showed it yet
        (None: not yet); does not wait."""
        loc = self.local
        assert loc is not None
        return self.read() if loc.posted_all(base + 1) else None

    def records_at(self, base: int) -> list[bytes]:
        """Every rank's record of the slot ``show`` began at ``base`` (waits for them), and that
        slot's end."""
        loc = self.local
        assert loc is not None
        loc.wait_all(base + 1, "submit the next operation")
        out = self.read()
        loc.post(base + 3)
        return out

    def records(self, seq: int, rec: bytes) -> list[bytes]:
        """Every rank's record for slot ``seq``."""
        if self.local is not None:
            return self.records_at(self.show(rec))
        links, ctx = self.links, Ctx.for_op(self.links, seq)
        table = np.zeros(links.size * RECORD_BYTES, np.uint8)
        if links.rank == 0:
            table[:RECORD_BYTES] = np.frombuffer(rec, np.uint8)
            rows = table.reshape(links.size, RECORD_BYTES)
            wait_all([links.recv(p, ctx.control(_SLOW[0]), rows[p]) for p in range(1, links.size)])
            wait_all([links.send(p, ctx.control(_SLOW[1]), table) for p in range(1, links.size)])
        else:
            mine = np.frombuffer(rec, np.uint8).copy()
            h = links.send(0, ctx.control(_SLOW[0]), mine)
            links.recv(0, ctx.control(_SLOW[1]), table).wait()
            h.wait()
        return [table[r * RECORD_BYTES : (r + 1) * RECORD_BYTES].tobytes() for r in range(links.size)]

    def queues(self, seq: int, blob: bytes) -> list[bytes]:
        """Every rank's ``blob`` (each to every other: the slow path only)."""
        links, ctx = self.links, Ctx.for_op(self.links, seq)
        peers = [p for p in range(links.size) if p != links.rank]
        n = np.array([len(blob)], np.int64)
        lens = {p: np.zeros(1, np.int64) for p in peers}
        hs = [links.send(p, ctx.control(_SLOW[2]), n) for p in peers]
        wait_all([links.recv(p, ctx.control(_SLOW[2]), lens[p]) for p in peers] + hs)
        data = np.frombuffer(blob, np.uint8).copy()
        got = {p: np.zeros(int(lens[p][0]), np.uint8) for p in peers}
        hs = [links.send(p, ctx.control(_SLOW[2] + 1), data) for p in peers]
        wait_all([links.recv(p, ctx.control(_SLOW[2] + 1), got[p]) for p in peers] + hs)
        return [blob if r == links.rank else got[r].tobytes() for r in range(links.size)]


class Negotiator:
    """A group's queue of operations and the thread that drives their slots."""

    def __init__(self, exchange: Exchange, name: str = "collective") -> None:
        self.exchange = exchange
        self._cond = threading.Condition()
        self._queue: list[Op] = []
        self._driving = False  # a thread is driving a slot
        self._slot = 0
        self._unnamed = 0
        self._running: set[str] = set()
        self._head: Op | None = None  # the operation whose record a slot in progress showed
        self._wait_s = _POLL_S[0] / 2
        self._closed = False
        self._broken: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def slots(self) -> int:
        """The slots this rank has taken part in (``0 .. slots - 1``; the same on every rank)."""
        with self._cond:
            return self._slot

    def name(self, name: str | None) -> str:
        """The operation's name: the caller's, or the next of this rank's unnamed ones."""
        if name is not None:
            return name
        with self._cond:
            self._unnamed += 1
            return f"noname.{self._unnamed - 1}"

    def submit(self, op: Op) -> Work:
        """Queue ``op``; its ``Work`` at once."""
        return self._enqueue(op, inline=False)[0]

    def call(self, op: Op) -> Any:
        """Run ``op`` and return its result (on this thread when nothing else is queued)."""
        work, drive = self._enqueue(op, inline=True)
        if drive:
            try:
                while not work.done():
                    waited = self._drive()
                    if waited:
                        self._poll(waited)
            finally:
                with self._cond:
                    self._driving = False
                    if self._queue:  # hand over to the background thread (else: no wake-up)
                        self._cond.notify_all()
        return work.wait()

    def _enqueue(self, op: Op, inline: bool) -> tuple[Work, bool]:
        """Queue ``op``; its ``Work``, and whether this thread is to drive (nothing else queued or
        driving)."""
        work = Work(op.desc.kind, -1)
        with self._cond:
            if self._closed:
                raise CollectiveClosed(f"collective {op.desc.kind}: the group is closed")
            twin = next((o for o in self._queue if o.desc.name == op.desc.name), None)
            if op.desc.name in self._running or (twin is not None and twin is self._head):
                raise CollectiveMismatch(
                    f"collective {op.desc.kind} {op.desc.name!r} submitted again while it runs"
                )
            if twin is not None:  # the pending one fails on every rank, and this one with it
                why = f"{op.desc.name!r} submitted twice while in flight"
                twin.desc = Descriptor(**{**twin.desc.to_json(), "refused": why})
                twin.works.append(work)
                return work, False
            op.works.append(work)
            self._queue.append(op)
            drive = inline and len(self._queue) == 1 and not self._driving and self._broken is None
            if drive:
                self._driving = True
            else:
                self._cond.notify_all()
            return work, drive

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._queue and not self._driving) and not (self._closed and not self._queue):
                    self._cond.wait()
                if not self._queue:
                    return
                self._driving = True
            try:
                waited = self._drive()
            finally:
                with self._cond:
                    self._driving = False
            if waited:
                self._poll(waited)

    def _poll(self, delay: float) -> None:
        """After a slot with no common operation: wait for a submission (at most ``delay`` s)."""
        with self._cond:
            n = len(self._queue)
            self._cond.wait_for(lambda: len(self._queue) != n or self._closed, delay)

    def _drive(self) -> float:
        """One slot; the seconds to wait before the next where it found nothing to run."""
        try:
            return self._slot_once()
        finally:
            with self._cond:
                self._head = None

    def _slot_once(self) -> float:
        with self._cond:
            ops, seq = list(self._queue), self._slot
            self._slot += 1
            self._head = ops[0]
            broken = self._broken
        if broken is not None:
            self._fail(ops, broken)
            return 0.0
        head = ops[0]
        if self.exchange.links.size == 1 and not head.desc.refused:
            return self._finish(head, seq, NOT_RUN)  # nobody to agree with
        try:
            rec = head.desc.record(head.nbytes)
            with stall.running(head.desc.kind, seq, head.desc.name):
                if head.fast is not None and self.exchange.local is not None and not head.desc.refused:
                    records, result = head.fast(seq, rec)
                else:
                    records, result = self.exchange.records(seq, rec), NOT_RUN
        except BaseException as exc:
            self._break(exc)
            return 0.0
        return self._settle(ops, seq, records, result)

    def _settle(self, ops: list[Op], seq: int, records: list[bytes], result: Any) -> float:
        """What slot ``seq`` does, once every rank's record for it (the head of ``ops``) is known."""
        head = ops[0]
        if agreed(records):
            return self._finish(head, seq, result)
        try:
            self.exchange.resync(records)
            queues = [decode(b) for b in self.exchange.queues(seq, encode([o.desc for o in ops]))]
            drop = getattr(self.exchange.links, "drop", None)
            if drop is not None:  # data a speculating rank sent in this slot is void (``speculation``)
                drop(seq)
        except BaseException as exc:
            self._break(exc)
            return 0.0
        decision = decide(queues)
        if decision.name is None:
            self._wait_s = min(_POLL_S[1], 2 * self._wait_s)
            return self._wait_s
        self._wait_s = _POLL_S[0] / 2
        op = next(o for o in ops if o.desc.name == decision.name)
        if decision.error:
            self._done(op, error=CollectiveMismatch(decision.error))
            return 0.0
        with self._cond:  # it runs in the next slot, at the head of every rank's queue (not in this
            if op in self._queue:  # one, whose tags may carry a speculating rank's void data)
                self._queue.remove(op)
                self._queue.insert(0, op)
        return 0.0

    def quick(
        self,
        name: str | None,
        record_of: Callable[[str], bytes],
        attempt: Callable[[int, bytes], tuple[list[bytes], Any]],
        make: Callable[[str], Op],
        kind: str = "allreduce",
    ) -> Any:
        """A synchronous operation's short way, where nothing else is queued or driving (else
        ``NOT_RUN``): no ``Op`` nor ``Work`` unless the ranks disagree. ``record_of(name)``: its
        record; ``attempt(seq, record)``: every rank's record and, where they agreed, the result
        (as ``Op.fast``); ``make(name)``: its ``Op``, for the slow path of the same slot."""
        with self._cond:
            if self._queue or self._driving or self._broken is not None or self._closed:
                return NOT_RUN
            if name is None:
                name = f"noname.{self._unnamed}"
                self._unnamed += 1
            elif name in self._running:
                return NOT_RUN
            seq = self._slot
            self._slot += 1
            self._driving = True
        try:
            try:
                with stall.running(kind, seq, name):
                    records, result = attempt(seq, record_of(name))
            except BaseException as exc:
                with self._cond:
                    self._broken = exc
                    ops = list(self._queue)
                self._fail(ops, exc)
                raise
            if result is not NOT_RUN and agreed(records):
                return result
            op = make(name)
            work = Work(op.desc.kind, -1)
            op.works.append(work)
            with self._cond:
                self._queue.insert(0, op)
                ops = list(self._queue)
                self._head = op
            waited = self._settle(ops, seq, records, NOT_RUN)
            with self._cond:
                self._head = None
            while not work.done():
                if waited:
                    self._poll(waited)
                waited = self._drive()
            return work.wait()
        finally:
            with self._cond:
                self._driving = False
                if self._queue:
                    self._cond.notify_all()

    def _finish(self, op: Op, seq: int, result: Any) -> float:
        for w in op.works:
            w.seq = seq
        with self._cond:
            self._running.add(op.desc.name)
            self._queue.remove(op)
        try:
            if result is NOT_RUN:
                with stall.running(op.desc.kind, seq, op.desc.name):
                    result = op.run(seq)
        except BaseException as exc:
            self._break(exc, op)
            return 0.0
        self._done(op, result)
        return 0.0

    def _done(self, op: Op, result: Any = None, error: BaseException | None = None) -> None:
        with self._cond:
            self._running.discard(op.desc.name)
            if op in self._queue:
                self._queue.remove(op)
        for w in op.works:
            w._finish(result, error)

    def _break(self, exc: BaseException, op: Op | None = None) -> None:
        with self._cond:
            self._broken = exc
            ops = list(self._queue)
            if op is not None:
                self._running.discard(op.desc.name)
        self._fail(ops + ([op] if op is not None else []), exc)

    def _fail(self, ops: list[Op], exc: BaseException) -> None:
        for o in ops:
            self._done(o, error=exc)

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the thread (waits ``timeout`` seconds at most)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
