"""The scheduler's record of one registered node, made from its registration, the ranks it
assigns at the start of a job, and an elastic job's book of an epoch for one node (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer_core.node import book, protocol
from trainer_core.node.membership import Roster
from trainer_core.transport import wire
from trainer_core.transport.channel import Peer


@dataclass
class NodeRecord:
    """One registered node, as the scheduler sees it."""

    role: str
    rank_hint: int
    host: str
    endpoint: str
    host_key: str
    pid: int
    local: str
    data: str
    peer: Peer  # where the registration came from (answered with the book)
    needs: str = book.ALL  # the part of the book it asked for (``book.NEEDS``)
    name: str = ""
    rank: int = -1
    ctl: Peer | None = None  # the node's heartbeat channel (aborts and terminate go there)
    last_seen: float = 0.0
    finished: bool = False
    epoch: int = -1  # the epoch of the last book it was sent (an elastic job sends each new one)
    #: an elastic job's worker: the restart of the workers it belongs to (``TORCHELASTIC_RESTART_COUNT``)
    restarts: int = 0

    def describe(self) -> str:
        return f"{self.name} (host {self.host}, pid {self.pid})"

    def listens(self) -> dict[str, str]:
        """Its entry in the book: where the other nodes reach it."""
        return {"endpoint": self.endpoint, "host_key": self.host_key, "local": self.local, "data": self.data}


def record_of(h: wire.Header, peer: Peer) -> NodeRecord:
    """The record of a registration (``WireError`` for a field missing or of the wrong type)."""
    return NodeRecord(
        role=wire.body_str(h, "role"),
        rank_hint=wire.body_int(h, "rank"),
        host=wire.body_str(h, "host"),
        endpoint=wire.body_str(h, "endpoint"),
        host_key=wire.body_str(h, "host_key"),
        pid=wire.body_int(h, "pid"),
        local=wire.body_str(h, "local", ""),
        data=wire.body_str(h, "data", ""),
        peer=peer,
        needs=wire.body_str(h, "book", book.ALL),
        restarts=wire.body_int(h, "restarts", 0),
    )


def missing_nodes(pending: list[NodeRecord], expected: dict[str, int]) -> list[str]:
    """The nodes that have not registered: by role and rank where every registered node of that
    role named its rank (launchkit's ``LAUNCHKIT_ROLE_RANK``), else as a count (``1 of 2 workers``)."""
    missing: list[str] = []
    for role, count in expected.items():
        recs = [r for r in pending if r.role == role]
        if len(recs) >= count:
            continue
        hints = {r.rank_hint for r in recs}
        if all(0 <= h < count for h in hints) and len(hints) == len(recs):
            missing += [f"{role} {i}" for i in range(count) if i not in hints]
        else:
            missing.append(f"{count - len(recs)} of {count} {role}s")
    return missing


def assign_ranks(recs: list[NodeRecord], count: int) -> str | None:
    """Give each record a rank in ``0..count-1``: its hint when set (the launcher's rank), else the
    lowest free rank in registration order. Returns an error message for bad or duplicate hints."""
    taken: set[int] = set()
    for r in recs:
        if r.rank_hint >= 0:
            if r.rank_hint >= count or r.rank_hint in taken:
                return f"rank {r.rank_hint} of pid {r.pid} on {r.host} is out of range or taken twice"
            r.rank = r.rank_hint
            taken.add(r.rank)
    free = (i for i in range(count) if i not in taken)
    for r in recs:
        if r.rank_hint < 0:
            r.rank = next(free)
    return None


def epoch_book(
    rec: NodeRecord, roster: Roster, servers: list[NodeRecord], workers: list[NodeRecord], num_servers: int
) -> tuple[wire.Header, bytes]:
    """``rec``'s ``book`` message of ``roster``'s epoch (``workers`` its members in rank order, each
    named, for a node that needs them): the header and its frame."""
    lists = {"servers": [x.listens() for x in servers]}
    if rec.needs == book.ALL:
        lists["workers"] = [{**x.listens(), "name": x.name} for x in workers]
    body = {
        "num_workers": roster.size,
        "num_servers": num_servers,
        "role": rec.role,
        "rank": rec.rank,
        "name": rec.name,
        "epoch": roster.epoch,
        "left": list(roster.left),
        "joined": list(roster.joined),
    }
    return wire.Header(op=protocol.BOOK, body=body), json.dumps(lists, separators=(",", ":")).encode()
