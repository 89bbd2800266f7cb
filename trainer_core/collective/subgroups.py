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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from .group import Group
from .primitives.links import MAX_SPACES, SubLinks


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

    def ids(self) -> list[int]:
        return sorted(self._members)

    def close(self) -> dict[int, int]:
        """Stop every set's group (before the parent closes); the operations this rank took part
        in, by set it is in (what ``JobGroup.close`` tells the peers)."""
        slots = {sid: sub.slots for sid, sub in self._groups.items()}
        for sid in list(self._members):
            self.remove(sid)
        return slots
