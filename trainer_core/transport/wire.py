"""The wire format (docs/wire.md): one JSON header frame, then raw array frames.

Encoding and decoding are pure. Nothing received is ever unpickled or evaluated: the header
is parsed as JSON and checked field by field against the schema below; anything else raises
``WireError`` and the message is dropped by the caller.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import re
from typing import Any, NamedTuple

from trainer_core.errors import WireError

VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_KEY_LEN = 256
MAX_ELEMENTS = 1 << 36
MAX_META = 16  # fields of an encoded payload's metadata

# operations: scheduler protocol
REGISTER, BOOK, HEARTBEAT, HEARTBEAT_ACK = "register", "book", "hb", "hb_ack"
BARRIER, BARRIER_DONE, FINISH, FINISHED = "barrier", "barrier_done", "finish", "finished"
ABORT, TERMINATE = "abort", "terminate"
# operations: worker -> server and replies
INIT, PUSH, PULL, PUSHPULL = "init", "push", "pull", "pushpull"
SET_MODE, SET_OPTIMIZER, SET_COMPRESSION = "set_mode", "set_optimizer", "set_compression"
GET_STATE, SET_STATE = "get_state", "set_state"  # servers' per-key state, for checkpoints
REPLY, ERROR = "reply", "error"

OPS = frozenset(
    {
        REGISTER, BOOK, HEARTBEAT, HEARTBEAT_ACK, BARRIER, BARRIER_DONE, FINISH, FINISHED, ABORT, TERMINATE,
        INIT, PUSH, PULL, PUSHPULL, SET_MODE, SET_OPTIMIZER, SET_COMPRESSION, GET_STATE, SET_STATE,
        REPLY, ERROR,
    }
)  # fmt: skip
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


class Header(NamedTuple):
    """The decoded header frame. ``body`` holds the op-specific plain-data fields (read, never
    changed: the default is shared). (A named tuple: each message builds or reads one.)"""

    op: str
    seq: int = 0
    src: str = ""
    entries: tuple[Entry, ...] = ()
    body: dict[str, Any] = {}  # noqa: RUF012  (read-only, see above)


_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DECODER = json.JSONDecoder()
_SCAN: Any = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]  # (typeshed) JSONDecoder's parser


def _not_json(o: Any) -> Any:
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


# One compiled encoder for every header (``JSONEncoder.encode`` builds one per call); plain data
# only (no circular check: headers are built here from plain values). Where the C accelerator is
# missing, the encoder's own ``encode``.
_C_MAKE: Any = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (
    None
    if _C_MAKE is None
    else _C_MAKE(None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
)


def _json(d: dict[str, Any]) -> str:
    return "".join(_C_ENCODE(d, 0)) if _C_ENCODE is not None else _ENCODER.encode(d)


def encode(header: Header) -> bytes:
    """The header frame's bytes (UTF-8 JSON; ``seq`` last, see ``Decoder``)."""
    d: dict[str, Any] = {"v": VERSION, "op": header.op, "src": header.src}
    if header.entries:
        d["e"] = [e.to_json() for e in header.entries]
    if header.body:
        d["b"] = header.body
    d["seq"] = header.seq
    return _json(d).encode()


