"""The hierarchical allreduce through a host's shared memory, pipelined by pieces: the host's
local reduce of piece ``j+1`` and the copy back of piece ``j-1`` run while the leaders' allreduce
of piece ``j`` is on the wire (``shmreduce`` without it runs the three phases one after the other).

The buffer is cut into ``pieces`` contiguous pieces (``ring.blocks``), each reduced a block per
local rank as ``shmreduce``'s split form does. The operation takes ``pieces + 1`` operations' worth
of the host's counter steps (``Local.ops``), from ``base = 3 * ops``:

* ``base + 1 + 2j``: this rank copied piece ``j`` of its input into its slot (everyone waits for
  all, then reduces its block of the piece, slots in rank order, into its own slot);
* ``base + 2 + 2j``: this rank reduced its block of piece ``j``; the leader waits for all, gathers
  the piece's blocks into its output and hands the piece to its helper thread, which runs the
  leaders' allreduce of it (``cross(j, view)``, the pieces one after the other, in order) and
  writes the result into piece ``j`` of slot 0 (free again: every rank has read it);
* ``base + 1 + 2 pieces + j`` (the leader only, posted from its own thread in order once the piece
  came back, so that its counter only grows): piece ``j``'s result is in slot 0; the others copy it
  into their output;
* ``base + 3 (pieces + 1)``: this rank has read everything (the next operation's start).

Every element is reduced in the same fixed order as ``shmreduce``'s, and the leaders' result is
copied to every rank: the results are bit-identical on every rank. A failure on the helper thread
(a peer lost in the leaders' allreduce) is raised on the calling thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np

from ..primitives.hostsegment import Local
from ..primitives.reduce import ReduceSpec
from .ring import blocks
from .shmreduce import _reduce

#: the most pieces (each runs the leaders' allreduce in a tag phase of its own: 1..14)
MAX_PIECES = 14


def allreduce(
    loc: Local,
    x: np.ndarray,
    out: np.ndarray,
    spec: ReduceSpec,
    pieces: int,
    cross: Callable[[int, np.ndarray], None],
) -> None:
    """``out`` (flat, ``x``'s dtype and size; may be ``x``) becomes the reduction of every rank's
    flat ``x`` over the hosts (``cross(j, piece)``: the leaders' allreduce of piece ``j``, in place,
    on the leader only)."""
    if not 1 <= pieces <= MAX_PIECES:
        raise ValueError(f"a pipelined allreduce takes 1..{MAX_PIECES} pieces, not {pieces}")
    base, slots = loc.begin(x, pieces + 1)
    me, size = loc.rank, loc.size
    cuts = blocks(x.size, pieces)
    helper = _Helper(cross, out, slots[0], cuts) if me == 0 else None
    try:
        for j, (lo, hi) in enumerate(cuts):
            np.copyto(slots[me][lo:hi], x[lo:hi])
            loc.post(base + 1 + 2 * j)
            loc.wait_all(base + 1 + 2 * j, "write its input")
            a, b = (lo + a for a in blocks(hi - lo, size)[me])
            _reduce(spec, [s[a:b] for s in slots], slots[me][a:b], out[a:b])
            loc.post(base + 2 + 2 * j)
            if helper is not None:
                loc.wait_all(base + 2 + 2 * j, "reduce its block")
                for r, (ra, rb) in enumerate(blocks(hi - lo, size)):
                    np.copyto(out[lo + ra : lo + rb], slots[r][lo + ra : lo + rb])
                helper.give(j)
        for j, (lo, hi) in enumerate(cuts):
            if helper is not None:
                helper.take(j)
                loc.post(base + 1 + 2 * pieces + j)
            else:
                loc.wait_for(0, base + 1 + 2 * pieces + j, "bring the other hosts' result")
                np.copyto(out[lo:hi], slots[0][lo:hi])
    finally:
        if helper is not None:
            helper.stop()
    loc.post(base + 3 * (pieces + 1))


class _Helper:
    """The leader's thread that runs the leaders' allreduce of each piece as it is gathered."""

    def __init__(
        self,
        cross: Callable[[int, np.ndarray], None],
        out: np.ndarray,
        slot0: np.ndarray,
        cuts: list[tuple[int, int]],
    ) -> None:
        self.cross, self.out, self.slot0, self.cuts = cross, out, slot0, cuts
        self.todo: queue.Queue[int | None] = queue.Queue()
        self.done: queue.Queue[int | BaseException] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="collective-shmpipe", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (j := self.todo.get()) is not None:
            try:
                lo, hi = self.cuts[j]
                self.cross(j, self.out[lo:hi])
                np.copyto(self.slot0[lo:hi], self.out[lo:hi])
            except BaseException as exc:
                self.done.put(exc)
                return
            self.done.put(j)

    def give(self, j: int) -> None:
        self.todo.put(j)

    def take(self, j: int) -> None:
        got = self.done.get()
        if isinstance(got, BaseException):
            raise got
        assert got == j

    def stop(self) -> None:
        self.todo.put(None)
        self.thread.join()
