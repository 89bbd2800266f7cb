"""Which failed process started the end of a job: the root cause.

The first process to exit with an error is not always the one that failed: when a trainer_core
worker raises, the scheduler learns it from the worker's abort and exits before the worker has
finished printing its traceback; when a node hangs, the scheduler gives up on it and exits, and
the hung node never exits by itself. A node that ends because another failed says so in a line
of its output (``dmlc_env.ending``: ``dmlc_env: this node ends because worker 1 failed``). So:

- a failed process is judged once its output has been read to its end (``OUTPUT_WAIT`` at most):
  one that printed that line *reports* another's failure, any other failed *on its own*;
- the first process that failed on its own is the root cause, and the teardown begins with it;
- while every failed process only reports another's failure, the teardown waits up to
  ``PEER_WAIT`` for the node they name to end on its own (with its own exit code and traceback);
  when it has not, the teardown begins anyway, and the node named is still the root cause
  (ended by the launcher: a hung node), else the first process that failed;
- a node that ends while it waited for another in an operation (collective, a sync round, a
  barrier) says so in a line (``dmlc_env: this node waited for worker 1 in allreduce 'grad.3'
  (operation 3)``): it reports that node's failure too (when it has no line naming another node;
  a rank that failed waiting for a rank that shut down prints no other);
- the node named may also have ended by itself with exit code 0, early, while the others still
  waited for it (their waited lines say so, whatever lines of its own say of the job's end): it
  is the root cause, and ``waited_by`` says who waited in what (also when it failed on its own).
  Without such a line a node that exited 0 is not blamed. So is a node the others waited for
  that failed only by the job's end (its line names another) without waiting in an operation
  itself (a rank that shut down, then failed in its finish when the scheduler went away).

``Tail`` and ``Blame`` hold no process and no clock of their own: the supervisor gives them its
lines and times (``tests/launchkit/test_rootcause.py`` drives them by hand).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dmlc_env.ending import PeerFailure, Waited, peer_failure, waited_for
from launchkit.core.spec import Task, TaskResult

OUTPUT_WAIT = 0.5  # seconds after a process's exit for the last of its output (its line) to be read
PEER_WAIT = 3.0  # at most this long (and never past the grace period) for the node named to end


class Tail(deque[str]):
    """A process's last lines, remembering a line, however far back, that says the process ends
    because another node failed (``peer``)."""

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen=maxlen)
        self.peer: PeerFailure | None = None
        self.waited: Waited | None = None  # the node it waited for as it failed, and in what

    def append(self, line: str) -> None:
        self._see(line)
        super().append(line)

    def extend(self, lines: Iterable[str]) -> None:
        lines = list(lines)
        for line in lines:
            self._see(line)
        super().extend(lines)

    def _see(self, line: str) -> None:
        if "dmlc_env: " not in line:
            return
        if self.peer is None:
            self.peer = peer_failure(line)
        if self.waited is None:
            self.waited = waited_for(line)


def peer_of(lines: deque[str]) -> PeerFailure | None:
    """The failure a process's lines say it ends by (a plain deque says none): its line saying
    so, or, where that line names no node or is missing, the node its waited line names (a wait
    in a collective operation that ended in the error that ends it: the node waited for is the
    cause, e.g. a rank that shut down while this one waited for it)."""
    if not isinstance(lines, Tail):
        return None
    waited = _waited(lines)
    if (lines.peer is None or lines.peer.role is None) and waited is not None:
        return waited
    return lines.peer


@dataclass
class _Failed:
    index: int  # the process, as the supervisor counts them
    seen: float  # when its exit came (the supervisor's monotonic clock)
    tail: deque[str]
    output_ended: Callable[[], bool]  # every stream of it read to its end


class Blame:
    """The failures before the teardown, in the order their exits came; ``decide`` says when the
    teardown begins and ``root`` is then the process that failed first on its own."""

    def __init__(self, peer_wait: float) -> None:
        self.peer_wait = peer_wait
        self.failed: list[_Failed] = []
        self.root: int | None = None

    def add(self, index: int, now: float, tail: deque[str], output_ended: Callable[[], bool]) -> None:
        self.failed.append(_Failed(index, now, tail, output_ended))

    def decide(self, now: float, *, force: bool = False) -> bool:
        """Whether the teardown begins now (``root`` set): a process that failed on its own, the
        wait for the node named is over, or ``force`` (a signal, the time limit, nothing left)."""
        if self.root is not None:
            return True
        if not self.failed:
            return False
        for f in self.failed:
            if peer_of(f.tail) is not None:
                continue  # it reports another's failure
            if not force and not f.output_ended() and now - f.seen < OUTPUT_WAIT:
                return False  # not judged yet, and it came before any later one
            self.root = f.index
            return True
        if force or now - self.failed[0].seen >= self.peer_wait:
            self.root = self.failed[0].index
            return True
        return False


class Proc(Protocol):
    """A process as the supervisor holds it."""

    @property
    def task(self) -> Task: ...
    @property
    def tail(self) -> deque[str]: ...
    @property
    def result(self) -> TaskResult | None: ...


def named_root(root: int, procs: Sequence[Proc]) -> tuple[int, int | None]:
    """The final root cause, once every output is read: ``root`` when it failed on its own; when
    it only reported another's failure, the node it (or another reporter) names, if that is a
    process of the job that failed on its own, or that exited 0 while others waited for it, or
    that the reporter waited for in an operation and that failed only by the job's end without
    waiting in one itself. Returns (root, the process that named it or None)."""
    if peer_of(procs[root].tail) is None:
        return root, None
    where = {(p.task.role, p.task.rank): i for i, p in enumerate(procs)}

    def failed(i: int) -> bool:
        result = procs[i].result
        return result is not None and not result.ok

    def left(i: int) -> bool:  # ended by itself with 0 while another still waited for it
        result = procs[i].result
        ended = result is not None and result.ok and not result.killed_by_launcher
        return ended and bool(waited_by(i, procs))

    for by in [root] + [i for i in range(len(procs)) if i != root]:
        peer = peer_of(procs[by].tail)
        if peer is None or peer.role is None or not failed(by):
            continue
        named = where.get((peer.role, peer.rank))
        if named is None or named == by:
            continue
        # (one that left may still have printed a line naming another: the job's end, told to it
        # as it finished, is no failure of its own)
        if left(named) or (failed(named) and peer_of(procs[named].tail) is None):
            return named, _detector(named, by, procs)
        # the node ``by`` waited for in an operation failed only by the job's end, waiting in no
        # operation itself (a rank that shut down, then failed in its finish as the job ended)
        if failed(named) and _waited(procs[by].tail) == peer and _waited(procs[named].tail) is None:
            return named, by
    return root, None


def _detector(named: int, by: int, procs: Sequence[Proc]) -> int:
    """Who to say reported ``procs[named]``'s failure: a failed scheduler that names it too, where
    there is one (it judges the nodes' liveness and the others only relay its abort, whichever of
    them happened to exit first), else ``by``."""
    task = procs[named].task
    for i, p in enumerate(procs):
        peer = peer_of(p.tail)
        failed = p.result is not None and not p.result.ok
        if (
            p.task.role == "scheduler"
            and failed
            and peer is not None
            and peer == PeerFailure(task.role, task.rank)
        ):
            return i
    return by


def _waited(lines: deque[str]) -> PeerFailure | None:
    """The node a process's waited line names (None: no such line)."""
    w = lines.waited if isinstance(lines, Tail) else None
    return None if w is None else PeerFailure(w.role, w.rank)


def waited_by(root: int, procs: Sequence[Proc]) -> str:
    """Who waited for ``procs[root]`` in what, as their lines say: ``workers 0 and 2 waited for it
    in allreduce (operation 3)`` (the first one's operation); "" when none said so."""
    task = procs[root].task
    waits = [
        (p.task, w)
        for p in procs
        if isinstance(p.tail, Tail)
        and (w := p.tail.waited) is not None
        and (w.role, w.rank) == (task.role, task.rank)
    ]
    if not waits:
        return ""
    names = sorted({(t.role, t.rank) for t, _ in waits}, key=lambda rr: (rr[0], rr[1]))
    return f"{_names(names)} waited for it in {waits[0][1].what}"


def _names(nodes: list[tuple[str, int]]) -> str:
    """``worker 0``, ``workers 0 and 2``, ``workers 0, 2 and 3`` (one role: the usual case)."""
    roles = {r for r, _ in nodes}
    if len(roles) > 1 or len(nodes) == 1:
        parts = [f"{r} {n}" for r, n in nodes]
    else:
        ranks = [str(n) for _, n in nodes]
        return f"{nodes[0][0]}s {', '.join(ranks[:-1])} and {ranks[-1]}"
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
