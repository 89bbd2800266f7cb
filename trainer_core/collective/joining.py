"""Horovod's ``join`` on a group: a rank that ran out of data joins, and takes part in every
operation the other ranks still submit until every rank has joined.

A joined rank's queue holds its ``join`` (``join_op``); where the others agree on an operation it
does not hold (``agreement.decide``), it builds its part from their descriptor (``standin``) and
runs it in the next slot beside theirs: zeros for an allreduce (so ``mean`` divides by the whole
group's size, as Horovod's ``Average`` does, and ``min``/``max`` see the zeros, as Horovod's do),
no rows for an allgather, and a buffer for a broadcast's value, which it drops. Once every rank's
head is its join, the join runs: every rank says in which slot its join reached the head of its
queue, and each returns the rank that joined last (the highest rank among those that joined in
the same slot), and names its next unnamed operation as the rank that named the most does.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from . import moves
from .agreement import JOIN, CollectiveMismatch, Descriptor
from .negotiator import Negotiator, Op
from .primitives.links import Ctx
from .primitives.reduce import BFLOAT16, ReduceSpec, spec_for


class Host(moves.Host, Protocol):
    """What a join uses of its group (``Group``)."""

    _negotiator: Negotiator
    _joins: int

    def starting(self) -> None: ...

    def _flat_allreduce(
        self, ctx: Ctx, flat: np.ndarray, spec: ReduceSpec, algo: str | None = None
    ) -> None: ...

    def _allreduce_op(
        self, name: str, array: Any, op: str, out: Any, kind: str | None, sync: bool = False
    ) -> Op: ...

    def _grouped(self, name: str, arrays: Any, op: str, kind: str | None) -> Op: ...


def join(group: Host) -> int:
    """Horovod's ``join`` on ``group``: this rank has no more data. Until every rank has joined it
    takes part in every operation the others submit (zeros for an allreduce, no rows for an
    allgather); then every rank's ``join`` returns the rank that joined last. An operation it
    could not take part in (a broadcast from a joined rank, a compressed allreduce) fails on the
    ranks that submitted it, and this ``join`` raises its error. Not with an NCCL path (a joined
    rank's parts are host arrays)."""
    if group.nccl is not None:
        raise NotImplementedError(
            "join() on a group with an NCCL path is not supported: a joined rank's parts are host "
            "arrays, which would not pair with the others' device operations; join the job with "
            "use_nccl=False, or give every rank the same number of batches"
        )
    group.starting()
    group._joins += 1
    last, errors = group._negotiator.call(join_op(group, f"join.{group._joins - 1}"))
    if errors:
        raise CollectiveMismatch(errors[0])
    return int(last)


def join_op(group: Host, name: str) -> Op:
    """The join: its result is ``(last, errors)``, the rank that joined last and the errors of the
    operations this rank stood in for that failed on every rank."""

    def run(seq: int) -> tuple[int, list[str]]:
        if group.size == 1:
            return 0, list(op.errors)
        table = np.zeros(2 * group.size, np.int64)
        table[group.rank] = op.slot
        table[group.size + group.rank] = group._negotiator.unnamed()
        group._flat_allreduce(group._ctx(seq), table, spec_for(np.int64, "sum"))
        group._negotiator.catch_up(int(table[group.size :].max()))
        return last_joined(table[: group.size].tolist()), list(op.errors)

    op = Op(group._desc(name, JOIN), run)
    return op


def last_joined(slots: list[int]) -> int:
    """The rank that joined last from the slot each rank's join reached its head (ties: the
    highest rank)."""
    return max(range(len(slots)), key=lambda r: (slots[r], r))


def standin(group: Host, desc: Descriptor) -> Op:
    """This joined rank's part of the operation ``desc`` the others submitted (same name, same
    record)."""
    if desc.kind == "allreduce":
        array, kind = zeros(desc.shape, desc.dtype)
        return group._allreduce_op(desc.name, array, desc.op, None, kind)
    if desc.kind == "grouped_allreduce":
        parts = [zeros(shape, dt) for shape, dt in zip(desc.shape, desc.dtype.split(","), strict=True)]
        kind = BFLOAT16 if parts and all(k == BFLOAT16 for _, k in parts) else None
        return group._grouped(desc.name, [a for a, _ in parts], desc.op, kind)
    if desc.kind == "allgather":
        array, _ = zeros((0, *desc.shape[1:]), desc.dtype)
        return moves.allgather(group, desc.name, array)
    if desc.kind == "broadcast":
        array, _ = zeros(desc.shape, desc.dtype)
        return moves.broadcast(group, desc.name, array, desc.root)
    if desc.kind == "reduce_scatter":
        array, kind = zeros(desc.shape, desc.dtype)
        return moves.reduce_scatter(group, desc.name, array, desc.op, kind)
    if desc.kind == "barrier":
        return moves.barrier(group, desc.name)
    raise ValueError(f"a joined rank cannot take part in collective {desc.kind} {desc.name!r}")


def zeros(shape: Any, dtype: str) -> tuple[np.ndarray, str | None]:
    """Zeros of a descriptor's shape and dtype name, and the ``kind`` they reduce as (bfloat16
    travels as its uint16 bits)."""
    if dtype == BFLOAT16:
        return np.zeros(tuple(shape), np.uint16), BFLOAT16
    return np.zeros(tuple(shape), np.dtype(dtype)), None
