"""Which server holds which part of a key (pure).

Keys with fewer than ``bigarray_bound`` elements live whole on one server, chosen as MXNet
does for int keys (``key * 9973 % S``) and by a stable hash for str keys, so small keys spread
evenly. Bigger arrays are split into contiguous, nearly equal parts, part ``i`` on server ``i``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from trainer_core.ps.protocol import Key


@dataclass(frozen=True)
class Part:
    """Elements ``[start, stop)`` of a key's flattened value, held by ``server`` as part ``index``."""

    index: int
    server: int
    start: int
    stop: int
    size: int = field(init=False, compare=False)  # stop - start (read several times per call)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", self.stop - self.start)


def server_of(key: Key, num_servers: int) -> int:
    """The server of a small key."""
    if isinstance(key, int):
        return (key * 9973) % num_servers
    return zlib.crc32(key.encode()) % num_servers


def split(key: Key, size: int, num_servers: int, bigarray_bound: int) -> list[Part]:
    """The parts of a key with ``size`` elements."""
    if size < max(bigarray_bound, 1) or num_servers == 1:
        return [Part(0, server_of(key, num_servers), 0, size)]
    n = min(num_servers, size)
    base, extra = divmod(size, n)
    parts, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        parts.append(Part(i, i, start, stop))
        start = stop
    return parts
