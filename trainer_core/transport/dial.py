"""The one channel factory: from where a peer listens (its entry of the book) to the channels
that reach it (``Link``).

Choosing is pure (``same_host``, ``choose``); ``open_link`` opens what they chose. A peer on
this machine (equal ``machine_identity``, ``PS_SHM`` not ``0``) that publishes a same-host channel
is reached on it first (headers only, arrays in shared memory); if that cannot be connected,
the peer is treated as remote (e.g. another network namespace under the same host name). The
channel that carries data frames (``framed``) is the peer's TCP data stream, or its ZeroMQ
endpoint (its CURVE ROUTER with ``PS_ENCRYPT=1``) where a ZeroMQ ``Transport`` is at hand and a
same-host channel was opened or no data stream is published, or else the same-host channel
itself. A caller that needs no data frames (``frames=False``: the collectives, whose bytes
travel in a descriptor beside the header) takes the same-host channel alone when it has one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.transport.channel import Channel, Trace
from trainer_core.transport.control import Transport
from trainer_core.transport.host import machine_identity
from trainer_core.transport.tcp import TcpChannel
from trainer_core.transport.unix import UnixChannel

#: the channel that carries data frames to a peer
Kind = Literal["tcp", "zmq", "local"]


class BookEntry(Protocol):
    """A peer's entry of the book, where it listens (``node.book.NodeInfo`` is one); an address
    is empty when it has none."""

    @property
    def endpoint(self) -> str: ...  # its ZeroMQ endpoint

    @property
    def host_key(self) -> str: ...  # its ``machine_identity``

    @property
    def local(self) -> str: ...  # its same-host channel (``unix.py``)

    @property
    def data(self) -> str: ...  # its TCP data channel (``tcp.py``)


@dataclass(frozen=True)
class Link:
    """The channels to one peer: ``framed`` carries data frames; ``fast`` is the channel for
    messages without frames (the same-host channel when there is one, else ``framed`` itself)."""

    framed: Channel
    fast: Channel

    @property
    def shares_memory(self) -> bool:
        return self.fast.caps.shared_memory

    def channels(self) -> list[Channel]:
        return [self.fast] if self.fast is self.framed else [self.fast, self.framed]


def same_host(peer: BookEntry, use_shm: bool, mine: str) -> bool:
    """Whether to try ``peer``'s same-host channel first (``mine``: this machine's identity)."""
    return use_shm and bool(peer.local) and peer.host_key == mine


def choose(peer: BookEntry, shared: bool, frames: bool = True, zmq: bool = True) -> Kind | None:
    """The channel for ``peer``'s data frames, once its same-host channel is open (``shared``) or
    not; ``zmq``: a ZeroMQ transport is at hand; None: ``peer`` publishes nothing to reach it on."""
    if shared and not frames:
        return "local"
    if peer.data and (not shared or not peer.endpoint):
        return "tcp"
    if peer.endpoint and zmq:
        return "zmq"
    return "local" if shared else None


def open_link(
    peer: BookEntry,
    cfg: NodeConfig,
    name: str,
    log: logging.Logger,
    trace: Trace,
    transport: Transport | None = None,
    frames: bool = True,
) -> Link:
    """Open the channels to ``peer`` (``name``: ``server 0``, in the messages) that ``same_host``
    and ``choose`` pick (``transport``: the ZeroMQ one, if any); ``KVError`` when none can be
    chosen or connected (closing what was opened)."""
    local: Channel | None = None
    if same_host(peer, cfg.use_shm, machine_identity(cfg.env.node_host)):
        try:
            local = UnixChannel.connect(peer.local, cfg.secret, trace)
        except KVError as exc:
            log.warning("%s: no same-host channel (%s); using TCP", name, exc)
    kind = choose(peer, local is not None, frames, transport is not None)
    try:
        framed: Channel
        if kind == "tcp":
            framed = TcpChannel.connect(peer.data, cfg.secret, trace)
        elif kind == "zmq":
            assert transport is not None  # (``choose`` picks zmq only with one)
            framed = transport.connect(peer.endpoint)
        elif kind == "local" and local is not None:
            framed = local  # headers only
        else:
            raise KVError(
                f"{name} publishes no channel to reach it on (the TCP data channel is off with PS_ENCRYPT=1)"
            )
    except BaseException:
        if local is not None:
            local.close()
        raise
    return Link(framed=framed, fast=local or framed)
