"""Process sets: groups of some of a group's ranks, each with its own operations.

>>> sets = Subgroups(group)          # every rank of ``group``
>>> sid = sets.add([0, 2])           # every rank, in the same order: the set's id (1, 2, ...)
>>> if group.rank in (0, 2):
...     total = sets.group(sid).allreduce(grad)   # among ranks 0 and 2 only
>>> sets.remove(sid)                 # every rank

A set's ``Group`` runs over its parent's links restricted to its members (``SubLinks``), with its
own negotiator (its own operation numbering and background thread) and its own tag space (the
set's id, in every tag it moves: ``primitives.links``), so that its operations run concurrently
with the parent's and another set's without their messages ever matching. The id is the lowest
free one; every rank adds and removes sets in the same order (as Horovod requires), so that every
rank gives a set the same id; ``add`` is a collective of the parent group (an allgather of a digest
of the id and the ranks), so that ranks that disagree get a clear error rather than operations
that never meet. A set's group is flat: no shared-memory
segment, no hierarchical path and no NCCL (device arrays go through host memory).

``start_timeline(path)`` (every rank) records the parent's operations and the sets' in Horovod's
timeline: rank 0 writes the parent's and those of every set it is in to ``path``; a set without
rank 0 is written by its first member to a file of its own (``timeline.writer_of``, ``set_path``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from .group import Group
from .primitives.links import MAX_SPACES, SubLinks
from .timeline import Timeline, set_path, writer_of


def members_of(ranks: Iterable[int], size: int) -> tuple[int, ...]:
    """The sorted ranks of a set of a group of ``size``; ValueError when one is out of range or
    repeated, or the set is empty."""
    try:
        got = [int(r) for r in ranks]
    except (TypeError, ValueError):
        raise TypeError(f"a process set is a list of ranks (integers), not {ranks!r}") from None
    if not got:
        raise ValueError("a process set needs at least one rank")
    bad = [r for r in got if not 0 <= r < size]
    if bad:
        raise ValueError(f"process set ranks {bad} are out of 0..{size - 1} (the job has {size} workers)")
    if len(set(got)) != len(got):
        raise ValueError(f"a process set lists each rank once, not {got}")
    return tuple(sorted(got))


class Subgroups:
    """The process sets of ``parent``'s ranks (ids ``1 .. MAX_SPACES - 1``; 0 is ``parent``)."""

    def __init__(self, parent: Group) -> None:
        self.parent = parent
        self._members: dict[int, tuple[int, ...]] = {}
        self._groups: dict[int, Group] = {}
        #: the running timeline's path and mark_cycles (None: none), and the files this rank writes
        self._timeline: tuple[str, bool] | None = None
        self._files: dict[str, Timeline] = {}

    def add(self, ranks: Iterable[int]) -> int:
        """Register the set of ``ranks`` and return its id (every rank of the parent, in the same
        order: a collective); this rank, where it is a member, gets the set's group. ValueError
        for a set already registered, when no id is left, or when the ranks disagree on it."""
        members = members_of(ranks, self.parent.size)
        if members == tuple(range(self.parent.size)):
            raise ValueError("a set of every rank is the global one (id 0), not a process set to add")
        for sid, m in self._members.items():
            if m == members:
                raise ValueError(f"a process set of ranks {list(members)} is already registered (id {sid})")
        free = [i for i in range(1, MAX_SPACES) if i not in self._members]
        if not free:
            raise ValueError(
                f"at most {MAX_SPACES - 1} process sets besides the global one can be registered"
            )
        sid = free[0]
        self._agree(sid, members)
        if self.parent.rank in members:
            links = SubLinks(self.parent.links, members, space=sid)
            label = f"process set {sid} of ranks {list(members)}"
            self._groups[sid] = Group(links, thresholds=self.parent.thresholds, label=label)
        self._members[sid] = members
        if sid in self._groups:
            self._record(sid, self._groups[sid])
        return sid

    def _agree(self, sid: int, members: tuple[int, ...]) -> None:
        """Every rank of the parent registers the same set as ``sid`` (else ValueError on every
        rank, naming the ranks that differ from rank 0)."""
        if self.parent.size == 1:
            return
        digest = hashlib.sha256(f"process set {sid}: {list(members)}".encode()).digest()
        rows = self.parent.allgather(np.frombuffer(digest, np.uint8).copy()).reshape(self.parent.size, -1)
        differ = [r for r in range(1, self.parent.size) if not np.array_equal(rows[r], rows[0])]
        if differ:
            raise ValueError(
                f"the ranks disagree on process set {sid}: ranks {differ} registered another set as "
                f"{sid} than rank 0 did (rank {self.parent.rank}: ranks {list(members)}); every rank "
                "adds and removes the same process sets in the same order"
            )

    def find(self, ranks: Iterable[int]) -> int | None:
        """The id of the registered set of ``ranks`` (0: every rank), or None."""
        members = members_of(ranks, self.parent.size)
        if members == tuple(range(self.parent.size)):
            return 0
        return next((sid for sid, m in self._members.items() if m == members), None)

    def members(self, sid: int) -> tuple[int, ...]:
        """The ranks of set ``sid`` (ValueError: not registered)."""
        if sid == 0:
            return tuple(range(self.parent.size))
        m = self._members.get(sid)
        if m is None:
            raise ValueError(f"process set {sid} is not registered (or was removed)")
        return m

    def group(self, sid: int, what: str = "the operation") -> Group:
        """The group of set ``sid``; ValueError when this rank is not one of its members."""
        if sid == 0:
            return self.parent
        members = self.members(sid)
        sub = self._groups.get(sid)
        if sub is None:
            raise ValueError(
                f"{what}: rank {self.parent.rank} is not in process set {sid} (ranks {list(members)}); "
                "only a set's members may run its operations"
            )
        return sub

    def remove(self, sid: int) -> None:
        """Forget set ``sid`` (every rank); its group finishes its queued operations and stops."""
        if sid == 0:
            raise ValueError("the global process set cannot be removed")
        self.members(sid)
        del self._members[sid]
        sub = self._groups.pop(sid, None)
        if sub is not None:
            sub.close()

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Record operations to Horovod's timeline from now on (every rank of the parent; a
        timeline already running is stopped first): rank 0 records the parent's and those of
        every set it is in to ``path``, and a set without rank 0 is recorded by its first member
        to ``set_path(path, members)``; sets added later are recorded as well."""
        self.stop_timeline()
        self._timeline = (path, mark_cycles)
        if self.parent.rank == 0:
            self.parent.record(self._file(path))
        for sid, sub in self._groups.items():
            self._record(sid, sub)

    def stop_timeline(self) -> None:
        """Stop recording and complete the files this rank wrote (every rank)."""
        if self._timeline is not None and self.parent.rank == 0:
            self.parent.record(None)
        self._timeline = None
        for sub in self._groups.values():
            sub.record(None)
        files, self._files = list(self._files.values()), {}
        for tl in files:
            tl.close()

    def _file(self, path: str) -> Timeline:
        tl = self._files.get(path)
        if tl is None:
            mark = self._timeline[1] if self._timeline is not None else False
            tl = self._files[path] = Timeline(path, self.parent.rank, mark)
        return tl

    def _record(self, sid: int, sub: Group) -> None:
        """Where set ``sid``'s group records, when a timeline runs and this rank writes the set."""
        members = self._members[sid]
        if self._timeline is None or writer_of(members) != self.parent.rank:
            return
        path = self._timeline[0]
        sub.record(
            self._file(path if self.parent.rank == 0 else set_path(path, members)).for_set(sid, members)
        )

    def ids(self) -> list[int]:
        return sorted(self._members)

    def close(self) -> dict[int, int]:
        """Stop every set's group (before the parent closes; a running timeline goes on until
        ``stop_timeline``, after it); the operations this rank took part in, by set it is in (what
        ``JobGroup.close`` tells the peers)."""
        slots = {sid: sub.slots for sid, sub in self._groups.items()}
        for sid in list(self._members):
            self.remove(sid)
        return slots
