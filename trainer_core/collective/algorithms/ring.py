"""The pipelined ring: reduce-scatter, allgather (also ragged) and allreduce as the two in turn.

The flat buffer is cut into ``size`` blocks (``blocks``: as even as possible, block ``b`` owned by
rank ``b``), and every block into segments of at most ``segment_bytes``, which are pipelined: a
segment is forwarded as soon as it arrived (and was reduced), while the next ones are still on the
way. Each step a rank sends to ``rank + 1`` and receives from ``rank - 1``, with both posted before
either is waited on.

Reduce-scatter: block ``b`` starts at rank ``b + 1`` and travels once around the ring, each rank
combining ``incoming (op) own``; it ends, reduced, at its owner ``b``. So every element is reduced
in one fixed order, ``((x[b+1] op x[b+2]) op ...) op x[b]``, and the allgather then copies the
owner's bits to everyone: every rank ends bit-identical. A rank sends ``2 (size-1)/size`` of the
buffer in all, the bandwidth bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..primitives.links import Ctx, Handle, wait_all
from ..primitives.reduce import ReduceSpec

#: Largest piece of a block that travels as one message (provisional; gloo uses 1 MiB).
SEGMENT_BYTES = 1 << 20

Bounds = Sequence[tuple[int, int]]


def blocks(n: int, size: int) -> list[tuple[int, int]]:
    """``size`` contiguous blocks of ``n`` elements, the first ``n % size`` one longer."""
    q, rem = divmod(n, size)
    out, start = [], 0
    for b in range(size):
        stop = start + q + (1 if b < rem else 0)
        out.append((start, stop))
        start = stop
    return out


def segments(bound: tuple[int, int], itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """``bound`` cut into pieces of at most ``segment_bytes`` (at least one element each)."""
    start, stop = bound
    step = max(1, segment_bytes // max(1, itemsize))
    return [(i, min(i + step, stop)) for i in range(start, stop, step)]


def reduce_scatter(
    ctx: Ctx,
    buf: np.ndarray,
    spec: ReduceSpec,
    segment_bytes: int = SEGMENT_BYTES,
    bounds: Bounds | None = None,
) -> None:
    """In place: afterwards block ``rank`` of ``buf`` (``bounds``, by default ``blocks``) holds the
    reduction of every rank's block; the other blocks hold partial results."""
    size, rank = ctx.size, ctx.rank
    if size == 1 or buf.size == 0:
        return
    bounds = blocks(buf.size, size) if bounds is None else bounds
    right, left = (rank + 1) % size, (rank - 1) % size
    isz = buf.itemsize
    sends: list[Handle] = [
        ctx.links.send(right, ctx.tag(0, j), buf[a:b])
        for j, (a, b) in enumerate(segments(bounds[(rank - 1) % size], isz, segment_bytes))
    ]
    scratch = ctx.buffer("ring", buf.dtype, max(b - a for a, b in bounds))
    for step in range(size - 1):
        start = bounds[(rank - step - 2) % size][0]
        segs = segments(bounds[(rank - step - 2) % size], isz, segment_bytes)
        recvs = [
            ctx.links.recv(left, ctx.tag(step, j), scratch[a - start : b - start])
            for j, (a, b) in enumerate(segs)
        ]
        for j, ((a, b), h) in enumerate(zip(segs, recvs, strict=True)):
            h.wait()
            spec.combine(scratch[a - start : b - start], buf[a:b], buf[a:b])
            if step < size - 2:
                sends.append(ctx.links.send(right, ctx.tag(step + 1, j), buf[a:b]))
    wait_all(sends)


def allgather(
    ctx: Ctx,
    buf: np.ndarray,
    bounds: Bounds,
    holds: int | None = None,
    segment_bytes: int = SEGMENT_BYTES,
) -> None:
    """In place: rank ``r`` starts with block ``holds`` (default: its own rank) of ``buf`` filled,
    block ``b`` spanning ``bounds[b]``; afterwards every block is filled. Blocks may differ in size
    (a ragged allgather) and be empty."""
    size, rank = ctx.size, ctx.rank
    if size == 1:
        return
    shift = 0 if holds is None else (holds - rank) % size
    right, left = (rank + 1) % size, (rank - 1) % size
    isz = buf.itemsize

    def block_at(step: int) -> tuple[int, int]:  # the block this rank receives at ``step``
        return bounds[(rank - step - 1 + shift) % size]

    sends: list[Handle] = [
        ctx.links.send(right, ctx.tag(0, j), buf[a:b])
        for j, (a, b) in enumerate(segments(bounds[(rank + shift) % size], isz, segment_bytes))
    ]
    # every receive lands in its own place, so all steps are posted at once
    posted = [
        [
            (a, b, ctx.links.recv(left, ctx.tag(step, j), buf[a:b]))
            for j, (a, b) in enumerate(segments(block_at(step), isz, segment_bytes))
        ]
        for step in range(size - 1)
    ]
    for step, recvs in enumerate(posted):
        for j, (a, b, h) in enumerate(recvs):
            h.wait()
            if step < size - 2:
                sends.append(ctx.links.send(right, ctx.tag(step + 1, j), buf[a:b]))
    wait_all(sends)


def allreduce(ctx: Ctx, buf: np.ndarray, spec: ReduceSpec, segment_bytes: int = SEGMENT_BYTES) -> None:
    """In place: ``buf`` becomes the reduction over all ranks, bit-identical on each."""
    if ctx.size == 1 or buf.size == 0:
        return
    reduce_scatter(ctx.phase(0), buf, spec, segment_bytes)
    allgather(ctx.phase(1), buf, blocks(buf.size, ctx.size), segment_bytes=segment_bytes)


def ragged_allgather(
    ctx: Ctx, local: np.ndarray, segment_bytes: int = SEGMENT_BYTES
) -> tuple[np.ndarray, list[int]]:
    """Every rank's flat ``local`` (lengths may differ) concatenated in rank order, and the lengths."""
    size, rank = ctx.size, ctx.rank
    counts = np.zeros(size, dtype=np.int64)
    counts[rank] = local.size
    allgather(ctx.phase(0), counts, [(r, r + 1) for r in range(size)])
    lengths = [int(c) for c in counts]
    bounds, start = [], 0
    for n in lengths:
        bounds.append((start, start + n))
        start += n
    out = np.empty(start, dtype=local.dtype)
    out[bounds[rank][0] : bounds[rank][1]] = local.reshape(-1)
    allgather(ctx.phase(1), out, bounds, segment_bytes=segment_bytes)
    return out, lengths
