"""Which channels reach another node of the book (``Link``), and opening them (``open_links``).

Every node is reached on a channel that carries data frames (``framed``): its TCP data stream,
or with ``PS_ENCRYPT=1`` (or when it publishes none) its CURVE ROUTER. A node on this machine
(equal ``machine_identity``, ``PS_SHM`` not ``0``) is also reached on its same-host channel
(``fast``: headers only, arrays in shared memory); if that cannot be connected, the node is
treated as remote (e.g. another network namespace under the same host name). A worker reaches
the servers this way (``ps.routes``) and, as well, the other workers (they listen too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.node.book import NodeInfo
from trainer_core.transport.channel import Channel
from trainer_core.transport.control import Transport
from trainer_core.transport.host import machine_identity
from trainer_core.transport.tcp import TcpChannel
from trainer_core.transport.unix import UnixChannel


@dataclass(frozen=True)
class Link:
    """The channels to one node: ``framed`` carries data frames; ``fast`` is the channel for
    messages without frames (the same-host channel when there is one, else ``framed`` itself)."""

    framed: Channel
    fast: Channel

    @property
    def shares_memory(self) -> bool:
        return self.fast.caps.shared_memory

    def channels(self) -> list[Channel]:
        return [self.fast] if self.fast is self.framed else [self.fast, self.framed]


def open_links(
    cfg: NodeConfig, nodes: tuple[NodeInfo, ...], transport: Transport, log: logging.Logger, role: str
) -> list[Link]:
    """Connect to every node of ``nodes`` (the book's ``role`` nodes; closing what was opened if one fails)."""
    mine = machine_identity(cfg.env.node_host)
    trace = transport.trace
    links: list[Link] = []
    try:
        for s in nodes:
            local: Channel | None = None
            if cfg.use_shm and s.host_key == mine and s.local:
                try:
                    local = UnixChannel.connect(s.local, cfg.secret, trace)
                except KVError as exc:
                    log.warning("%s %d: no same-host channel (%s); using TCP", role, s.rank, exc)
            framed: Channel
            if s.data and (local is None or not s.endpoint):  # (a worker has no ZeroMQ endpoint)
                framed = TcpChannel.connect(s.data, cfg.secret, trace)
            elif s.endpoint:
                framed = transport.connect(s.endpoint)
            elif local is not None:
                framed = local  # headers only
            else:
                raise KVError(f"{role} {s.rank} publishes no channel to reach it on")
            links.append(Link(framed=framed, fast=local or framed))
    except BaseException:
        for link in links:
            for ch in link.channels():
                ch.close()
        raise
    return links
