"""The parameter server's protocol (docs/wire.md): its message kinds, entries, dtypes and state slots.

A worker's requests to a server (``init``, ``push``, ``pull``, ``pushpull``, the settings, the
state of a checkpoint) and a server's answers travel in the transport's envelope
(``transport.wire``); this module is what they mean: ``Entry``, one key part of a data message,
read and checked by ``entry``; ``SCHEMA``, the node layer's kinds plus these, which every node of
a parameter-server job decodes with. ``decode``, ``encode``, ``Decoder`` and ``Header`` are the
envelope's, bound to ``SCHEMA``. The bytes are those of docs/wire.md, unchanged.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from trainer_core.errors import WireError
from trainer_core.node.protocol import (
    ABORT,
    BARRIER,
    BARRIER_DONE,
    BOOK,
    FINISH,
    FINISHED,
    HEARTBEAT,
    HEARTBEAT_ACK,
    REGISTER,
    TERMINATE,
)
from trainer_core.node.protocol import SCHEMA as NODE_SCHEMA
from trainer_core.transport import wire
from trainer_core.transport.wire import MAX_HEADER_BYTES, VERSION, Header, body_int, body_str, encode, is_int

__all__ = [
    "ABORT", "BARRIER", "BARRIER_DONE", "BOOK", "FINISH", "FINISHED", "HEARTBEAT", "HEARTBEAT_ACK",
    "MAX_HEADER_BYTES", "REGISTER", "TERMINATE", "VERSION", "Header", "body_int", "body_str", "encode",
]  # fmt: skip

MAX_KEY_LEN = 256
MAX_ELEMENTS = 1 << 36
MAX_META = 16  # fields of an encoded payload's metadata

# worker -> server and replies (the scheduler's kinds are the node layer's: ``node.protocol``)
INIT, PUSH, PULL, PUSHPULL = "init", "push", "pull", "pushpull"
SET_MODE, SET_OPTIMIZER, SET_COMPRESSION = "set_mode", "set_optimizer", "set_compression"
GET_STATE, SET_STATE = "get_state", "set_state"  # servers' per-key state, for checkpoints
REPLY, ERROR = "reply", "error"
#: a worker enters a collective call at the scheduler (barrier, agreement): it pushes nothing until
#: its next request, so a sync round that needs its push cannot complete meanwhile
AWAY = "away"

PS_OPS = frozenset(
    {
        INIT,
        PUSH,
        PULL,
        PUSHPULL,
        SET_MODE,
        SET_OPTIMIZER,
        SET_COMPRESSION,
        GET_STATE,
        SET_STATE,
        FINISH,
        AWAY,
        REPLY,
        ERROR,
    }
)
DATA_OPS = frozenset({INIT, PUSH, PULL, PUSHPULL})
DTYPES = frozenset({"<f4", "<f8", "<f2", "<i4", "<i8", "<u1", "|u1", "|i1"})
SHM_NAME = re.compile(r"^launchkit-[A-Za-z0-9._-]{1,200}$")
#: slot names of ``get_state``/``set_state``: the stored value, an optimizer slot, a pull-compressor slot
STATE_SLOT = re.compile(r"^(value|opt/[A-Za-z0-9_]{1,32}|pull/[A-Za-z0-9_]{1,32})$")

Key = int | str


class Entry(NamedTuple):
    """One key part in a data message: ``key``, part index, element count, dtype, where the data is.

    ``shm`` names the worker's shared-memory segment holding the part (same host); when it is
    ``None`` the data (if the op carries any) is the next raw frame of the message. ``comp``, on a
    pushed entry, is the metadata of an encoded payload (plain scalars, ``payload_meta``; what they
    mean is the compressor's business, ``compression/codec.py``): the frame then holds the packed
    bytes, not ``size`` raw values. (A named tuple: messages build and read several per round.)
    """

    key: Key
    part: int
    size: int
    dtype: str
    shm: str | None = None
    comp: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"k": self.key, "p": self.part, "n": self.size, "dt": self.dtype}
        if self.shm is not None:
            d["shm"] = self.shm
        if self.comp is not None:
            d["c"] = self.comp
        return d


def entry(e: Any) -> Entry:
    """One entry of a received header, validated (``WireError`` otherwise)."""
    if type(e) is not dict:
        raise WireError("entry is not an object")
    key: Any = e.get("k")
    part: Any = e.get("p")
    size: Any = e.get("n")
    dtype: Any = e.get("dt")
    shm: Any = e.get("shm")
    comp: Any = e.get("c")
    kind = type(key)
    if not (kind is int or (kind is str and len(key) <= MAX_KEY_LEN)):
        raise WireError(f"bad key {key!r}")
    if type(part) is not int or not 0 <= part < 4096:
        raise WireError("bad part index")
    if type(size) is not int or not 0 <= size <= MAX_ELEMENTS:
        raise WireError("bad element count")
    if type(dtype) is not str or dtype not in DTYPES:
        raise WireError(f"unsupported dtype {dtype!r}")
    if shm is not None and not (type(shm) is str and SHM_NAME.match(shm)):
        raise WireError("bad shared-memory segment name")
    if comp is not None:
        comp = payload_meta(comp)
        if shm is not None:
            raise WireError("a compressed payload travels as a frame, not in shared memory")
    return Entry(key, part, size, dtype, shm, comp)


def payload_meta(meta: Any) -> dict[str, Any]:
    """An encoded payload's metadata as received: an object of at most ``MAX_META`` plain scalars
    (the wire bounds it; the codec that reads it checks what it means)."""
    if not isinstance(meta, dict) or len(meta) > MAX_META:
        raise WireError("bad payload metadata")
    for k, v in meta.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str | int | float | bool)):
            raise WireError("bad payload metadata")
    return dict(meta)


#: what every node of a parameter-server job decodes: the node layer's kinds and the server's
SCHEMA = NODE_SCHEMA | wire.Schema(PS_OPS, entry)
OPS = SCHEMA.kinds
assert OPS is not None


def decode(frame: bytes | bytearray | memoryview) -> Header:
    """Parse and validate one header frame of this protocol (``WireError`` on anything unexpected)."""
    return wire.decode(frame, SCHEMA)


class Decoder(wire.Decoder):
    """The envelope's remembering decoder, for this protocol."""

    def __init__(self, size: int = 256) -> None:
        super().__init__(SCHEMA, size)


def state_body(h: Header) -> tuple[list[str], list[tuple[Key, int, str, int | float]]]:
    """The ``slots`` (one per entry) and ``scalars`` (``[key, part, slot, number]``) of a
    ``get_state`` reply or a ``set_state`` request, validated; ``WireError`` otherwise."""
    slots = h.body.get("slots", [])
    if not isinstance(slots, list) or len(slots) != len(h.entries):
        raise WireError("slots must be a list with one name per entry")
    for name in slots:
        if not isinstance(name, str) or not STATE_SLOT.match(name):
            raise WireError(f"bad state slot {name!r}")
    raw = h.body.get("scalars", [])
    if not isinstance(raw, list) or len(raw) > 4096 * 16:
        raise WireError("scalars must be a list")
    scalars: list[tuple[Key, int, str, int | float]] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 4):
            raise WireError("a state scalar is [key, part, slot, number]")
        key, part, name, value = item
        if not (is_int(key) or (isinstance(key, str) and len(key) <= MAX_KEY_LEN)):
            raise WireError(f"bad key {key!r}")
        if not is_int(part) or not 0 <= part < 4096:
            raise WireError("bad part index")
        if not isinstance(name, str) or not STATE_SLOT.match(name) or name == "value":
            raise WireError(f"bad state slot {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"state scalar {name!r} is not a number")
        scalars.append((key, part, name, value))
    return list(slots), scalars
