"""Collectives among a job's workers: allreduce, broadcast, allgather, reduce_scatter, barrier.

>>> group = Group(links)                    # links: this rank's point-to-point ``Links``
>>> total = group.allreduce(grad, op="mean")
>>> work = group.allreduce_async(grad)      # ... compute ...; work.wait()

The algorithms (``algorithms/``) are written against the small point-to-point interface of
``links``; ``fabric`` links N ranks in one process for tests; ``netlinks`` links the worker
processes of a job over the node layer's sockets, and ``join()`` makes the group of the job's
workers from the environment (``job``): see docs/collectives.md.
"""

from __future__ import annotations

from .algorithms.hierarchical import Topology
from .compressed import ErrorFeedback
from .executor import CollectiveClosed, Work
from .group import Group
from .job import JobGroup, join
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
    "JobGroup",
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
    "join",
    "spec_for",
]
