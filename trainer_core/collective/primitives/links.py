"""The point-to-point interface the collective algorithms are written against.

An algorithm sees one ``Links``: this process's ``rank``, the group's ``size``, and two
non-blocking calls, ``send(peer, tag, buffer)`` and ``recv(peer, tag, out)``, each returning a
``Handle`` to wait on. Because neither call blocks, a rank can post its send to one neighbour and
its receive from the other before waiting on either, which is what keeps a ring of synchronous
(rendezvous) channels from deadlocking. A buffer passed to ``send`` must not change until its
handle is done; ``out`` is filled with exactly as many bytes as the matching send carried (a
different length is an error that names the peer).

Messages between one pair with one tag arrive in the order they were sent. ``Ctx`` turns an
operation's sequence number, a phase and a step into the tag, so that the messages of different
operations and phases never match each other.

The in-process implementation for tests is ``fabric.Fabric``; the one between a job's worker
processes, over the node layer's channels, is ``sockets.netlinks.NetLinks`` (docs/collectives.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from trainer_core.errors import NodeFailure

#: Default seconds a wait lasts before the peer is declared unresponsive.
DEFAULT_TIMEOUT = 30.0


class Handle(Protocol):
    """A posted send or receive."""

    def wait(self, timeout: float | None = None) -> None:
        """Return once the operation completed; raise ``PeerTimeout`` (naming the peer) after
        ``timeout`` seconds (``None``: the links' own timeout), or the error that ended it."""
        ...

    def done(self) -> bool:
        """Whether the operation completed (successfully or not) without waiting."""
        ...


class Links(Protocol):
    """One rank's point-to-point connections to the other ranks of a group."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def send(self, peer: int, tag: int, buffer: np.ndarray) -> Handle:
        """Post the bytes of the C-contiguous ``buffer`` to ``peer``; returns at once."""
        ...

    def recv(self, peer: int, tag: int, out: np.ndarray) -> Handle:
        """Post a receive from ``peer`` into the C-contiguous ``out``; returns at once."""
        ...


class LinkError(NodeFailure):
    """A point-to-point operation failed; ``node`` names the peer (``rank 3``)."""

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message, node=f"rank {peer}")
        self.peer = peer


class PeerTimeout(LinkError):
    """A peer did not send (or take) a message within the timeout."""


class PeerShutDown(LinkError):
    """A peer closed its group (it shut down) before the operation this rank waits in."""


def wait_all(handles: Sequence[Handle]) -> None:
    """Wait for every handle, in order (the first error is raised)."""
    for h in handles:
        h.wait()


class SubLinks:
    """The links of a subgroup: ranks ``0..len(members)-1`` stand for the global ranks ``members``.
    ``space`` (0..``MAX_SPACES - 1``): the tag namespace of a subgroup with its own operation
    numbering (a process set's), set in every tag it sends or receives, so that its messages never
    match those of the whole group (space 0) or of another subgroup; a subgroup that numbers its
    operations with its parent's (the hierarchical path's leaders) keeps 0."""

    def __init__(self, links: Links, members: Sequence[int], space: int = 0) -> None:
        self.members = tuple(members)
        if links.rank not in self.members:
            raise ValueError(f"rank {links.rank} is not in the subgroup {self.members}")
        if not 0 <= space < MAX_SPACES:
            raise ValueError(f"tag space {space} out of 0..{MAX_SPACES - 1}")
        self.links = links
        self.space = space
        self._bits = space << _SPACE_SHIFT
        self._rank = self.members.index(links.rank)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return len(self.members)

    def send(self, peer: int, tag: int, buffer: np.ndarray) -> Handle:
        return self.links.send(self.members[peer], tag | self._bits, buffer)

    def recv(self, peer: int, tag: int, out: np.ndarray) -> Handle:
        return self.links.recv(self.members[peer], tag | self._bits, out)

    def drop(self, seq: int, space: int = 0) -> None:
        """Forget the data messages of this subgroup's operation ``seq`` (``NetLinks.drop``)."""
        drop = getattr(self.links, "drop", None)
        if drop is not None:
            drop(seq, self.space or space)


# tag layout (64 bits): tag space (4 bits) | operation sequence (16) | 3 nested phases of 4 bits |
# step (12) | segment (20). The space is a process set's (``SubLinks``; 0: the whole group).
_SEG_BITS, _STEP_BITS, _PHASE_BITS, _MAX_DEPTH, _SEQ_BITS, _SPACE_BITS = 20, 12, 4, 3, 16, 4
_PHASE_SHIFT = _SEG_BITS + _STEP_BITS
_SEQ_SHIFT = _PHASE_SHIFT + _PHASE_BITS * _MAX_DEPTH
_SPACE_SHIFT = _SEQ_SHIFT + _SEQ_BITS
MAX_SEGMENTS = 1 << _SEG_BITS
MAX_STEPS = 1 << _STEP_BITS
#: tag spaces: the whole group's (0) and up to ``MAX_SPACES - 1`` process sets'
MAX_SPACES = 1 << _SPACE_BITS
#: operations a group numbers before its tags repeat
SEQ_WRAP = 1 << _SEQ_BITS
#: the step no algorithm uses: the operation's control messages (the negotiation's, ``control``)
CONTROL_STEP = MAX_STEPS - 1
_CONTROL_BITS = CONTROL_STEP << _SEG_BITS


def data_op(tag: int) -> int | None:
    """The operation (its space and sequence bits) a data message's ``tag`` belongs to; None for
    the operation's control messages (``Ctx.control``), which are not data."""
    if ((tag & ~((1 << _SEQ_SHIFT) - 1)) | _CONTROL_BITS) == (tag & ~((1 << _SEG_BITS) - 1)):
        return None
    return tag >> _SEQ_SHIFT


def op_bits(seq: int, space: int = 0) -> int:
    """The space and sequence bits the tags of the ``seq``-th operation of tag space ``space``
    carry (``data_op``)."""
    return (space << _SEQ_BITS) | (seq % SEQ_WRAP)


def space_of(tag: int) -> int:
    """The tag space (``SubLinks``) of ``tag``."""
    return tag >> _SPACE_SHIFT


class Scratch:
    """A group's working buffers, kept from one operation to the next (one operation runs at a
    time), so that an algorithm's temporary arrays are not allocated, and their pages not faulted
    in, on every operation."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, key: str, dtype: np.dtype, n: int) -> np.ndarray:
        """``n`` elements of ``dtype`` (contents undefined), the same memory as the last ``key``."""
        nbytes = n * dtype.itemsize
        buf = self._bufs.get(key)
        if buf is None or buf.size < nbytes:
            buf = self._bufs[key] = np.empty(max(nbytes, 64), np.uint8)
        return buf[:nbytes].view(dtype)


@dataclass(frozen=True)
class Ctx:
    """The links an algorithm runs on, the tag namespace of its operation and phase, and its
    group's ``Scratch`` (None: fresh arrays)."""

    links: Links
    base: int = 0
    depth: int = 0
    scratch: Scratch | None = None

    @classmethod
    def for_op(cls, links: Links, seq: int, scratch: Scratch | None = None) -> Ctx:
        """The context of the ``seq``-th operation of a group (every rank numbers them alike)."""
        return cls(links, op_bits(seq) << _SEQ_SHIFT, scratch=scratch)

    def buffer(self, key: str, dtype: np.dtype, n: int) -> np.ndarray:
        """A working array of ``n`` elements (see ``Scratch``; ``key`` names its use)."""
        return np.empty(n, dtype) if self.scratch is None else self.scratch.get(key, np.dtype(dtype), n)

    def phase(self, p: int) -> Ctx:
        """A nested namespace for one phase (0..14) of the operation (phases nest three deep: a fused bucket, the hierarchical part, the ring's half)."""
        if not 0 <= p < (1 << _PHASE_BITS) - 1 or self.depth >= _MAX_DEPTH:
            raise ValueError(f"phase {p} at depth {self.depth}: out of the tag space")
        shift = _PHASE_SHIFT + _PHASE_BITS * self.depth
        return replace(self, base=self.base | ((p + 1) << shift), depth=self.depth + 1)

    def on(self, links: Links) -> Ctx:
        """The same namespace on other links (a subgroup's)."""
        return replace(self, links=links)

    def tag(self, step: int, seg: int = 0) -> int:
        if not (0 <= step < CONTROL_STEP and 0 <= seg < MAX_SEGMENTS):
            raise ValueError(f"step {step} / segment {seg} out of the tag space")
        return self.base | (step << _SEG_BITS) | seg

    def control(self, seg: int) -> int:
        """The tag of the operation's control message ``seg`` (the ranks agreeing on what it is:
        ``negotiator``), apart from every data message's."""
        return self.base | (CONTROL_STEP << _SEG_BITS) | seg

    @property
    def rank(self) -> int:
        return self.links.rank

    @property
    def size(self) -> int:
        return self.links.size
