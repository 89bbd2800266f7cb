"""Hierarchical allreduce for several ranks per host: reduce within each host to its leader, an
allreduce among the leaders, and a broadcast within each host.

``Topology`` is the rank -> host map. A host's leader is its lowest rank. Within a host the leader
reduces its ranks' buffers in rank order (``tree.reduce_to``); the leaders run the ring or
recursive doubling (chosen by the caller); the leader then broadcasts down a binomial tree of its
host. This is the form on the links, for hosts without a shared-memory segment; where a host has
one, ``shmreduce`` runs the host's part through it instead (``Group`` chooses). Every element is thus reduced in one fixed
order and the leaders' result is copied to everyone: every rank ends bit-identical. Across hosts
only one buffer per host travels, instead of one per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..primitives.links import Ctx, SubLinks
from ..primitives.reduce import ReduceSpec
from . import tree


@dataclass(frozen=True)
class Topology:
    """The host of every rank (``hosts[r]``), in rank order."""

    hosts: tuple[str, ...]

    @classmethod
    def of(cls, hosts: Sequence[str]) -> Topology:
        return cls(tuple(str(h) for h in hosts))

    def local(self, rank: int) -> tuple[int, ...]:
        """The ranks on ``rank``'s host, in order (the first is the leader)."""
        return tuple(r for r, h in enumerate(self.hosts) if h == self.hosts[rank])

    def leaders(self) -> tuple[int, ...]:
        """The lowest rank of each host, in rank order."""
        seen: dict[str, int] = {}
        for r, h in enumerate(self.hosts):
            seen.setdefault(h, r)
        return tuple(sorted(seen.values()))

    @property
    def nhosts(self) -> int:
        return len(set(self.hosts))

    @property
    def max_local(self) -> int:
        return max((self.hosts.count(h) for h in set(self.hosts)), default=0)


Allreduce = Callable[[Ctx, np.ndarray, ReduceSpec], None]


def allreduce(
    ctx: Ctx, buf: np.ndarray, spec: ReduceSpec, topo: Topology, leaders_allreduce: Allreduce
) -> None:
    """In place: ``buf`` becomes the reduction over all ranks, bit-identical on each."""
    if len(topo.hosts) != ctx.size:
        raise ValueError(f"topology of {len(topo.hosts)} ranks for a group of {ctx.size}")
    if ctx.size == 1 or buf.size == 0:
        return
    local = SubLinks(ctx.links, topo.local(ctx.rank))
    tree.reduce_to(ctx.phase(0).on(local), buf, spec, root=0)
    if local.rank == 0:
        leaders = SubLinks(ctx.links, topo.leaders())
        leaders_allreduce(ctx.phase(1).on(leaders), buf, spec)
    tree.broadcast(ctx.phase(2).on(local), buf, root=0)
