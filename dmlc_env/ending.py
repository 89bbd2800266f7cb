"""How a node tells its launcher that it ends because ANOTHER node of the job failed.

When one node fails, the others notice (an abort from the scheduler, a heartbeat that stops, a
connection that closes) and end too, often before the node that failed has: a launcher that
blamed the first process to exit would name the scheduler that relayed the abort, not the worker
whose exception started it. So a node that ends because of another writes one line to its
stderr, ``peer_failed_line(node)``:

    dmlc_env: this node ends because worker 1 failed

and a launcher that reads its processes' output (``peer_failure(line)``) prefers a process that
failed on its own, and names ``node`` when every failed process only reports another's failure
(a node that hangs: the others give up on it, it never exits by itself). The line is plain text
for a person reading the log too; a launcher that does not read it loses nothing.

A node that ends while it waited for another (a collective operation, a barrier, a sync round)
says so too, before the error that ends it, so that a launcher can tell what the node named did
to the job (it may have exited 0, early); the line also reports that node's end, as the one above:

    dmlc_env: this node waited for worker 1 in allreduce (operation 3)

Standard library only; no side effects on import.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TextIO

_ROLES = ("scheduler", "server", "worker")
_LINE = "dmlc_env: this node ends because {} failed"
_UNKNOWN = "another node"
_WAITED = "dmlc_env: this node waited for {} in {}"
_WAITED_PATTERN = re.compile(
    r"dmlc_env: this node waited for (scheduler|server|worker)(?: (\d{1,9}))? in (.{1,200})$"
)
_PATTERN = re.compile(
    r"dmlc_env: this node ends because (?:(scheduler|server|worker)(?: (\d{1,9}))?|another node) failed$"
)


@dataclass(frozen=True)
class PeerFailure:
    """What a node's line says: the node whose failure ended it (``role`` and ``rank``), or
    ``role`` None when the node did not know which one."""

    role: str | None = None
    rank: int = 0


def _node_name(node: str | None) -> str:
    """``worker 1``, ``server 0``, ``scheduler`` as they are; anything else (None, a free text) is
    ``another node``, so that the line stays one line a launcher can parse."""
    if node is None:
        return _UNKNOWN
    m = re.fullmatch(r"(scheduler|server|worker)(?: (\d{1,9}))?", node)
    return node if m else _UNKNOWN


def peer_failed_line(node: str | None) -> str:
    """The line (no newline) a node writes as it ends because ``node`` failed."""
    return _LINE.format(_node_name(node))


def say_peer_failed(node: str | None, stream: TextIO | None = None) -> None:
    """Write ``peer_failed_line(node)`` to ``stream`` (stderr) at once, in one write."""
    out = sys.stderr if stream is None else stream
    try:
        out.write(peer_failed_line(node) + "\n")
        out.flush()
    except (OSError, ValueError):  # a closed or broken stderr: the launcher then only loses the hint
        pass


def peer_failure(line: str) -> PeerFailure | None:
    """What a line of a node's output says, when it is the line above (a logging prefix before
    it is allowed); None for any other line."""
    m = _PATTERN.search(line)
    if m is None:
        return None
    role, rank = m.group(1), m.group(2)
    return PeerFailure(role, int(rank) if rank else 0)


@dataclass(frozen=True)
class Waited:
    """What a node's waited line says: the node it waited for (``role``, ``rank``) and in what."""

    role: str
    rank: int
    what: str


def waited_line(node: str, what: str) -> str | None:
    """The line a node writes as a wait for ``node`` (``worker 1``) in ``what`` (``allreduce
    (operation 3)``) ends in a failure; None when ``node`` is not a node's name."""
    if _node_name(node) == _UNKNOWN:
        return None
    return _WAITED.format(node, " ".join(what.split())[:200])


def say_waited(node: str, what: str, stream: TextIO | None = None) -> None:
    """Write ``waited_line(node, what)`` to ``stream`` (stderr) at once, when it is one."""
    line = waited_line(node, what)
    if line is None:
        return
    out = sys.stderr if stream is None else stream
    try:
        out.write(line + "\n")
        out.flush()
    except (OSError, ValueError):
        pass


def waited_for(line: str) -> Waited | None:
    """What a line of a node's output says, when it is a waited line; None for any other."""
    m = _WAITED_PATTERN.search(line)
    if m is None:
        return None
    return Waited(m.group(1), int(m.group(2)) if m.group(2) else 0, m.group(3))