def _parse(text: str) -> Any:
    """One JSON document filling ``text`` exactly (``ValueError`` otherwise)."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration as stop:
        raise ValueError(f"no JSON value at {stop.value}") from None
    if end != len(text):
        raise ValueError(f"extra data at {end}")
    return value


def decode(frame: bytes | bytearray | memoryview) -> Header:
    """Parse and validate one header frame; raises ``WireError`` on anything unexpected."""
    if len(frame) > MAX_HEADER_BYTES:
        raise WireError("header frame too large")
    try:
        d = _parse((frame if isinstance(frame, bytes | bytearray) else bytes(frame)).decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    if type(d) is not dict:
        raise WireError("header is not a JSON object")
    if d.get("v") != VERSION:
        raise WireError(f"unsupported wire version {d.get('v')!r}")
    op = d.get("op")
    if type(op) is not str or op not in OPS:  # (an unhashable op must not reach the set)
        raise WireError(f"unknown op {op!r}")
    seq = d.get("seq", 0)
    src = d.get("src", "")
    # JSON numbers decode to exact ints (never bools): ``type(...) is int`` is the integer check
    if type(seq) is not int or seq < 0 or type(src) is not str or len(src) > 64:
        raise WireError("bad seq or src")
    body = d.get("b")
    if body is None:
        body = {}
    elif type(body) is not dict:
        raise WireError("body is not an object")
    raw_entries = d.get("e")
    if raw_entries is None:
        entries: tuple[Entry, ...] = ()
    elif type(raw_entries) is list:
        entries = tuple(map(_entry, raw_entries))
    else:
        raise WireError("entries is not a list")
    return Header(op, seq, src, entries, body)


_SEQ_LAST = b',"seq":'
_CACHED_PREFIX_BYTES = 2048
#: the longest frame ``Decoder`` remembers: a prefix, then ``,"seq":`` with at most 18 digits and ``}``
_CACHED_FRAME_BYTES = _CACHED_PREFIX_BYTES + len(_SEQ_LAST) + 18 + 1


class Decoder:
    """``decode`` that remembers recent headers by everything but their ``seq``.

    A worker's requests and a server's replies repeat round after round, byte for byte, but for
    the sequence number; ``encode`` writes it last. A frame that ends in ``,"seq":<digits>}`` and
    whose bytes before that were decoded (and validated) before is the same header with that
    ``seq``: it is not parsed again. Anything else is decoded in full. The headers returned share
    their ``entries`` and ``body`` (read, never changed). One per node (``Trace``), at most
    ``size`` remembered."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._seen: dict[bytes, Header] = {}

    def decode(self, frame: bytes | bytearray | memoryview) -> Header:
        if len(frame) > _CACHED_FRAME_BYTES:
            return decode(frame)  # (not remembered: no copy or search of a long frame)
        raw = frame if type(frame) is bytes else bytes(frame)
        cut = raw.rfind(_SEQ_LAST)
        digits = raw[cut + len(_SEQ_LAST) : -1] if cut > 0 and raw[-1:] == b"}" else b""
        if not (0 < len(digits) < 19 and digits.isdigit() and (digits[0] != 48 or len(digits) == 1)):
            return decode(raw)  # (48: a leading "0", which JSON forbids)
        prefix = raw[:cut]
        seen = self._seen.get(prefix)
        if seen is not None:
            return Header(seen.op, int(digits), seen.src, seen.entries, seen.body)
        header = decode(raw)
        if len(self._seen) >= self.size:
            self._seen.clear()
        self._seen[prefix] = header
        return header


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry(e: Any) -> Entry:
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


def body_str(h: Header, name: str, default: str | None = None) -> str:
    """A string field of the body, or ``WireError``."""
    v = h.body.get(name, default)
    if not isinstance(v, str):
        raise WireError(f"field {name!r} missing or not a string")
    return v


def body_int(h: Header, name: str, default: int | None = None) -> int:
    """An integer field of the body, or ``WireError``."""
    v = h.body.get(name, default)
    if not _is_int(v):
        raise WireError(f"field {name!r} missing or not an integer")
    assert isinstance(v, int)
    return v


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
        if not (_is_int(key) or (isinstance(key, str) and len(key) <= MAX_KEY_LEN)):
            raise WireError(f"bad key {key!r}")
        if not _is_int(part) or not 0 <= part < 4096:
            raise WireError("bad part index")
        if not isinstance(name, str) or not STATE_SLOT.match(name) or name == "value":
            raise WireError(f"bad state slot {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"state scalar {name!r} is not a number")
        scalars.append((key, part, name, value))
    return list(slots), scalars
