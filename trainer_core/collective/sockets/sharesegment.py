"""Setting up the shared-memory segment of the workers of one host (``primitives.hostsegment``), for ``NetLinks``.

Once the channels are up, the host's lowest rank (the leader) makes the segment and sends its
descriptor to every other rank of the host in a ``coll_shm`` message, over their same-host
channel, authenticated as every channel is. Where one of those channels is not the same-host one
(``PS_SHM=0``, or it fell back to TCP), it sends ``{"n": 0}`` instead, and the host's ranks all go
without: they decide together, so every rank takes the same algorithms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from trainer_core.config import NodeConfig, StallPolicy
from trainer_core.errors import KVError, WireError
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel

from ..primitives.hostsegment import MAX_LOCAL, Local, Segment
from . import protocol

Health = Callable[[], None]


class Offer:
    """What a rank's leader sent: ``None`` until it came, then a ``Segment`` or ``False``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.value: Segment | bool | None = None

    def take(self, h: wire.Header, ch: Channel, size: int) -> None:
        """The receiving thread: a ``coll_shm`` from the leader."""
        n = wire.body_int(h, "n")
        if n not in (0, size):
            raise WireError(f"a segment for {n} local ranks, on a host with {size}")
        value: Segment | bool = Segment(ch.take_fds(1)[0], size) if n else False
        with self.cond:
            if self.value is not None:
                if isinstance(value, Segment):
                    value.close()
                raise WireError("a second segment")
            self.value = value
            self.cond.notify_all()

    def wait(self, bound_s: float, health: Health, leader: int) -> Segment | bool:
        deadline = time.monotonic() + bound_s
        with self.cond:
            while self.value is None:
                if time.monotonic() > deadline:
                    raise KVError(f"collective: rank {leader} sent no shared-memory segment in {bound_s:g} s")
                self.cond.wait(0.1)
                health()
            return self.value


def share(
    rank: int,
    members: list[int],
    channels: dict[int, Channel],
    use_shm: bool,
    offer: Offer,
    bound_s: float,
    health: Health,
) -> Segment | None:
    """This rank's segment of its host (``members``: the host's ranks, in order), or None."""
    if len(members) <= 1 or len(members) > MAX_LOCAL:
        return None
    leader = members[0]
    if rank != leader:
        got = offer.wait(bound_s, health, leader)
        return got if isinstance(got, Segment) else None
    peers = members[1:]
    missing = [p for p in peers if p not in channels]
    if missing:
        raise KVError(f"collective: rank {rank} has no channel to ranks {missing} of its host (they left)")
    if not (use_shm and all(not channels[p].caps.frames for p in peers)):
        for p in peers:
            channels[p].post(protocol.shm(0))
        return None
    seg = Segment.create(len(members))
    try:
        for p in peers:
            channels[p].send(protocol.shm(len(members)), fds=[seg.fd])
    except BaseException:
        seg.close()
        raise
    return seg


class Owner(Protocol):
    """What ``setup`` asks of its links (``netlinks.NetLinks``)."""

    @property
    def rank(self) -> int: ...

    def health(self) -> None: ...

    def where(self, peer: int) -> str: ...

    def warn(self, message: str) -> None: ...

    stall: StallPolicy
    bound_s: float | None


def setup(
    links: Owner,
    members: list[int],
    channels: dict[int, Channel],
    offer: Offer,
    cfg: NodeConfig,
) -> Local | None:
    """``share``, and this rank's ``Local`` on the segment (None: none)."""
    seg = share(links.rank, members, channels, cfg.use_shm, offer, cfg.start_timeout, links.health)
    if seg is None:
        return None
    i = members.index(links.rank)
    return Local(
        seg, i, members, links.health, links.where, links.bound_s, stall=links.stall, warn=links.warn
    )
