"""The workers of an elastic job as the scheduler keeps them: a ``Roster`` per epoch (pure).

A job that is not elastic has one roster, epoch 0, for its whole life. In an elastic job
(``LAUNCHKIT_ELASTIC=MIN:MAX``) every change of membership makes the next roster, epoch + 1:
``admit`` appends a worker that registered after the start, ``drop`` takes out one that died or
left. A worker's rank is its place in the roster: dense, 0 .. size - 1, the survivors keeping
their order (a survivor's rank can only go down) and a newcomer taking the next one. A worker's
*name* (``worker 3``) never changes: at the start it is ``worker RANK``; a newcomer is named by
its launcher index (``LAUNCHKIT_ROLE_RANK``, never reused) or, without one, by the next number
never used, so that a name seen once always means the same process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Roster:
    """The workers of one epoch, in rank order (by name), and what changed from the last epoch."""

    epoch: int
    workers: tuple[str, ...]
    left: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.workers)

    def rank_of(self, name: str) -> int:
        """The worker's dense rank in this epoch (``ValueError`` when it is not a member)."""
        return self.workers.index(name)

    def admit(self, name: str) -> Roster:
        """The next epoch, with ``name`` joined as the last rank."""
        if name in self.workers:
            raise ValueError(f"{name} is a member already (epoch {self.epoch})")
        return Roster(self.epoch + 1, (*self.workers, name), joined=(name,))

    def drop(self, name: str) -> Roster:
        """The next epoch, without ``name``; the ranks after its own move down by one."""
        if name not in self.workers:
            raise ValueError(f"{name} is not a member (epoch {self.epoch})")
        return Roster(self.epoch + 1, tuple(w for w in self.workers if w != name), left=(name,))

    def renumbered(self, before: Roster) -> dict[int, int]:
        """Old rank -> new rank of every worker in both ``before`` and this roster."""
        return {r: self.workers.index(w) for r, w in enumerate(before.workers) if w in self.workers}


@dataclass
class Lobby(Generic[T]):
    """Registrations that wait for room (an elastic job at MAX), in arrival order, each until its
    deadline: a member that died is dropped within the heartbeat bound, and a replacement that
    registered first is then admitted instead of refused."""

    waiting: list[tuple[T, float]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def wait(self, item: T, deadline: float) -> None:
        self.waiting.append((item, deadline))

    def next(self) -> T:
        """The first that waits (taken out)."""
        return self.waiting.pop(0)[0]

    def expired(self, now: float) -> list[T]:
        """Those whose deadline passed (taken out)."""
        gone = [item for item, deadline in self.waiting if deadline <= now]
        self.waiting = [(item, deadline) for item, deadline in self.waiting if deadline > now]
        return gone


def newcomer_name(hint: int, used: set[str]) -> str:
    """The name of a worker that joins after the start: ``worker HINT`` (the launcher's index) when
    that name was never used, else ``worker N`` with N the lowest number above every name used."""
    if hint >= 0 and f"worker {hint}" not in used:
        return f"worker {hint}"
    numbers = [int(n.split(" ", 1)[1]) for n in used if n.startswith("worker ") and n[7:].isdigit()]
    return f"worker {max(numbers, default=-1) + 1}"


def worker_id(name: str) -> int:
    """The number of a worker's name (``worker 3``: 3), stable for its life; its rank in a fixed job."""
    role, _, number = name.partition(" ")
    if role != "worker" or not number.isdigit():
        raise ValueError(f"not a worker's name: {name!r}")
    return int(number)


def below_min(live: int, bounds: tuple[int, int] | None) -> bool:
    """Whether ``live`` workers are fewer than an elastic job's MIN (never in a fixed job)."""
    return bounds is not None and live < bounds[0]


def describe(roster: Roster) -> str:
    """``epoch 2: 3 workers (worker 1 left)``: for logs and errors."""
    said = [f"{', '.join(roster.left)} left"] if roster.left else []
    said += [f"{', '.join(roster.joined)} joined"] if roster.joined else []
    tail = f" ({'; '.join(said)})" if said else ""
    return f"epoch {roster.epoch}: {roster.size} workers{tail}"
