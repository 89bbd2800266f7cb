"""Tensor fusion: many small arrays of one dtype packed into one buffer, reduced once, unpacked.

``plan(arrays, limit)`` groups the arrays' indices into buckets: arrays of one kind (dtype, or
bfloat16) in list order, a bucket closed when the next array would take it past ``limit`` bytes
(an array larger than ``limit`` gets a bucket of its own). The plan depends only on the arrays'
dtypes and sizes, so every rank that passes the same list makes the same buckets (Horovod's
``HOROVOD_FUSION_THRESHOLD`` idea, without its cycle-time negotiation: the caller names the group).
A ``limit`` of 0 gives every array a bucket of its own.

``Part`` and ``fuser``: the data path of a batch of separately submitted allreduces that the ranks
agreed to run as one collective (``batching``, the negotiator's cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def plan(sizes: Sequence[tuple[str, int]], limit: int) -> list[list[int]]:
    """Buckets of indices for arrays given as ``(kind, nbytes)``, in a fixed order."""
    done: list[list[int]] = []
    open_: dict[str, tuple[list[int], int]] = {}
    for i, (kind, nbytes) in enumerate(sizes):
        bucket, used = open_.get(kind, ([], 0))
        if bucket and used + nbytes > limit:
            done.append(bucket)
            bucket, used = [], 0
        bucket.append(i)
        open_[kind] = (bucket, used + nbytes)
    done += [bucket for bucket, _ in open_.values() if bucket]
    return sorted(done, key=lambda b: b[0])


def pack(arrays: Sequence[np.ndarray], bucket: Sequence[int]) -> np.ndarray:
    """The bucket's arrays, flattened and concatenated (a fresh buffer)."""
    parts = [np.ascontiguousarray(arrays[i]).reshape(-1) for i in bucket]
    return np.concatenate(parts) if parts else np.zeros(0)


def unpack(buf: np.ndarray, arrays: Sequence[Any], bucket: Sequence[int], out: list[Any]) -> None:
    """Cut ``buf`` back into arrays of the bucket's shapes, stored at their index in ``out``."""
    start = 0
    for i in bucket:
        n = int(np.prod(arrays[i].shape, dtype=np.int64))
        out[i] = buf[start : start + n].reshape(arrays[i].shape)
        start += n


@dataclass
class Part:
    """One allreduce's share of a fusion buffer (tensor fusion across operations, ``batching``):
    its input as a flat host array, its reduction (``spec``, the same for the whole batch) and
    ``deliver(piece)``, which makes the operation's result from its piece of the reduced buffer."""

    host: np.ndarray
    spec: Any
    deliver: Callable[[np.ndarray], Any]


def fuser(
    parts: Sequence[Part], reduce: Callable[[int, np.ndarray], None]
) -> tuple[Callable[[], None], Callable[[int], list[Any]]]:
    """A batch's data path as ``(pack, run)`` (``negotiator.Fuser``): ``pack()`` copies every
    part's input into one buffer, in order; ``run(seq)`` reduces the buffer in place
    (``reduce(seq, buffer)``, one collective) and gives each part's result."""
    ends = np.cumsum([p.host.size for p in parts])
    starts = ends - np.array([p.host.size for p in parts])
    buf = np.empty(int(ends[-1]) if len(parts) else 0, parts[0].host.dtype if parts else np.float32)

    def pack() -> None:
        for p, a, b in zip(parts, starts, ends, strict=True):
            buf[a:b] = p.host.reshape(-1)

    def run(seq: int) -> list[Any]:
        reduce(seq, buf)
        return [p.deliver(buf[a:b]) for p, a, b in zip(parts, starts, ends, strict=True)]

    return pack, run
