"""The operations that move data without reducing it all: ``broadcast``, ``allgather`` (ragged),
``reduce_scatter`` and ``barrier``, as the ``Op``s a ``Group`` submits (its methods are thin
wrappers): the descriptor the ranks agree on and the data path, through NCCL where the array is
on a device NCCL takes, else through host memory over the group's links."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from trainer_core.xp import like, to_host

from .agreement import Descriptor
from .algorithms import doubling, ring, tree
from .lane import check_array
from .nccl import NcclPath
from .negotiator import Op
from .policy import Thresholds
from .primitives.links import Ctx
from .primitives.reduce import spec_for


class Host(Protocol):
    """What these operations use of their group."""

    nccl: NcclPath | None
    thresholds: Thresholds

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def _desc(self, name: str, kind: str, array: Any = None, **more: Any) -> Descriptor: ...

    def _ctx(self, seq: int) -> Ctx: ...


def with_ctx(group: Host, fn: Callable[[Ctx], Any]) -> Callable[[int], Any]:
    """The data path ``fn(ctx)`` as an operation's ``run(seq)``."""
    return lambda seq: fn(group._ctx(seq))


def broadcast(group: Host, name: str, array: Any, root: int) -> Op:
    check_array("broadcast", array)
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"broadcast root must be a rank (an int), not {type(root).__name__} {root!r}")
    if not 0 <= root < group.size:
        raise ValueError(f"broadcast root must be a rank of the group (0..{group.size - 1}), not {root!r}")
    desc = group._desc(name, "broadcast", array, root=int(root))
    if group.nccl is not None and group.nccl.takes(array):
        return Op(desc, with_ctx(group, group.nccl.broadcast(array, root)))
    host = np.array(to_host(array), copy=True, order="C")

    def run(seq: int) -> Any:
        tree.broadcast(group._ctx(seq), host.reshape(-1).view(np.uint8), root, group.thresholds.segment_bytes)
        return like(host, array)

    return Op(desc, run, host.nbytes)


def allgather(group: Host, name: str, array: Any, counts: bool = False) -> Op:
    """Every rank's rows in rank order (``counts``: and how many each rank gave, a list; rows of
    no bytes are counted as none)."""
    check_array("allgather", array)
    desc = group._desc(name, "allgather", array)
    desc = replace(desc, shape=(-1, *desc.shape[1:]))  # the first axis is ragged
    if group.nccl is not None and group.nccl.takes(array):
        return Op(desc, with_ctx(group, group.nccl.allgather(array, counts)))
    host = np.ascontiguousarray(to_host(array))
    if host.ndim == 0:
        host = host.reshape(1)
    row = host.itemsize * int(np.prod(host.shape[1:], dtype=np.int64))  # bytes (0: counts are 0)

    def run(seq: int) -> Any:
        flat, lengths = ring.ragged_allgather(
            group._ctx(seq), host.view(np.uint8).reshape(-1), group.thresholds.segment_bytes
        )
        rows = like(flat.view(host.dtype).reshape(-1, *host.shape[1:]), array)
        return (rows, [n // row if row else 0 for n in lengths]) if counts else rows

    return Op(desc, run)


def reduce_scatter(group: Host, name: str, array: Any, op: str, kind: str | None) -> Op:
    check_array("reduce_scatter", array)
    spec = spec_for(array.dtype, op, kind)
    if array.ndim == 0:
        raise ValueError("reduce_scatter needs an array with at least one axis")
    desc = replace(group._desc(name, "reduce_scatter", array, op=op), dtype=spec.kind)
    if group.nccl is not None and group.nccl.takes(array, spec):
        return Op(desc, with_ctx(group, group.nccl.reduce_scatter(array, spec)))
    host = np.array(to_host(array), copy=True, order="C")

    def run(seq: int) -> Any:
        rows = ring.blocks(host.shape[0], group.size)
        row = int(np.prod(host.shape[1:], dtype=np.int64))
        flat = host.reshape(-1)
        bounds = [(a * row, b * row) for a, b in rows]
        ring.reduce_scatter(group._ctx(seq), flat, spec, group.thresholds.segment_bytes, bounds)
        a, b = rows[group.rank]
        mine = host[a:b].copy()
        spec.finish(mine.reshape(-1), group.size)
        return like(mine, array)

    return Op(desc, run, host.nbytes)


def barrier(group: Host, name: str) -> Op:
    return Op(group._desc(name, "barrier"), lambda seq: doubling.barrier(group._ctx(seq)))
