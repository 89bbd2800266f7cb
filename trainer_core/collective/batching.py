"""Tensor fusion across operations (Horovod's ``HOROVOD_FUSION_THRESHOLD``): which queued
allreduces run as one collective. Pure, no I/O.

An allreduce submitted with fusion on says in its descriptor how many bytes it would add to a
fusion buffer (``Descriptor.fuse``; 0: it runs alone). Operations of one ``key`` (kind, dtype,
op, group: what must be equal to reduce them in one buffer) may share a buffer of at most
``limit`` bytes. Each rank proposes a batch from its own queue (``candidate``: the head and the
later operations of the head's key, in queue order, while they fit) and shows the others its
``batch_record``; where every rank proposed the same batch, it runs as one collective. Otherwise
the ranks exchange their queues, ``agreement.decide`` picks the operation of the slot, and
``together`` (the same function of the same queues on every rank) says which operations every
rank holds, with the same descriptors, to run with it: the batch is never decided from one rank's
view alone, so ranks never fuse differently, and an operation whose ranks disagree stays out of
every batch (it fails alone, on every rank).

A batch's buffer holds its operations in ``layout`` order (by name), whatever order each rank
submitted them in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from .agreement import JOIN, Descriptor, mismatch, record


def key(d: Descriptor) -> tuple[str, str, str, str] | None:
    """What operations fused with ``d`` must share (None: ``d`` runs alone)."""
    if d.fuse <= 0 or d.refused or d.kind == JOIN:
        return None
    return d.kind, d.dtype, d.op, d.group


def candidate(queue: Sequence[Descriptor], limit: int) -> list[int]:
    """The indices in ``queue`` (head first) of the batch this rank proposes: the head and each
    later operation of the head's key, in queue order, while the total stays within ``limit``
    bytes; ``[]`` where the head runs alone or nothing joins it."""
    if not queue or limit <= 0:
        return []
    k = key(queue[0])
    if k is None or queue[0].fuse > limit:
        return []
    out, used = [0], queue[0].fuse
    for i in range(1, len(queue)):
        d = queue[i]
        if key(d) == k and used + d.fuse <= limit:
            out.append(i)
            used += d.fuse
    return out if len(out) > 1 else []


def together(queues: Sequence[Sequence[Descriptor]], name: str, limit: int) -> list[str]:
    """The names that run with ``name`` (the slot's operation, agreed on every rank) as one
    collective: ``name`` first, then, in rank 0's queue order, each operation every rank holds
    with equal descriptors and ``name``'s key, while the total stays within ``limit`` bytes.
    Only ``[name]`` where some rank has joined (a joined rank stands in for one operation at a
    time) or ``name`` runs alone."""
    if limit <= 0 or any(q and q[0].kind == JOIN for q in queues):
        return [name]
    by_rank = [{d.name: d for d in q} for q in queues]
    first = by_rank[0].get(name)
    k = None if first is None else key(first)
    if first is None or k is None or first.fuse > limit:
        return [name]
    out, used = [name], first.fuse
    for d in queues[0]:
        if d.name == name or key(d) != k or used + d.fuse > limit:
            continue
        mine = [held.get(d.name) for held in by_rank]
        if any(m is None for m in mine) or mismatch([m for m in mine if m is not None]):
            continue
        if any(m is not None and m.fuse != d.fuse for m in mine):
            continue
        out.append(d.name)
        used += d.fuse
    return out


def layout(names: Sequence[str]) -> list[str]:
    """The order of a batch's operations in its buffer (the same on every rank)."""
    return sorted(names)


def batch_record(descs: Sequence[Descriptor]) -> bytes:
    """The 32 bytes a rank shows for the batch ``descs`` (in ``layout`` order): equal on two ranks
    only where both proposed the same operations with the same descriptors (and never agreed
    where one of them was refused)."""
    h = hashlib.blake2b(digest_size=16)
    for d in descs:
        h.update(d.name.encode() + b"\0" + d.body() + d.fuse.to_bytes(8, "little"))
    names = "fused:" + ",".join(d.name for d in descs)
    return record(names, h.digest(), sum(d.fuse for d in descs), any(d.refused for d in descs))
