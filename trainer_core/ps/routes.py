"""Which channels reach each server from a worker (``Route``), and opening them (``open_routes``).

Every server is reached on a channel that carries data frames (``framed``): its TCP data stream,
or with ``PS_ENCRYPT=1`` (or when it publishes none) its CURVE ROUTER. A server on this machine
(equal ``machine_identity``, ``PS_SHM`` not ``0``) is also reached on its same-host channel
(``fast``: headers only, arrays in shared memory); if that cannot be connected, the server is
treated as remote (e.g. another network namespace under the same host name).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.ps.membership import Book
from trainer_core.transport.channel import Channel
from trainer_core.transport.control import Transport
from trainer_core.transport.host import machine_identity
from trainer_core.transport.tcp import TcpChannel
from trainer_core.transport.unix import UnixChannel


@dataclass(frozen=True)
class Route:
    """The channels to one server: ``framed`` carries data frames; ``fast`` is the channel for
    requests without frames (the same-host channel when there is one, else ``framed`` itself)."""

    framed: Channel
    fast: Channel

    @property
    def shares_memory(self) -> bool:
        return self.fast.caps.shared_memory

    def channels(self) -> list[Channel]:
        return [self.fast] if self.fast is self.framed else [self.fast, self.framed]


def open_routes(cfg: NodeConfig, book: Book, transport: Transport, log: logging.Logger) -> list[Route]:
    """Connect to every server of ``book`` (closing what was opened if one fails)."""
    mine = machine_identity(cfg.env.node_host)
    trace = transport.trace
    routes: list[Route] = []
    try:
        for i, s in enumerate(book.servers):
            local: Channel | None = None
            if cfg.use_shm and s.host_key == mine and s.local:
                try:
                    local = UnixChannel.connect(s.local, cfg.secret, trace)
                except KVError as exc:
                    log.warning("server %d: no same-host channel (%s); using TCP", i, exc)
            framed: Channel = (
                TcpChannel.connect(s.data, cfg.secret, trace)
                if s.data and local is None
                else transport.connect(s.endpoint)
            )
            routes.append(Route(framed=framed, fast=local or framed))
    except BaseException:
        for r in routes:
            for ch in r.channels():
                ch.close()
        raise
    return routes
