"""Binomial-tree broadcast, and the fixed-order reduce to one rank that the hierarchical path uses.

Broadcast: with ranks renumbered so that the root is 0 (``v = (rank - root) % size``), rank ``v``
receives from ``v`` minus its lowest set bit and sends to ``v + 2**k`` for each ``2**k`` below that
bit, largest first: ``ceil(log2(size))`` rounds. The buffer travels in segments, and a rank
forwards each segment as soon as it arrived, so a large broadcast is pipelined down the tree.

Reduce: the root receives every other rank's buffer and combines them in rank order,
``((x0 op x1) op x2) ...``: meant for the few ranks of one host, where the host has no
shared-memory segment (``shmreduce`` reduces through the segment where there is one).
"""

from __future__ import annotations

import numpy as np

from ..primitives.links import Ctx, Handle, wait_all
from ..primitives.reduce import ReduceSpec
from .ring import SEGMENT_BYTES, segments


def broadcast(ctx: Ctx, buf: np.ndarray, root: int, segment_bytes: int = SEGMENT_BYTES) -> None:
    """In place: every rank's ``buf`` becomes the root's."""
    size, rank = ctx.size, ctx.rank
    if not 0 <= root < size:
        raise ValueError(f"broadcast root must be a rank of the group (0..{size - 1}), not {root}")
    if size == 1 or buf.size == 0:
        return
    v = (rank - root) % size
    low = v & -v if v else 1 << size.bit_length()
    children = []
    bit = low >> 1
    while bit:
        if v + bit < size:
            children.append((v + bit + root) % size)
        bit >>= 1
    segs = segments((0, buf.size), buf.itemsize, segment_bytes)
    sends: list[Handle] = []
    if v:
        parent = (v - low + root) % size
        recvs = [ctx.links.recv(parent, ctx.tag(0, j), buf[a:b]) for j, (a, b) in enumerate(segs)]
    for j, (a, b) in enumerate(segs):
        if v:
            recvs[j].wait()
        sends += [ctx.links.send(c, ctx.tag(0, j), buf[a:b]) for c in children]
    wait_all(sends)


def reduce_to(ctx: Ctx, buf: np.ndarray, spec: ReduceSpec, root: int) -> None:
    """In place at ``root``: ``buf`` becomes the reduction of all ranks' buffers, in rank order.
    The other ranks' buffers are left as they were."""
    size, rank = ctx.size, ctx.rank
    if size == 1 or buf.size == 0:
        return
    if rank != root:
        ctx.links.send(root, ctx.tag(0), buf).wait()
        return
    parts = {r: (buf if r == root else np.empty_like(buf)) for r in range(size)}
    recvs = {r: ctx.links.recv(r, ctx.tag(0), parts[r]) for r in range(size) if r != root}
    for h in recvs.values():
        h.wait()
    acc = parts[0] if root != 0 else buf.copy()
    for r in range(1, size):
        spec.combine(acc, parts[r], acc)
    if acc is not buf:
        buf[...] = acc
