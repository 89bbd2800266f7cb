"""Collectives among a job's workers: allreduce, broadcast, allgather, reduce_scatter, barrier.

>>> group = Group(links)                    # links: this rank's point-to-point ``Links``
>>> total = group.allreduce(grad, op="mean")
>>> work = group.allreduce_async(grad)      # ... compute ...; work.wait()

The algorithms (``algorithms/``) are written against the small point-to-point interface of
``links``; ``fabric`` links N ranks in one process for tests. The wiring to the job's sockets (a
default group made from the environment) comes with the node layer: see docs/collectives.md.
"""

from __future__ import annotations

from .algorithms.hierarchical import Topology
from .compressed import ErrorFeedback
from .executor import CollectiveClosed, Work
from .group import Group
from .links import Ctx, Handle, LinkError, Links, PeerTimeout, SubLinks
from .policy import ALGORITHMS, Thresholds, choose
from .reduce import BFLOAT16, OPS, ReduceSpec, bf16_to_f32, f32_to_bf16, spec_for

__all__ = [
    "ALGORITHMS",
    "BFLOAT16",
    "OPS",
    "CollectiveClosed",
    "Ctx",
    "ErrorFeedback",
    "Group",
    "Handle",
    "LinkError",
    "Links",
    "PeerTimeout",
    "ReduceSpec",
    "SubLinks",
    "Thresholds",
    "Topology",
    "Work",
    "bf16_to_f32",
    "choose",
    "f32_to_bf16",
    "spec_for",
]
