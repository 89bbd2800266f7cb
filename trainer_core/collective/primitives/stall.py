"""What an operation's waits say while a live peer is late: the operation this thread runs, and
the clock of one wait (docs/collectives.md, "Slow is not dead").

The executor marks the operation it runs on the running thread (``running``), so that a wait
deep inside an algorithm can name it (``current``: ``allreduce (operation 12)``). A ``Clock``
follows one wait: ``tick`` says when a stall warning is due (after ``StallPolicy.check_s``, then
every ``check_s``) and when the wait gives up (after ``StallPolicy.shutdown_s`` when set, or
after ``bound_s``: the fixed limit of links whose peers' liveness is not known).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import Enum

from trainer_core.config import StallPolicy

_here = threading.local()


class running:  # (lower case: used as a function, ``with running(name, seq):``)
    """Mark operation ``seq`` (``name``: allreduce, broadcast, ...; ``label``: the name the ranks
    agreed it under, where there is one; ``space``: the tag space of the group that numbers it, 0
    for the whole group, a process set's id otherwise) as the one this thread runs (cheap: one
    attribute set and reset per operation; the text is made only when asked)."""

    __slots__ = ("before", "op")

    def __init__(self, name: str, seq: int, label: str | None = None, space: int = 0) -> None:
        self.op = (name, seq, label, space)
        self.before: tuple[str, int, str | None, int] | None = None

    def __enter__(self) -> None:
        self.before = getattr(_here, "op", None)
        _here.op = self.op

    def __exit__(self, *exc: object) -> None:
        _here.op = self.before


class watching:  # (lower case: used as a function, ``with watching(check):``)
    """While the block runs, every long wait of this thread's links calls ``check`` between its
    0.1 s slices (``watched``): it raises to end the wait (the operation's ranks turned out to
    disagree while its data moved: ``Group``'s speculative allreduce)."""

    __slots__ = ("before", "check")

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check
        self.before: Callable[[], None] | None = None

    def __enter__(self) -> None:
        self.before = getattr(_here, "watch", None)
        _here.watch = self.check

    def __exit__(self, *exc: object) -> None:
        _here.watch = self.before


def watched() -> None:
    """Run this thread's ``watching`` check, if any (a long wait calls it between slices)."""
    check = getattr(_here, "watch", None)
    if check is not None:
        check()


def current() -> str:
    """The operation this thread runs, as ``running`` marked it (``an operation`` when none)."""
    return running_op() or "an operation"


def running_op() -> str | None:
    """The operation this thread runs (None: it runs none)."""
    op = getattr(_here, "op", None)
    if op is None:
        return None
    name, seq, label, space = op
    where = f"operation {seq} of process set {space}" if space else f"operation {seq}"
    return f"{name} {label!r} ({where})" if label else f"{name} ({where})"


def running_slot() -> tuple[int, int] | None:
    """The number of the operation this thread runs and the tag space of the group that numbers it
    (0: the whole group; a process set's id), or None."""
    op = getattr(_here, "op", None)
    return None if op is None else (op[1], op[3])


class Due(Enum):
    NOTHING = 0
    WARN = 1  # a stall warning is due
    GIVE_UP = 2  # the wait ends: ``StallPolicy.shutdown_s`` (or ``bound_s``) passed


class Clock:
    """One wait's clock (``start`` on the caller's monotonic clock)."""

    __slots__ = ("bound_s", "policy", "start", "warned")

    def __init__(self, policy: StallPolicy, start: float, bound_s: float | None = None) -> None:
        self.policy, self.start, self.bound_s = policy, start, bound_s
        self.warned = 0

    def tick(self, now: float) -> Due:
        waited = now - self.start
        if self.policy.gives_up(waited) or (self.bound_s is not None and waited >= self.bound_s):
            return Due.GIVE_UP
        if self.policy.warnings_due(waited) > self.warned:
            self.warned = self.policy.warnings_due(waited)
            return Due.WARN
        return Due.NOTHING

    def waited(self, now: float) -> float:
        return now - self.start


def warning(me: str, waited_s: float, op: str, late: str, why: str, alive: bool = True) -> str:
    """The stall warning: ``me`` (``rank 0 (worker 0 on h)``) has waited ``waited_s`` in ``op``
    for ``late`` (the ranks it waits on), which ``why`` (``has not sent its part``); ``alive``:
    the job's heartbeats vouch for every rank."""
    state = "alive (heartbeats arrive), so the wait goes on" if alive else "waited for"
    return (
        f"collective stall: {me} has waited {waited_s:.1f} s in {op} for {late}, which {why}; "
        f"it is {state}: a rank is slow (computing, saving) or the ranks called different "
        "operations (said every TRAINER_CORE_STALL_CHECK_SECONDS; "
        "TRAINER_CORE_STALL_SHUTDOWN_SECONDS ends such a wait)"
    )


def gave_up(
    late: str, didnt: str, waited_s: float, op: str, policy: StallPolicy, bound_s: float | None
) -> str:
    """The error of a wait that gave up on ``late``, which ``didnt`` (``sent nothing to rank 0``)."""
    if policy.gives_up(waited_s):
        return (
            f"collective: {late} {didnt} within {policy.shutdown_s:g} s in {op}: it is alive but "
            "stalled, and TRAINER_CORE_STALL_SHUTDOWN_SECONDS ends such a wait"
        )
    return (
        f"collective: {late} {didnt} within {bound_s:g} s in {op}; it is stalled or gone (the "
        "links' timeout, where no heartbeats tell a live rank)"
    )
