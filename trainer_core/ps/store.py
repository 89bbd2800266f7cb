"""The server's key-value logic, free of sockets: sync rounds, async updates, optimizers.

Sync (as MXNet): the pushes of one round of a key are summed; when every worker has pushed,
the optimizer is applied to the sum (or, without one, the sum becomes the value) and the
pulls waiting for that round are answered. A worker that pushes again before the round ends
is queued for the next round (its data copied: every push is consumed when it is handled, which
lets workers reuse a shared-memory segment once any later request to this server is answered).
One exception saves a copy: the first push of a round that comes in a same-host ``pushpull``
(``Request.lends``) is read where it lies when the second push is added to it. It is copied after
all when that request is answered with an error first, and when any other message of the same
worker comes first (``release``: its worker may write the segment again once that one is
answered). Async: each push is applied at once (with no optimizer the pushed value replaces the
stored one, as MXNet documents). In an elastic job (``elastic``) a round keeps each worker's push
apart and closes when the members of the current epoch (``num_workers``) have pushed; a worker
that leaves is taken out of the open rounds (``workers_changed``, ``ps/rounds.py``).

A ``Request`` carries, per entry, the input data (a view of a shared-memory segment or of a
received frame) and where the result goes (a shared-memory view, or ``None``: returned as a
frame). The server calls ``handle`` and sends the requests it returns as completed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from trainer_core.compression.base import work_dtype
from trainer_core.compression.codec import ServerCodec
from trainer_core.errors import KVError
from trainer_core.optim import server as optim
from trainer_core.ps import protocol, rounds
from trainer_core.ps.away import Away
from trainer_core.ps.request import KeyState, Request

#: the numpy dtype of each dtype name the wire allows, made once (requests name one per entry)
_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in protocol.DTYPES}


def dtype_of(name: str) -> np.dtype:
    """``np.dtype(name)``, from a table for the names the wire allows."""
    dt = _DTYPES.get(name)
    return dt if dt is not None else np.dtype(name)


class StoreError(KVError):
    """A request the store cannot serve (unknown key, size mismatch); answered with an error reply.
    ``finished``: the worker whose finish makes it impossible (a sync round it can never push to),
    which the reply names so that the refused worker can say whom it waited for."""

    def __init__(self, message: str, finished: int | None = None) -> None:
        super().__init__(message)
        self.finished = finished


class Store:
    """The keys held by one server."""

    def __init__(self, num_workers: int, alloc: Callable[[np.dtype, int], np.ndarray] | None = None) -> None:
        self.num_workers = num_workers  # (an elastic job's: the members of the current epoch)
        self.elastic = False  # keep each push of a sync round apart (``ps/rounds.py``)
        #: an elastic job's workers that joined after the start: a key's rounds count one of them
        #: from its first push to that key (``expected``)
        self.newcomers: set[int] = set()
        self.alloc = alloc or (lambda dtype, n: np.empty(n, dtype=dtype))
        self.sync = True
        self.updater: optim.Updater | None = None
        self.keys: dict[tuple[protocol.Key, int], KeyState] = {}
        self.finished: set[int] = set()
        self.away = Away()  # the workers in a collective call at the scheduler
        #: requests that can never complete, with why (``stuck``): the handler answers them with an error
        self.failed: list[tuple[Request, str]] = []
        self.codec = ServerCodec()
        self._versions = itertools.count(1)
        # by the lender's rank, by id: the states reading a push where it lies (``KeyState.lent``)
        self._lent: dict[int, dict[int, KeyState]] = {}

    def set_compression(self, params: dict[str, Any] | None) -> None:
        """Compress pulled values with ``params`` from now on (``None``: off); residuals restart."""
        self.codec.set_params(params)

    def worker_finished(self, rank: int) -> list[Request]:
        """Worker ``rank`` ended: in sync mode, the requests waiting for a round it will never push to."""
        self.finished.add(rank)
        if not self.sync:
            return []
        failed: dict[int, Request] = {}
        for st in self.keys.values():
            if st.pushed and rank not in st.pushed:
                for req, _ in st.waiting + st.deferred:
                    failed[id(req)] = req
                st.waiting, st.deferred, st.pushed, st.queued = [], [], set(), set()
                self._unlend(st)  # the round is abandoned: nothing of it is kept
        return list(failed.values())

    def workers_changed(
        self, num_workers: int, left: set[int], joined: frozenset[int] | set[int] = frozenset()
    ) -> list[Request]:
        """An elastic job's next epoch: ``num_workers`` members, the workers ``left`` gone (their
        pushes dropped from the open rounds), the workers ``joined`` new (counted in a key's rounds
        from their first push to it: a round the others are in does not wait for a newcomer that
        pushes to another key first); returns the requests complete now."""
        self.num_workers = num_workers
        self.finished -= left
        self.newcomers = (self.newcomers - left) | set(joined)
        self.away.forget(left)
        done: list[Request] = []
        if self.sync:
            for st in rounds.drop(self.keys.values(), left, self.expected):
                self._end_round(st, done)
        return done

    def expected(self, st: KeyState) -> int:
        """The pushes that close a round of ``st``: the members, less the newcomers that have not
        pushed to it yet."""
        return self.num_workers - len(self.newcomers - st.entered)

    def enter(self, rank: int, at: str, count: int) -> None:
        """Worker ``rank`` entered collective call ``at``, its ``count``-th, at the scheduler: the
        requests that wait for its push fail (``stuck``)."""
        self.away.enter(rank, at, count)
        self.stuck(self.keys.items())

    def back(self, rank: int) -> None:
        """Worker ``rank`` sent a request: its collective call is over (``away.Away.back``)."""
        if self.away.calls:  # (a dict: no call to ``Away.__bool__`` per request)
            self.away.back(rank)

    def stuck(self, states: Any) -> None:
        """In sync mode, fail the waiting requests of ``states`` (``(key part, KeyState)`` pairs)
        that can never complete (``away.Away.stuck``): added to ``failed``, taken off the rounds
        (a queued pushpull keeps its push, which joins the next round), lending nothing more."""
        found = self.away.stuck(states) if self.sync and self.away else None
        if not found:
            return
        for st in self.keys.values():
            st.waiting = [(r, i) for r, i in st.waiting if id(r) not in found]
            st.deferred = [
                (r, i) for r, i in st.deferred if id(r) not in found or r.header.op != protocol.PULL
            ]
        for req, reason in found.values():
            req.failed = True
            for st in list(self._lent.get(req.rank, {}).values()):
                if st.lender is req:
                    self._copy_lent(st)
            self.failed.append((req, reason))

    def set_optimizer(self, spec: dict[str, Any]) -> None:
        self.updater = optim.build(spec)
        for st in self.keys.values():
            st.opt_state = None

    # -- state for checkpoints (ops get_state / set_state) -------------------------------------------

    def _closed_round(self, kid: tuple[protocol.Key, int]) -> KeyState:
        st = self.keys.get(kid)
        if st is None:
            raise StoreError(f"key {kid[0]!r} (part {kid[1]}) was not initialized")
        if self.sync and (st.pushed or st.deferred):
            raise StoreError(
                f"key {kid[0]!r}: a sync round is open (state is read and written between rounds)"
            )
        return st

    def get_state(self) -> tuple[list[protocol.Entry], list[np.ndarray], list[str], list[list[Any]]]:
        """Every key part's state: its value, its optimizer state and its pull compressor's state, as
        (entries, arrays, slot names, ``[key, part, slot, number]`` scalars); copies."""
        entries: list[protocol.Entry] = []
        arrays: list[np.ndarray] = []
        slots: list[str] = []
        scalars: list[list[Any]] = []

        def add(kid: tuple[protocol.Key, int], slot: str, value: Any) -> None:
            if isinstance(value, np.ndarray):
                arr = np.ascontiguousarray(value).reshape(-1).copy()
                entries.append(protocol.Entry(kid[0], kid[1], arr.size, arr.dtype.str))
                arrays.append(arr)
                slots.append(slot)
            else:
                scalars.append([kid[0], kid[1], slot, value])

        for kid in self.keys:
            st = self._closed_round(kid)
            add(kid, "value", st.weight)
            for name, value in (st.opt_state or {}).items():
                add(kid, f"opt/{name}", value)
            comp = self.codec.parts.get(kid)
            for name, value in (comp.state_dict() if comp is not None else {}).items():
                add(kid, f"pull/{name}", np.asarray(value))
        return entries, arrays, slots, scalars

    def set_state(
        self,
        entries: tuple[protocol.Entry, ...],
        arrays: list[np.ndarray],
        slots: list[str],
        scalars: list[tuple[protocol.Key, int, str, int | float]],
    ) -> None:
        """Restore what ``get_state`` returned for the key parts it names (all checked first, then
        applied): values, optimizer state (none given: starts from zero state), pull residuals (none
        given: start from zero)."""
        given: dict[tuple[protocol.Key, int], dict[str, Any]] = {}
        for e, arr, slot in zip(entries, arrays, slots, strict=True):
            given.setdefault((e.key, e.part), {})[slot] = arr
        for key, part, slot, value in scalars:
            given.setdefault((key, part), {})[slot] = value
        plans: list[tuple[KeyState, tuple[protocol.Key, int], dict[str, Any]]] = []
        for kid, slots_of in given.items():
            st = self._closed_round(kid)
            n, dt = st.weight.size, st.weight.dtype
            template = self.updater.create_state(st.weight) if self.updater is not None else {}
            for slot, value in slots_of.items():
                group, _, name = slot.partition("/")
                if slot == "value":
                    ok = value.size == n and value.dtype == dt
                elif group == "opt":
                    ref = template.get(name)
                    if isinstance(ref, np.ndarray):
                        ok = (
                            isinstance(value, np.ndarray)
                            and value.size == ref.size
                            and value.dtype == ref.dtype
                        )
                    else:
                        ok = isinstance(ref, int) and isinstance(value, int) and value >= 0
                elif group != "pull" or not self.codec.active(dt):
                    ok = False
                elif name == "residual":
                    ok = isinstance(value, np.ndarray) and value.size == n and value.dtype == work_dtype(dt)
                else:
                    ok = isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size <= n
                if not ok:
                    raise StoreError(f"key {kid[0]!r} (part {kid[1]}): state slot {slot!r} does not fit")
            plans.append((st, kid, slots_of))
        for st, kid, slots_of in plans:
            if "value" in slots_of:
                np.copyto(st.weight, slots_of["value"])
            st.version = next(self._versions)
            opt = {k[4:]: v for k, v in slots_of.items() if k.startswith("opt/")}
            st.opt_state = None
            if opt and self.updater is not None:
                st.opt_state = self.updater.create_state(st.weight)
                for name, value in opt.items():
                    if isinstance(value, np.ndarray):
                        np.copyto(st.opt_state[name], value)
                    else:
                        st.opt_state[name] = int(value)
            pull = {k[5:]: np.array(v, copy=True) for k, v in slots_of.items() if k.startswith("pull/")}
            self.codec.load_part(kid, pull)

    def landings(self, rank: int, entries: tuple[protocol.Entry, ...]) -> list[np.ndarray | None]:
        """Where each raw part of a push of ``entries`` by worker ``rank`` may be received directly,
        saving a copy: the key's round accumulator when this push will open a sync round (it is
        overwritten by that push anyway; the previous value using that memory was read by every
        worker before they pushed again, as for sharing, see ``_end_round``); else ``None``."""
        if not self.sync or self.elastic or rank in self.finished:
            return [None] * len(entries)
        out: list[np.ndarray | None] = []
        keys = self.keys
        for e in entries:
            st = keys.get((e.key, e.part))
            acc = None if st is None or st.pushed or st.deferred else st.acc
            if (
                acc is None
                or e.shm is not None
                or e.comp is not None
                or acc.size != e.size
                or acc.dtype != dtype_of(e.dtype)
            ):
                out.append(None)
            else:
                out.append(acc)
        return out

    def handle(self, req: Request) -> list[Request]:
        """Serve ``req``; returns the requests (this one or earlier waiting ones) now complete."""
        states = self._check(req)
        done: list[Request] = []
        try:
            for i, st in enumerate(states):
                self._entry(req, i, st, done)
            if self.away.calls:
                self.stuck([((e.key, e.part), self.keys[(e.key, e.part)]) for e in req.header.entries])
        except BaseException:  # ``req`` is answered with an error now: its worker may reuse its inputs
            for st in list(self._lent.get(req.rank, {}).values()):
                if st.lender is req:
                    self._copy_lent(st)
            raise
        return done

    def release(self, rank: int) -> None:
        """Worker ``rank`` sent another request: copy what the rounds still borrow from its pushes
        (it may write those segments again once that request is answered). Called for every
        message before it is served."""
        lent = self._lent.get(rank)
        if lent:
            for st in list(lent.values()):
                self._copy_lent(st)

    def _copy_lent(self, st: KeyState) -> None:
        """Copy into the round's accumulator what it still borrows."""
        assert st.acc is not None and st.lent is not None
        np.copyto(st.acc, st.lent)
        self._unlend(st)

    def _unlend(self, st: KeyState) -> None:
        if st.lender is not None:
            lent = self._lent[st.lender.rank]
            del lent[id(st)]
            if not lent:
                del self._lent[st.lender.rank]
        st.lent = st.lender = None

    def _check(self, req: Request) -> list[KeyState | None]:
        """Every entry of ``req`` checked before any is served: the state of each one's key part
        (``None`` for an ``init``)."""
        if req.header.op == protocol.INIT:
            for n, e in enumerate(req.header.entries):
                self._check_init(e, req.inputs[n])
            return [None] * len(req.header.entries)
        states: list[KeyState | None] = []
        keys = self.keys
        for e in req.header.entries:
            st = keys.get((e.key, e.part))
            if st is None:
                raise StoreError(f"key {e.key!r} (part {e.part}) was not initialized")
            w = st.weight
            if w.size != e.size or w.dtype != dtype_of(e.dtype):
                raise StoreError(
                    f"key {e.key!r}: {e.size} elements of {e.dtype} given, {w.size} of {w.dtype} stored"
                )
            states.append(st)
        return states

    def _check_init(self, e: protocol.Entry, data: np.ndarray | None) -> None:
        """A key part initialized again must get the very values it holds (as MXNet, which refuses
        any second init; equal values are allowed, e.g. a restarted script's same init)."""
        st = self.keys.get((e.key, e.part))
        if st is None or data is None:
            return
        w = st.weight
        same = (
            w.dtype == data.dtype
            and w.size == data.size
            and np.array_equal(w.view(np.uint8), np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        )
        if not same:
            raise StoreError(
                f"key {e.key!r} (part {e.part}) was initialized already ({w.size} of {w.dtype}), and "
                f"init gave it other values ({data.size} of {data.dtype}): a key is initialized once "
                "(or again with the same values); push to change it"
            )

    def _entry(self, req: Request, i: int, st: KeyState | None, done: list[Request]) -> None:
        """Serve entry ``i`` of ``req``, whose key part's state is ``st`` (``None``: an ``init``)."""
        op = req.header.op
        if st is None:  # an init
            e = req.header.entries[i]
            kid = (e.key, e.part)
            data = req.inputs[i]
            assert data is not None
            if kid in self.keys:  # the same values again (``_check_init``): nothing changes
                self._done(req, i, done)
                return
            weight = self.alloc(data.dtype, data.size)
            np.copyto(weight, data)
            self.keys[kid] = KeyState(weight=weight, version=next(self._versions))
            self._done(req, i, done)
            return
        if op == protocol.PULL:
            if self.sync and req.rank in st.queued:
                st.deferred.append((req, i))  # after this worker's queued push: its round's value
            elif self.sync and req.rank in st.pushed:
                st.waiting.append((req, i))
            else:
                self._answer(st, req, i, done)
            return
        data = req.inputs[i]
        assert data is not None
        if not self.sync:
            self._apply(st, data)
            if op == protocol.PUSHPULL:
                self._answer(st, req, i, done)
            else:
                self._done(req, i, done)
            return
        missing = self.finished and self.finished - st.pushed - {req.rank}
        if missing:
            raise StoreError(
                f"{', '.join(f'worker {r}' for r in sorted(missing))} finished already: "
                f"a sync round of key {req.header.entries[i].key!r} can never complete",
                finished=min(missing),
            )
        if req.rank in st.pushed:  # next round: keep a private copy (the push counts as consumed now)
            req.inputs[i] = np.array(data, copy=True)
            st.deferred.append((req, i))
            st.queued.add(req.rank)
            return
        if self.elastic:  # kept apart until the round closes (a leaver's push can be dropped)
            rounds.keep(st, req.rank, data)
            if req.rank in self.newcomers:
                st.entered.add(req.rank)
        else:
            self._sum_in(st, req, data)
        st.pushed.add(req.rank)
        if op == protocol.PUSHPULL:
            st.waiting.append((req, i))
        else:
            self._done(req, i, done)
        if len(st.pushed) >= (self.expected(st) if self.elastic else self.num_workers):
            self._end_round(st, done)

    def _sum_in(self, st: KeyState, req: Request, data: np.ndarray) -> None:
        """Add a push to the open round's sum."""
        if st.acc is None:
            st.acc = self.alloc(st.weight.dtype, st.weight.size)
        if st.lent is not None:  # the round's first push, not copied: summed with this one at once
            np.add(st.lent, data, out=st.acc)
            self._unlend(st)
        elif st.pushed:
            np.add(st.acc, data, out=st.acc)
        elif req.lends and self.num_workers > 1:
            st.lent, st.lender = data, req
            self._lent.setdefault(req.rank, {})[id(st)] = st
        elif data.ctypes.data != st.acc.ctypes.data:  # not received in place (``landings``)
            np.copyto(st.acc, data)

    def _end_round(self, st: KeyState, done: list[Request]) -> None:
        if st.parts:
            rounds.total(st, self.alloc)
        assert st.acc is not None
        if self.updater is not None:
            self._apply(st, st.acc)
        else:
            st.weight, st.acc = st.acc, st.weight
        st.version = next(self._versions)
        st.pushed.clear()
        waiting, st.waiting = st.waiting, []
        # Sharing the stored array is safe while no worker has pushed into the next round yet: the
        # array changes only when a round ends, and a round needs every worker's next push, which
        # each sends after it has read this result. A queued early push breaks that: copy then.
        safe = not st.deferred
        for req, i in waiting:
            self._answer(st, req, i, done, share_ok=safe)
        deferred, st.deferred = st.deferred, []
        st.queued.clear()  # (refilled by the entries queued again below)
        for req, i in deferred:
            self._entry(req, i, st, done)

    def _apply(self, st: KeyState, grad: np.ndarray) -> None:
        st.version = next(self._versions)
        if self.updater is None:
            np.copyto(st.weight, grad)
            return
        if st.opt_state is None:
            st.opt_state = self.updater.create_state(st.weight)
        self.updater.update(st.weight, grad, st.opt_state)

    def _answer(self, st: KeyState, req: Request, i: int, done: list[Request], share_ok: bool = True) -> None:
        out = req.outputs[i]
        e = req.header.entries[i]
        if e.shm is None and self.updater is None and self.codec.active(st.weight.dtype):
            # compressed: one payload per value version, the same bytes for every worker. Only a
            # sum of gradients is: with an optimizer here the value is the weights, which travel
            # whole (as MXNet's update_on_kvstore); 1 bit of a weight would not train
            req.results[i], req.metas[i] = self.codec.encode((e.key, e.part), st.version, st.weight)
        elif req.share and self.sync and share_ok:
            req.results[i] = st.weight
            req.shared[i] = True
        elif out is not None:
            np.copyto(out, st.weight)
        elif self.sync and share_ok:
            req.results[i] = st.weight  # sent zero-copy: safe for the same reason as sharing it
        else:
            req.results[i] = st.weight.copy()
        self._done(req, i, done)

    @staticmethod
    def _done(req: Request, i: int, done: list[Request]) -> None:
        req.remaining -= 1
        if req.remaining == 0:
            done.append(req)
