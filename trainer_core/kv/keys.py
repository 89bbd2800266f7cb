"""What a dist worker keeps per key (shape, dtype, parts, their shared-memory segments) and per
message being built (``Outgoing``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_core.compression.codec import WireStats
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.errors import KVError
from trainer_core.ps.sharding import Part
from trainer_core.transport import wire
from trainer_core.transport.shm import Segment


@dataclass
class KeyMeta:
    """One key: shape, dtype, parts, and its segments per part (same-host servers)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    size: int
    parts: list[Part]
    segments: list[Segment | None] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)  # seq of the last request using each segment (0: none)


#: the parts one message carries, in entry order: key, part, and the part's segment (or ``None``)
Where = list[tuple[KeyMeta, Part, Segment | None]]


@dataclass
class Outgoing:
    """One message being built for one server."""

    entries: list[wire.Entry] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)
    where: Where = field(default_factory=list)
    borrowed: bool = False  # a frame is the caller's own array, sent without a copy


def direct_target(outs: list[Any], m: KeyMeta) -> np.ndarray | None:
    """A flat view of the one output array when results can be written into it directly (no temporary)."""
    if len(outs) != 1:
        return None
    out = outs[0]
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != m.dtype
        or out.size != m.size
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        return None
    return out.reshape(-1)


def result_of(results: dict[int, np.ndarray], m: KeyMeta) -> np.ndarray:
    """Where key ``m``'s pulled value is assembled (the output itself, or a fresh array)."""
    if id(m) not in results:
        results[id(m)] = np.empty(m.size, dtype=m.dtype)
    return results[id(m)]


def read_frame(dst: np.ndarray, m: KeyMeta, p: Part, frame: Any, meta: Any, stats: WireStats) -> None:
    """Copy (or decode, when ``meta`` describes a compressed payload) one reply frame into ``dst``
    (nothing to copy when the channel read it there already)."""
    if frame is None:
        raise KVError("a server's reply is missing data")
    stats.received += len(frame.buffer)
    if (
        getattr(frame, "placed", False)
        and meta is None
        and len(frame.buffer) == dst.nbytes
        and np.frombuffer(frame.buffer, np.uint8).ctypes.data == dst.ctypes.data
    ):
        return
    if meta is not None:
        np.copyto(dst, gc_decode(frame.buffer, meta, p.size, m.dtype))
    elif len(frame.buffer) != p.size * m.dtype.itemsize:
        raise KVError("a server's reply is missing data")
    else:
        np.copyto(dst, np.frombuffer(frame.buffer, dtype=m.dtype))
