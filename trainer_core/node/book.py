"""Joining a job: register with the scheduler and receive the book of every node of the job.

Every node registers what it listens on (a ZeroMQ endpoint, a same-host channel, a TCP data
channel) and which part of the book it needs: every node (``ALL``: a worker of the collectives,
which links to every other worker, ``node.reach``), or the servers only (``SERVERS``: the parameter
server's workers, which reach the servers only, and the servers, which reach nobody). The book
lists those with where each listens.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from dmlc_env.ending import say_peer_failed
from trainer_core.config import NodeConfig
from trainer_core.errors import NodeFailure, StartupTimeout, WireError
from trainer_core.node import protocol
from trainer_core.transport import wire
from trainer_core.transport.channel import Received
from trainer_core.transport.control import Transport, ZmqChannel
from trainer_core.transport.host import machine_identity

#: what a node asks the book for (its registration's ``book``; absent: ``ALL``)
ALL, SERVERS = "all", "servers"
NEEDS = (ALL, SERVERS)


@dataclass(frozen=True)
class NodeInfo:
    """One node (a server or a worker) in the book: where it listens."""

    rank: int
    endpoint: str  # its ZeroMQ endpoint, empty when it has none (a worker)
    host_key: str  # its ``machine_identity``: equal to another node's, they share memory
    local: str = ""  # its same-host channel (``transport/unix.py``), empty when it has none
    data: str = ""  # its TCP data channel (``transport/tcp.py``), empty with PS_ENCRYPT=1
    name: str = ""  # its name (``worker 3``) in an elastic job's book, where it may differ from the rank


@dataclass(frozen=True)
class Book:
    """What the scheduler tells a node when every node has registered."""

    role: str
    rank: int
    name: str
    num_workers: int
    num_servers: int
    servers: tuple[NodeInfo, ...]
    workers: tuple[NodeInfo, ...] = ()  # (empty for a node that asked for the servers only)
    #: the membership's epoch (``node/membership.py``): 0 at the start, + 1 at each change of an
    #: elastic job, with the names of the workers that ``left`` and ``joined`` at this change
    epoch: int = 0
    left: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()

    def worker_name(self, rank: int) -> str:
        """The name of the worker of ``rank`` in this book (``worker RANK`` unless the book says)."""
        listed = self.workers[rank].name if 0 <= rank < len(self.workers) else ""
        return listed or f"worker {rank}"


def scheduler_endpoint(cfg: NodeConfig) -> str:
    return f"tcp://{cfg.env.root_uri}:{cfg.env.root_port}"


def join(
    transport: Transport,
    cfg: NodeConfig,
    host: str,
    endpoint: str | None,
    log: logging.Logger,
    local: str = "",
    data: str = "",
    needs: str = ALL,
) -> tuple[ZmqChannel, Book]:
    """Register (role, rank hint, host, endpoint, the part of the book it ``needs``) and wait, at
    most ``start_timeout``, for the book; returns the channel to the scheduler and the book."""
    sched = transport.connect(scheduler_endpoint(cfg))
    body = {
        "role": cfg.role,
        "rank": -1 if cfg.env.role_rank is None else cfg.env.role_rank,
        "host": host,
        "endpoint": endpoint or "",
        "local": local,
        "data": data,
        "host_key": machine_identity(cfg.env.node_host),
        "pid": os.getpid(),
        "book": needs,
    }
    if cfg.env.elastic is not None and cfg.role == "worker":  # which restart of the workers it is
        body["restarts"] = cfg.env.worker_restarts or 0
    sched.send(wire.Header(op=protocol.REGISTER, body=body))
    waited = cfg.start_timeout + scheduler_first(cfg.start_timeout)
    deadline = time.monotonic() + waited
    inbox: list[Received] = []
    while time.monotonic() < deadline:
        if not inbox and sched.wait(0.2):
            sched.receive(inbox.append)
        if not inbox:
            continue
        msg = inbox.pop(0)
        h = msg.header
        if h.op == protocol.ABORT or h.op == protocol.ERROR:
            if h.op == protocol.ABORT:  # for the launcher: another node failed (an ERROR is about this one)
                node = h.body.get("node")
                say_peer_failed(node if isinstance(node, str) else None)
            raise NodeFailure(
                f"the scheduler refused to start the job: {h.body.get('reason')}", node="scheduler"
            )
        if h.op == protocol.BOOK:
            try:
                book = _book(h, msg.frames)
            except (WireError, TypeError, KeyError, ValueError) as exc:
                raise NodeFailure(f"bad address book from the scheduler: {exc}", node="scheduler") from None
            if cfg.verbose:
                log.info(
                    "joined as %s (%d workers, %d servers)", book.name, book.num_workers, book.num_servers
                )
            return sched, book
    raise StartupTimeout(
        f"{cfg.role}: the scheduler at {scheduler_endpoint(cfg)} did not start the job within "
        f"{waited:g} s (PS_START_TIMEOUT={cfg.start_timeout:g} + {waited - cfg.start_timeout:g} s): not every "
        "node registered, or the scheduler is unreachable"
    )


def scheduler_first(start_timeout: float) -> float:
    """How much longer than ``PS_START_TIMEOUT`` a node waits for the book: the scheduler, which
    knows which nodes never registered, ends a start-up that timed out first and names them."""
    return min(2.0, start_timeout)


def _nodes(lists: dict[str, Any], field: str, required: bool) -> tuple[NodeInfo, ...]:
    listed = lists.get(field)
    if listed is None and not required:
        return ()
    if not isinstance(listed, list):
        raise WireError(f"{field} missing")
    return tuple(
        NodeInfo(
            rank=i,
            endpoint=str(s["endpoint"]),
            host_key=str(s["host_key"]),
            local=str(s.get("local", "")),
            data=str(s.get("data", "")),
            name=str(s.get("name", "")),
        )
        for i, s in enumerate(listed)
    )


def _lists(h: wire.Header, frames: list[Any]) -> dict[str, Any]:
    """The servers and workers: in the book's frame (JSON, one encoding for every node), or in
    the header's body (a scheduler of before the frame)."""
    if "servers" in h.body or not frames:
        return h.body
    lists = json.loads(bytes(frames[0].buffer))
    if not isinstance(lists, dict):
        raise WireError("the book's frame is not a JSON object")
    return lists


def _names(h: wire.Header, field: str) -> tuple[str, ...]:
    listed = h.body.get(field, [])
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        raise WireError(f"{field} must be a list of node names")
    return tuple(listed)


def parse_book(h: wire.Header, frames: list[Any] | None = None) -> Book:
    """The book of a ``BOOK`` message (``WireError`` and friends when it is malformed)."""
    return _book(h, frames)


def _book(h: wire.Header, frames: list[Any] | None = None) -> Book:
    lists = _lists(h, frames or [])
    return Book(
        role=wire.body_str(h, "role"),
        rank=wire.body_int(h, "rank"),
        name=wire.body_str(h, "name"),
        num_workers=wire.body_int(h, "num_workers"),
        num_servers=wire.body_int(h, "num_servers"),
        servers=_nodes(lists, "servers", True),
        workers=_nodes(lists, "workers", False),
        epoch=wire.body_int(h, "epoch", 0),
        left=_names(h, "left"),
        joined=_names(h, "joined"),
    )
