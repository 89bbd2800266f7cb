"""Joining a job: register with the scheduler and receive the address book (servers and workers)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import zmq

from trainer_core.config import NodeConfig
from trainer_core.errors import NodeFailure, StartupTimeout, WireError
from trainer_core.transport import wire
from trainer_core.transport.control import Transport, poll
from trainer_core.transport.shm import host_key


@dataclass(frozen=True)
class ServerInfo:
    """One server in the address book."""

    rank: int
    endpoint: str
    host_key: str
    local: str = ""  # the server's same-host channel (``unixsock``), empty when it has none
    data: str = ""  # the server's TCP data channel (tcpchan.py), empty with PS_ENCRYPT=1


@dataclass(frozen=True)
class Book:
    """What the scheduler tells a node when every node has registered."""

    role: str
    rank: int
    name: str
    num_workers: int
    num_servers: int
    servers: tuple[ServerInfo, ...]


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
) -> tuple[zmq.Socket[Any], Book]:
    """Register (role, rank hint, host, endpoint) and wait, at most ``start_timeout``, for the book."""
    sock = transport.connect_dealer(scheduler_endpoint(cfg))
    body = {
        "role": cfg.role,
        "rank": -1 if cfg.env.role_rank is None else cfg.env.role_rank,
        "host": host,
        "endpoint": endpoint or "",
        "local": local,
        "data": data,
        "host_key": host_key(cfg.env.node_host),
        "pid": os.getpid(),
    }
    transport.send(sock, wire.Header(op=wire.REGISTER, body=body))
    deadline = time.monotonic() + cfg.start_timeout
    while time.monotonic() < deadline:
        if not poll([sock], 0.2):
            continue
        msg = transport.recv(sock, router=False)
        if msg is None:
            continue
        h = msg.header
        if h.op == wire.ABORT or h.op == wire.ERROR:
            raise NodeFailure(
                f"the scheduler refused to start the job: {h.body.get('reason')}", node="scheduler"
            )
        if h.op == wire.BOOK:
            try:
                book = _book(h)
            except (WireError, TypeError, KeyError) as exc:
                raise NodeFailure(f"bad address book from the scheduler: {exc}", node="scheduler") from None
            if cfg.verbose:
                log.info(
                    "joined as %s (%d workers, %d servers)", book.name, book.num_workers, book.num_servers
                )
            return sock, book
    raise StartupTimeout(
        f"{cfg.role}: the scheduler at {scheduler_endpoint(cfg)} did not start the job within "
        f"{cfg.start_timeout:g} s (PS_START_TIMEOUT): not every node registered, or the scheduler is unreachable"
    )


def _book(h: wire.Header) -> Book:
    servers = h.body.get("servers")
    if not isinstance(servers, list):
        raise WireError("servers missing")
    infos = tuple(
        ServerInfo(
            rank=i,
            endpoint=str(s["endpoint"]),
            host_key=str(s["host_key"]),
            local=str(s.get("local", "")),
            data=str(s.get("data", "")),
        )
        for i, s in enumerate(servers)
    )
    return Book(
        role=wire.body_str(h, "role"),
        rank=wire.body_int(h, "rank"),
        name=wire.body_str(h, "name"),
        num_workers=wire.body_int(h, "num_workers"),
        num_servers=wire.body_int(h, "num_servers"),
        servers=infos,
    )
