"""Recursive doubling (latency-bound allreduce) and the dissemination barrier.

Recursive doubling takes ``log2(p)`` steps for ``p`` a power of two: at step ``k`` rank ``r``
swaps its whole buffer with ``r xor 2**k`` and combines ``lower (op) higher``, where ``lower`` is
the half from the lower ranks. Both partners compute the same operands in the same order, so the
result is the fixed tree ``((x0 op x1) op (x2 op x3)) op ...`` on every rank, bit for bit.

Other sizes: with ``p`` the largest power of two below ``size`` and ``extra = size - p``, ranks
``2i`` and ``2i + 1`` for ``i < extra`` first fold into the odd one (``x[2i] op x[2i+1]``); the
``p`` remaining ranks run the doubling; the odd ones then send the result back to their even
partner. That costs two more steps, each carrying the whole buffer.
"""

from __future__ import annotations

import numpy as np

from ..primitives.links import Ctx
from ..primitives.reduce import ReduceSpec


def _pow2_below(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def allreduce(ctx: Ctx, buf: np.ndarray, spec: ReduceSpec) -> None:
    """In place: ``buf`` becomes the reduction over all ranks, bit-identical on each."""
    size, rank = ctx.size, ctx.rank
    if size == 1 or buf.size == 0:
        return
    p = _pow2_below(size)
    extra = size - p
    links = ctx.links
    other = ctx.buffer("doubling", buf.dtype, buf.size)
    # fold: the even rank of each of the first ``extra`` pairs hands its buffer to the odd one
    if rank < 2 * extra:
        if rank % 2 == 0:
            links.send(rank + 1, ctx.tag(0), buf).wait()
            links.recv(rank + 1, ctx.tag(1), buf).wait()
            return
        links.recv(rank - 1, ctx.tag(0), other).wait()
        spec.combine(other, buf, buf)
        vrank = rank // 2
    else:
        vrank = rank - extra

    def real(v: int) -> int:
        return 2 * v + 1 if v < extra else v + extra

    mask, step = 1, 2
    while mask < p:
        peer = real(vrank ^ mask)
        sent = links.send(peer, ctx.tag(step), buf)
        links.recv(peer, ctx.tag(step), other).wait()
        sent.wait()
        if vrank & mask:
            spec.combine(other, buf, buf)  # the partner holds the lower ranks' part
        else:
            spec.combine(buf, other, buf)
        mask <<= 1
        step += 1
    if rank < 2 * extra:
        links.send(rank - 1, ctx.tag(1), buf).wait()


def barrier(ctx: Ctx) -> None:
    """Return once every rank entered: ``ceil(log2(size))`` rounds of empty messages, round ``k``
    to ``rank + 2**k`` and from ``rank - 2**k``."""
    size, rank = ctx.size, ctx.rank
    token, got = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    dist, step = 1, 0
    while dist < size:
        sent = ctx.links.send((rank + dist) % size, ctx.tag(step), token)
        ctx.links.recv((rank - dist) % size, ctx.tag(step), got).wait()
        sent.wait()
        dist <<= 1
        step += 1
