"""Where pulled values land: each key's output itself when it can take them, else a fresh host array
copied to the outputs at the end; and how one part of a reply gets there.

An output takes the value directly when it is one C-contiguous numpy array of the key's dtype and
size (a part's reply may then be read into it by the channel), or a cupy array of that dtype, size
and layout (other outputs of the key, all on its device, get a device copy of it). Into a cupy
output, a raw part is copied up once from wherever it arrived (a frame, a shared-memory segment,
the server's buffer: ``xp.host_to_device``), and a compressed part sends only its payload up
(``xp.payload_to_device``, at the payload's size) to be decoded on the device into its slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import trainer_core.xp as arrays
from trainer_core.compression.codec import WireStats
from trainer_core.compression.codec import decode as gc_decode
from trainer_core.errors import KVError
from trainer_core.kv.api import Pairs, write_out
from trainer_core.kv.keys import KeyMeta, Where
from trainer_core.ps.protocol import Key
from trainer_core.ps.sharding import Part


def direct_target(outs: list[Any], dtype: np.dtype, size: int) -> Any:
    """A flat view of the first output when values can be written into it directly (no temporary):
    the one numpy output, or the first of cupy outputs on one device; else ``None``."""
    out: Any = outs[0] if outs else None
    if arrays.is_device_array(out):
        same = all(arrays.is_device_array(o) and o.device == out.device for o in outs)
        if not same or out.dtype != dtype or out.size != size or not out.flags.c_contiguous:
            return None
        return out.reshape(-1)
    if (
        len(outs) != 1
        or not isinstance(out, np.ndarray)
        or out.dtype != dtype
        or out.size != size
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        return None
    return out.reshape(-1)


def decode_into(payload: Any, meta: Any, size: int, dtype: np.dtype, dst: Any) -> None:
    """Decode a received payload into ``dst`` (flat, ``size`` values of ``dtype``): on the host, or
    for a device ``dst``, on its device after one copy of the payload (not the values) up."""
    if not arrays.is_device_array(dst):
        np.copyto(dst, gc_decode(payload, meta, size, dtype))
        return
    gc_decode(payload, meta, size, dtype, out=dst)


class Results:
    """The arrays one dist pull call assembles its keys' values in, by ``id(KeyMeta)``."""

    def __init__(self) -> None:
        self.arrays: dict[int, Any] = {}
        self.direct: set[int] = set()  # indexes in the pulls whose first output receives the data

    def plan(self, pulls: Pairs, meta_of: Callable[[Key], KeyMeta]) -> None:
        """Take each key's first output as its result where it can receive the data directly."""
        for i, (k, outs) in enumerate(pulls):
            m = meta_of(k)
            target = direct_target(outs, m.dtype, m.size)
            if target is not None and id(m) not in self.arrays:
                self.arrays[id(m)] = target
                self.direct.add(i)

    def of(self, m: KeyMeta) -> Any:
        """Where key ``m``'s value is assembled (an output, or a fresh host array)."""
        if id(m) not in self.arrays:
            self.arrays[id(m)] = np.empty(m.size, dtype=m.dtype)
        return self.arrays[id(m)]

    def into(self, where: Where) -> list[memoryview] | None:
        """Where a direct channel should read each raw part of a reply (``None``: a part goes to a
        device output, so every frame arrives in the channel's own buffers)."""
        dsts = [self.of(m)[p.start : p.stop] for m, p, _ in where]
        if any(arrays.is_device_array(d) for d in dsts):
            return None
        return [d.view(np.uint8).data for d in dsts]

    def put(self, m: KeyMeta, p: Part, values: np.ndarray) -> None:
        """Copy one raw part (host memory) into its place: once, even onto a device."""
        dst = self.of(m)[p.start : p.stop]
        if arrays.is_device_array(dst):
            arrays.host_to_device(values, dst)
        else:
            np.copyto(dst, values)

    def read_frame(self, m: KeyMeta, p: Part, frame: Any, meta: Any, stats: WireStats) -> None:
        """Copy (or decode, when ``meta`` describes a compressed payload) one reply frame into its
        place (nothing to copy when the channel read it there already)."""
        if frame is None:
            raise KVError("a server's reply is missing data")
        stats.received += len(frame.buffer)
        dst = self.of(m)[p.start : p.stop]
        if meta is not None:
            decode_into(frame.buffer, meta, p.size, m.dtype, dst)
        elif len(frame.buffer) != p.size * m.dtype.itemsize:
            raise KVError("a server's reply is missing data")
        elif arrays.is_device_array(dst):
            arrays.host_to_device(np.frombuffer(frame.buffer, dtype=m.dtype), dst)
        elif not (
            getattr(frame, "placed", False)
            and np.frombuffer(frame.buffer, np.uint8).ctypes.data == dst.ctypes.data
        ):
            np.copyto(dst, np.frombuffer(frame.buffer, dtype=m.dtype))

    def finish(self, pulls: Pairs, meta_of: Callable[[Key], KeyMeta]) -> None:
        """Copy each assembled value into the outputs that did not receive it directly."""
        for i, (k, outs) in enumerate(pulls):
            write_out(k, self.arrays[id(meta_of(k))], outs[1:] if i in self.direct else outs)
