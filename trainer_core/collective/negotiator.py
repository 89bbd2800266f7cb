"""Runs a group's operations in an order every rank agrees on, each only once every rank submitted
it with the same descriptor (``agreement``); each submission returns a ``Work``.

Operations wait in a per-rank queue. One thread at a time (the group's background thread, or a
caller's own for a synchronous operation when nothing else is queued) drives the slots: slot
``k`` shows every rank the ``agreement.record`` of the head of each queue, and when all are equal
(the common case: every rank submits the same operations in the same order) that operation runs
as the group's ``k``-th (``k`` its tag namespace). Otherwise every rank hands the others its whole
queue and ``agreement.decide`` says what the slot does: run the operation of a name every rank
holds (threads may submit in different orders; it goes to the head of every queue and runs in
the next slot), fail one on every rank (``CollectiveMismatch``: the group goes on), or wait for
more submissions (then the slot is tried again, polling). A rank whose head is a ``join`` has
joined: where the others run an operation it does not hold, it builds its stand-in
(``standin``, from the others' descriptor) at the head of its queue, to run in the next slot.

The records and queues travel as ``exchange.Exchange`` says (an operation with ``fast`` shows
its record in its own first step, so an agreed allreduce costs no extra step). A failure
of the data path (a peer gone, a timeout) breaks the group: every later operation fails at once
with the same error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .agreement import JOIN, CollectiveMismatch, Decision, Descriptor, agreed, decide, decode, encode
from .batching import batch_record, candidate, layout, together
from .exchange import Exchange
from .executor import CollectiveClosed, Work
from .primitives import stall
from .timeline import Phases, Recorder

#: ``fast(seq, record)``: runs the operation with ``record`` shown in its first step; returns every
#: rank's record and, where they agreed, the result (else ``NOT_RUN``)
Fast = Callable[[int, bytes], tuple[list[bytes], Any]]
#: ``fuser(batch)``: a batch's data path as ``(pack, run)``: ``pack()`` copies the operations'
#: inputs into one buffer, ``run(seq)`` reduces it and returns each operation's result, in order
Fuser = Callable[[list["Op"]], tuple[Callable[[], None], Callable[[int], list[Any]]]]
NOT_RUN = object()
_POLL_S = (0.001, 0.1)  # a slot that found no common operation is tried again after this (doubling)


@dataclass
class Op:
    """One submitted operation: its descriptor, its data path ``run(seq)``, and its ``Work``s (a
    name submitted twice while pending fails both)."""

    desc: Descriptor
    run: Callable[[int], Any]
    nbytes: int = 0
    fast: Fast | None = None
    works: list[Work] = field(default_factory=list)
    #: its clock (``time.monotonic``) for a timeline: submitted, its first slot began, agreed
    submitted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    agreed: float = 0.0
    #: the first slot it was at the head of this rank's queue (-1: not yet)
    slot: int = -1
    #: a join's: the errors of the operations it stood in for that failed on every rank
    errors: list[str] = field(default_factory=list)
    #: what the group's ``fuser`` needs to run it in a batch (where ``desc.fuse`` > 0)
    part: Any = None


class Negotiator:
    """A group's queue of operations and the thread that drives their slots."""

    def __init__(self, exchange: Exchange, name: str = "collective") -> None:
        self.exchange = exchange
        #: the tag space of the group (a process set's id; 0: the whole group), for stall messages
        self._space = int(getattr(exchange.links, "space", 0))
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
        #: where each finished operation's phases go (``HOROVOD_TIMELINE``); None: nowhere
        self.timeline: Recorder | None = None
        #: builds this rank's part of an operation the others run while it has joined (``Group``)
        self.standin: Callable[[Descriptor], Op] | None = None
        #: tensor fusion (``batching``): a batch's bytes at most (0: off), how long a fusable
        #: operation at the head waits for others (seconds: Horovod's cycle), the batch's data path
        self.fusion_bytes = 0
        self.cycle_s = 0.0
        self.fuser: Fuser | None = None
        #: what the next slot runs, as every rank decided in a slow slot (names; one: alone)
        self._pinned: list[str] = []
        self._agreeing: set[str] = set()  # the batch whose record a slot in progress showed
        #: the collectives this rank ran (a fused batch counts once)
        self.collectives = 0
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

    def unnamed(self) -> int:
        """How many unnamed operations this rank has named."""
        with self._cond:
            return self._unnamed

    def catch_up(self, unnamed: int) -> None:
        """After a join: name the next unnamed operation as the rank that named the most does."""
        with self._cond:
            self._unnamed = max(self._unnamed, unnamed)

    def submit(self, op: Op, waits: bool = False) -> Work:
        """Queue ``op``; its ``Work`` at once (``waits``: the caller waits for it at once, which
        ends a fusion cycle as its ``wait()`` would, without waking the thread twice)."""
        return self._enqueue(op, inline=False, waits=waits)[0]

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

    def _enqueue(self, op: Op, inline: bool, waits: bool = False) -> tuple[Work, bool]:
        """Queue ``op``; its ``Work``, and whether this thread is to drive (nothing else queued or
        driving)."""
        work = Work(op.desc.kind, -1)
        work.waiting = waits
        with self._cond:
            if self._closed:
                raise CollectiveClosed(f"collective {op.desc.kind}: the group is closed")
            twin = next((o for o in self._queue if o.desc.name == op.desc.name), None)
            running = op.desc.name in self._running or op.desc.name in self._agreeing
            if running or (twin is not None and twin is self._head):
                raise CollectiveMismatch(
                    f"collective {op.desc.kind} {op.desc.name!r} submitted again while it runs"
                )
            if twin is not None:  # the pending one fails on every rank, and this one with it
                why = f"{op.desc.name!r} submitted twice while in flight"
                twin.desc = Descriptor(**{**twin.desc.to_json(), "refused": why})
                twin.works.append(work)
                return work, False
            op.works.append(work)
            if self.cycle_s > 0:
                work.on_wait = self._wake
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
                delay = self._cycle_left()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._driving = True
            try:
                waited = self._drive()
            finally:
                with self._cond:
                    self._driving = False
            if waited:
                self._poll(waited)

    def _cycle_left(self) -> float:
        """(Under the lock.) How long a fusable head still waits for operations to fuse with: until
        a cycle passed without a submission, or sooner once a caller waits for a queued operation
        (it submits nothing more meanwhile), the queue holds a full buffer, or the group closes."""
        head = self._queue[0]
        if self.cycle_s <= 0 or head.desc.fuse <= 0 or self._closed or self._broken is not None:
            return 0.0
        if any(w.waiting for o in self._queue for w in o.works):
            return 0.0
        if sum(o.desc.fuse for o in self._queue) >= self.fusion_bytes:
            return 0.0
        return self._queue[-1].submitted + self.cycle_s - time.monotonic()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

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
                self._agreeing = set()

    def _batch(self, ops: list[Op]) -> list[Op]:
        """(Under the lock.) The operations this slot proposes to run as one collective, in
        ``layout`` order (``[]``: the head alone): what the last slow slot decided, else this
        rank's ``candidate``."""
        pinned, self._pinned = self._pinned, []
        if self.fusion_bytes <= 0 or self.fuser is None or self.exchange.links.size == 1:
            return []
        by = {o.desc.name: o for o in ops}
        if pinned and all(n in by for n in pinned):
            return [by[n] for n in layout(pinned)] if len(pinned) > 1 else []
        return sorted((ops[i] for i in candidate([o.desc for o in ops], self.fusion_bytes)), key=_name)

    def _slot_once(self) -> float:
        with self._cond:
            ops, seq = list(self._queue), self._slot
            self._slot += 1
            self._head = ops[0]
            broken = self._broken
            batch = self._batch(ops) if broken is None else []
            self._agreeing = {o.desc.name for o in batch}
        if broken is not None:
            self._fail(ops, broken)
            return 0.0
        head = ops[0]
        now = time.monotonic()
        for o in batch or [head]:
            o.started = o.started or now
            o.slot = seq if o.slot < 0 else o.slot
        if self.exchange.links.size == 1 and not head.desc.refused:
            head.agreed = head.started
            return self._finish(head, seq, NOT_RUN)  # nobody to agree with
        try:
            rec = batch_record([o.desc for o in batch]) if batch else head.desc.record(head.nbytes)
            with stall.running(head.desc.kind, seq, head.desc.name, self._space):
                fast = head.fast is not None and self.exchange.local is not None and not batch
                if fast and head.fast is not None and not head.desc.refused:
                    records, result = head.fast(seq, rec)
                else:
                    records, result = self.exchange.records(seq, rec), NOT_RUN
        except BaseException as exc:
            self._break(exc)
            return 0.0
        if batch and agreed(records):  # every rank proposed this batch
            return self._finish_batch(batch, seq)
        with self._cond:  # (before any result is delivered: a caller may submit its names again)
            self._agreeing = set()
        return self._settle(ops, seq, records, result)

    def _settle(self, ops: list[Op], seq: int, records: list[bytes], result: Any) -> float:
        """What slot ``seq`` does, once every rank's record for it (the head of ``ops``) is known."""
        head = ops[0]
        if agreed(records):  # (a fast path moved its data while agreeing: the two are one span)
            head.agreed = head.started if result is not NOT_RUN else time.monotonic()
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
        op = next((o for o in ops if o.desc.name == decision.name), None)
        if op is None:
            return self._stand_in(ops[0], decision)
        if decision.error:
            self._done(op, error=CollectiveMismatch(decision.error))
            return 0.0
        # it runs in the next slot, at the head of every rank's queue (not in this one, whose tags
        # may carry a speculating rank's void data), with what every rank holds to fuse with it
        names = (
            together(queues, op.desc.name, self.fusion_bytes) if self.fuser is not None else [op.desc.name]
        )
        with self._cond:
            moved = [o for n in names for o in self._queue if o.desc.name == n]
            self._queue[:] = moved + [o for o in self._queue if o not in moved]
            self._pinned = names
        return 0.0

    def _finish_batch(self, batch: list[Op], seq: int) -> float:
        """Run the operations ``batch`` (agreed on every rank) as one collective: their inputs
        packed into one buffer, reduced once, each result delivered."""
        now = time.monotonic()
        names = [o.desc.name for o in batch]
        for o in batch:
            o.agreed = now
            for w in o.works:
                w.seq = seq
        with self._cond:
            self._running.update(names)
            self._agreeing = set()
            self._queue[:] = [o for o in self._queue if o not in batch]
        assert self.fuser is not None
        try:
            with stall.running(batch[0].desc.kind, seq, f"{names[0]} (+{len(names) - 1} fused)", self._space):
                pack, run = self.fuser(batch)
                pack()
                packed = time.monotonic()
                results = run(seq)
        except BaseException as exc:
            self._break(exc, *batch)
            return 0.0
        self.collectives += 1
        if self.timeline is not None:
            self.timeline.fused(names, seq, now, packed, sum(o.nbytes for o in batch))
        for o, r in zip(batch, results, strict=True):
            self._done(o, r)
        return 0.0

    def _stand_in(self, join: Op, decision: Decision) -> float:
        """This rank has joined (``join``, its head): its part of what the others run goes to the
        head of its queue, for the next slot; where it cannot take part, the join notes the error
        (the others' operation fails on every rank that holds it)."""
        try:
            if join.desc.kind != JOIN or decision.standin is None or self.standin is None:
                raise RuntimeError(f"collective {decision.name!r} chosen, which this rank does not hold")
            if decision.error:
                join.errors.append(decision.error)
                return 0.0
            op = self.standin(decision.standin)
        except BaseException as exc:  # the others would wait for this rank's part forever
            self._break(exc)
            return 0.0
        op.submitted = op.started = time.monotonic()
        with self._cond:
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
        t0 = time.monotonic()
        try:
            try:
                with stall.running(kind, seq, name, self._space):
                    records, result = attempt(seq, record_of(name))
            except BaseException as exc:
                with self._cond:
                    self._broken = exc
                    ops = list(self._queue)
                self._fail(ops, exc)
                raise
            if result is not NOT_RUN and agreed(records):
                self.collectives += 1
                if self.timeline is not None:
                    self.timeline.operation(name, kind, seq, Phases(t0, t0, t0, time.monotonic()), 0, None)
                return result
            op = make(name)
            op.submitted = op.started = t0
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
                with stall.running(op.desc.kind, seq, op.desc.name, self._space):
                    result = op.run(seq)
        except BaseException as exc:
            self._break(exc, op)
            return 0.0
        self.collectives += 1
        self._done(op, result)
        return 0.0

    def _done(self, op: Op, result: Any = None, error: BaseException | None = None) -> None:
        with self._cond:
            self._running.discard(op.desc.name)
            if op in self._queue:
                self._queue.remove(op)
        if self.timeline is not None:
            now = time.monotonic()
            started = op.started or now
            phases = Phases(op.submitted, started, op.agreed or started, now)
            why = None if error is None else f"{type(error).__name__}: {error}"
            self.timeline.operation(
                op.desc.name, op.desc.kind, op.works[0].seq if op.works else -1, phases, op.nbytes, why
            )
        for w in op.works:
            w._finish(result, error)

    def _break(self, exc: BaseException, *running: Op) -> None:
        with self._cond:
            self._broken = exc
            ops = list(self._queue)
            self._pinned = []
            for op in running:
                self._running.discard(op.desc.name)
        self._fail(ops + list(running), exc)

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


def _name(op: Op) -> str:
    return op.desc.name
