"""Tensor fusion: many small arrays of one dtype packed into one buffer, reduced once, unpacked.

``plan(arrays, limit)`` groups the arrays' indices into buckets: arrays of one kind (dtype, or
bfloat16) in list order, a bucket closed when the next array would take it past ``limit`` bytes
(an array larger than ``limit`` gets a bucket of its own). The plan depends only on the arrays'
dtypes and sizes, so every rank that passes the same list makes the same buckets (Horovod's
``HOROVOD_FUSION_THRESHOLD`` idea, without its cycle-time negotiation: the caller names the group).
"""

from __future__ import annotations

from collections.abc import Sequence
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
