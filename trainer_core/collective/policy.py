"""Which allreduce algorithm runs, by message size and topology.

The thresholds are named fields of ``Thresholds`` so that a group can be given others; the
defaults were measured on one host with 2 cores, W = 2 and 4 (docs/collectives.md, "Choice and
thresholds"): where every rank shares the host and its segment, the shared-memory allreduce at
every size; over sockets the ring from 2 MiB, recursive doubling below.
"""

from __future__ import annotations

from dataclasses import dataclass

from .algorithms.hierarchical import Topology
from .algorithms.ring import SEGMENT_BYTES

RECURSIVE_DOUBLING = "recursive_doubling"
RING = "ring"
HIERARCHICAL = "hierarchical"
SHM = "shm"
ALGORITHMS = (RECURSIVE_DOUBLING, RING, HIERARCHICAL, SHM)


@dataclass(frozen=True)
class Thresholds:
    """When each algorithm is used (defaults measured: docs/collectives.md)."""

    #: buffers of at least this many bytes go round the ring; smaller ones by recursive doubling.
    ring_min_bytes: int = 2 * 1024 * 1024
    #: the hierarchical path is taken from this many bytes up, when some host has several ranks
    #: and there are several hosts.
    hierarchical_min_bytes: int = 0
    #: through the host's shared memory, buffers of at least this many bytes are reduced a block
    #: per local rank (one more step); smaller ones by every rank whole ...
    shm_split_min_bytes: int = 1024 * 1024
    #: ... and this many where the host has two ranks (each then reads just one other slot).
    shm_split_min_bytes_2: int = 16 * 1024 * 1024
    #: the hierarchical path through shared memory pipelines the host's phases with the leaders'
    #: allreduce in pieces of about this many bytes (at most 14), where it makes two or more.
    pipeline_piece_bytes: int = 4 * 1024 * 1024
    #: ring and broadcast segments (the pipelining unit).
    segment_bytes: int = SEGMENT_BYTES
    #: ``grouped_allreduce`` packs arrays of one dtype into buckets of at most this many bytes
    #: (0: each alone; ``Group.fuse`` sets it, with Horovod's HOROVOD_FUSION_THRESHOLD).
    fusion_bytes: int = 64 * 1024 * 1024
    #: force one algorithm (one of ``ALGORITHMS``), or None to choose by size and topology.
    force: str | None = None

    def __post_init__(self) -> None:
        if self.force is not None and self.force not in ALGORITHMS:
            raise ValueError(f"collective algorithm must be one of {ALGORITHMS}, not {self.force!r}")
        names = (
            "ring_min_bytes",
            "hierarchical_min_bytes",
            "shm_split_min_bytes",
            "segment_bytes",
            "fusion_bytes",
            "pipeline_piece_bytes",
        )
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or value < (
                1 if name in ("segment_bytes", "pipeline_piece_bytes") else 0
            ):
                raise ValueError(f"threshold {name} must be a non-negative integer of bytes, not {value!r}")


def flat_algorithm(nbytes: int, th: Thresholds) -> str:
    """Ring or recursive doubling, by size alone."""
    return RING if nbytes >= th.ring_min_bytes else RECURSIVE_DOUBLING


def shm_split(nbytes: int, local_size: int, th: Thresholds) -> bool:
    """Whether the shared-memory allreduce of ``nbytes`` on a host of ``local_size`` ranks reduces
    a block per rank (else every rank the whole buffer)."""
    return nbytes >= (th.shm_split_min_bytes_2 if local_size == 2 else th.shm_split_min_bytes)


def pipeline_pieces(nbytes: int, th: Thresholds, most: int) -> int:
    """How many pieces the hierarchical allreduce through shared memory pipelines ``nbytes`` in
    (1: not pipelined)."""
    return max(1, min(most, nbytes // th.pipeline_piece_bytes))


def choose(nbytes: int, topo: Topology | None, th: Thresholds, shm: bool = False) -> str:
    """The allreduce algorithm for a buffer of ``nbytes`` on ``topo`` (None: one rank per host);
    ``shm``: this rank's host has a shared-memory segment for its ranks."""
    if th.force is not None:
        if th.force == HIERARCHICAL and topo is None:
            raise ValueError("the hierarchical algorithm needs the rank -> host map")
        if th.force == SHM and not (shm and topo is not None and topo.nhosts == 1):
            raise ValueError("the shm algorithm needs every rank on one host, with its shared-memory segment")
        return th.force
    if shm and topo is not None and topo.nhosts == 1:
        return SHM
    if topo is not None and topo.nhosts > 1 and topo.max_local > 1 and nbytes >= th.hierarchical_min_bytes:
        return HIERARCHICAL
    return flat_algorithm(nbytes, th)
