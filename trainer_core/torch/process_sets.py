"""Horovod's process sets on the collectives' path (``-s 0``).

``init(process_sets=[ProcessSet([0, 2]), ...])`` registers sets at init;
``add_process_set(ranks)`` and ``remove_process_set(ps)`` after it, with
``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``init(process_sets="dynamic")`` (as Horovod requires). Every
rank registers and removes the same sets in the same order, and a set's operations (``process_set=``)
run among its ranks only (``collective.subgroups``: a group of its own, concurrent with the global
one); a rank outside the set that calls one gets a clear error. A set listing every rank is
``global_process_set``. The parameter servers' path has no process sets but the global one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .backend import Backend
from .runtime import Runtime, default

#: the environment variable that allows adding and removing sets after init (Horovod's)
DYNAMIC = "HOROVOD_DYNAMIC_PROCESS_SETS"


class ProcessSet:
    """Horovod's ``ProcessSet(ranks)``: registered (``process_set_id`` set) by ``init`` or
    ``add_process_set``; ``ranks`` are global ranks."""

    def __init__(self, ranks_or_comm: Sequence[int] | None = None) -> None:
        if ranks_or_comm is not None and not isinstance(ranks_or_comm, Sequence):
            raise ValueError("ProcessSet takes a list of ranks (trainer_core.torch has no MPI communicators)")
        self.ranks = None if ranks_or_comm is None else sorted(int(r) for r in ranks_or_comm)
        #: Horovod's id: 0 for the global set, None until registered
        self.process_set_id: int | None = 0 if self.ranks is None else None
        self._runtime: Runtime | None = None

    def _rt(self) -> Runtime:
        return self._runtime or default

    def _members(self) -> list[int]:
        return list(range(self._rt().backend().size)) if self.ranks is None else self.ranks

    def size(self) -> int:
        return len(self._members())

    def rank(self) -> int:
        """This rank's rank within the set (-1: not in it)."""
        me, members = self._rt().backend().rank, self._members()
        return members.index(me) if me in members else -1

    def included(self) -> bool:
        return self._rt().backend().rank in self._members()

    def __repr__(self) -> str:
        if self.ranks is None:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: every worker (Horovod's ``global_process_set``)
global_process_set = ProcessSet()


def in_set(process_set: Any, what: str, runtime: Runtime | None = None) -> Runtime | Backend | None:
    """Where ``what`` runs: ``runtime`` for the global set (or none), else the backend of the
    registered ``process_set`` (ValueError: not registered, or this rank is not in it)."""
    if process_set is None or process_set is global_process_set:
        return runtime
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"{what}'s process_set must be a ProcessSet, not {type(process_set).__name__}")
    if process_set.ranks is None or process_set.process_set_id == 0:
        return runtime
    backend = (runtime or default).backend()
    sid = process_set.process_set_id
    if process_set.ranks == list(range(backend.size)):
        return runtime
    if not backend.has_sets:  # the path's refusal, before "not registered" (it cannot be)
        raise ValueError(backend.no_sets(what))
    if sid is None:
        raise ValueError(
            f"{what}: {process_set!r} is not registered: pass it to hvd.init(process_sets=[...]) "
            "or hvd.add_process_set first"
        )
    return backend.subset(sid, what)


def register_init_sets(process_sets: Any, runtime: Runtime | None = None) -> None:
    """``init(process_sets=...)``: a list of ``ProcessSet`` registered in order, or ``"dynamic"``."""
    rt = runtime or default
    rt.dynamic_sets = process_sets == "dynamic"
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, str) or not isinstance(process_sets, Sequence):
        raise TypeError(f"init's process_sets is a list of ProcessSet or 'dynamic', not {process_sets!r}")
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise TypeError(f"init's process_sets lists ProcessSet objects, not {type(ps).__name__}")
    for ps in process_sets:
        _register(ps, rt)


def _register(ps: ProcessSet, rt: Runtime) -> ProcessSet:
    backend = rt.backend()
    ps._runtime = rt
    if ps.ranks is None or ps.ranks == list(range(backend.size)):
        ps.process_set_id = 0
    else:
        ps.process_set_id = backend.add_set(ps.ranks)
    return ps


def _refuse_on_path(ps: Any, what: str, rt: Runtime) -> None:
    """Where this worker's path has no process sets (the parameter servers'), ``what`` of a set
    other than the global one is refused first, naming the path and why."""
    if not rt.initialized() or not isinstance(ps, ProcessSet) or ps.ranks is None:
        return
    backend = rt.backend()
    if not backend.has_sets and ps.ranks != list(range(backend.size)):
        raise ValueError(backend.no_sets(what))


def _check_dynamic(what: str, rt: Runtime) -> None:
    if not (rt.dynamic_sets or os.environ.get(DYNAMIC, "0") not in ("", "0")):
        raise ValueError(
            f"{what} after init needs dynamic process sets: set {DYNAMIC}=1 or call "
            "hvd.init(process_sets='dynamic') (or register the sets in hvd.init(process_sets=[...]))"
        )


def add_process_set(process_set: Any, *, runtime: Runtime | None = None) -> ProcessSet:
    """Register a process set after init (every rank, in the same order) and return it:
    ``process_set`` is a ``ProcessSet`` or a list of ranks."""
    rt = runtime or default
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    _refuse_on_path(ps, "add_process_set", rt)
    _check_dynamic("add_process_set", rt)
    if ps.process_set_id is not None and ps.ranks is not None:
        raise ValueError(f"{ps!r} is already registered")
    if ps.ranks is None or ps.ranks == list(range(rt.backend().size)):
        raise ValueError("a process set of every rank is the global one, registered at init")
    return _register(ps, rt)


def remove_process_set(process_set: Any, *, runtime: Runtime | None = None) -> bool:
    """Unregister ``process_set`` (every rank); False for the global set or one not registered."""
    rt = runtime or default
    _refuse_on_path(process_set, "remove_process_set", rt)
    _check_dynamic("remove_process_set", rt)
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ProcessSet, not {type(process_set).__name__}")
    sid = process_set.process_set_id
    if sid is None or sid == 0:
        return False
    rt.backend().remove_set(sid)
    process_set.process_set_id = None
    return True
