"""What a dist worker keeps per key (shape, dtype, parts, their shared-memory segments) and per
message being built (``Outgoing``); where pulled values land is ``results.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_core.ps import protocol
from trainer_core.ps.sharding import Part
from trainer_core.transport.devshm import Segment


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

    entries: list[protocol.Entry] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)
    where: Where = field(default_factory=list)
    borrowed: bool = False  # a frame is the caller's own array, sent without a copy
