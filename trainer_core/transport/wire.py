"""The message envelope (docs/wire.md): one JSON header frame, then raw frames. Protocol-neutral.

The header is ``{"v": 1, "op": KIND, "src": ..., "e": [ENTRY, ...], "b": {...}, "seq": N}``: a
message kind, the sender's name, a list of entries, a body of plain data and a sequence number.
What the kinds are and what an entry holds is a protocol's business, not the transport's: a
``Schema`` names a protocol's kinds and reads its entries (``trainer_core.node.protocol``: the
scheduler's messages; ``trainer_core.ps.protocol``: the parameter server's, with its entries,
dtypes and state slots). A ``Decoder`` checks each header against the schema it was given.

Encoding and decoding are pure. Nothing received is ever unpickled or evaluated: the header
is parsed as JSON and checked field by field; anything else raises ``WireError`` and the message
is dropped by the caller.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from trainer_core.errors import WireError

VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 1 << 39  # bytes of one raw frame (a stream refuses a longer one before reading it)
Raw = bytes | bytearray | memoryview  # a received header frame
#: a message kind where a schema does not list its kinds (``OPAQUE``)
KIND = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _no_entries(raw: Any) -> Any:
    raise WireError("this protocol's messages carry no entries")


@dataclass(frozen=True)
class Schema:
    """A protocol's vocabulary as the envelope checks it: ``kinds``, the message kinds it knows
    (``None``: any short lower-case name, ``KIND``), and ``entry``, which reads one raw entry of a
    header's list into the protocol's own type or raises ``WireError``. Schemas combine with ``|``
    (a node that speaks two protocols on one channel); at most one of them may read entries."""

    kinds: frozenset[str] | None = None
    entry: Callable[[Any], Any] = _no_entries

    def __or__(self, other: Schema) -> Schema:
        if self.entry is not _no_entries and other.entry is not _no_entries and self.entry is not other.entry:
            raise ValueError("two protocols that both read entries cannot share a channel")
        kinds = None if self.kinds is None or other.kinds is None else self.kinds | other.kinds
        return Schema(kinds, self.entry if self.entry is not _no_entries else other.entry)


#: what a channel accepts when no protocol is named: any kind, no entries
OPAQUE = Schema()


class Header(NamedTuple):
    """The decoded header frame. ``entries`` are the protocol's (each has ``to_json()``); ``body``
    holds the kind-specific plain-data fields (read, never changed: the default is shared). (A
    named tuple: each message builds or reads one.)"""

    op: str
    seq: int = 0
    src: str = ""
    entries: tuple[Any, ...] = ()
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


def decode(frame: bytes | bytearray | memoryview, schema: Schema = OPAQUE) -> Header:
    """Parse and validate one header frame against ``schema``; raises ``WireError`` on anything unexpected."""
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
    kinds = schema.kinds
    # (an unhashable op must not reach the set)
    if type(op) is not str or (op not in kinds if kinds is not None else not KIND.match(op)):
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
        entries: tuple[Any, ...] = ()
    elif type(raw_entries) is list:
        entries = tuple(map(schema.entry, raw_entries))
    else:
        raise WireError("entries is not a list")
    return Header(op, seq, src, entries, body)


_SEQ_LAST = b',"seq":'
_CACHED_PREFIX_BYTES = 2048
#: the longest frame ``Decoder`` remembers: a prefix, then ``,"seq":`` with at most 18 digits and ``}``
_CACHED_FRAME_BYTES = _CACHED_PREFIX_BYTES + len(_SEQ_LAST) + 18 + 1


class Decoder:
    """``decode`` against one ``schema`` that remembers recent headers by everything but their ``seq``.

    A node's requests and replies repeat round after round, byte for byte, but for the sequence
    number; ``encode`` writes it last. A frame that ends in ``,"seq":<digits>}`` and whose bytes
    before that were decoded (and validated) before is the same header with that ``seq``: it is
    not parsed again. Anything else is decoded in full (``parsed`` counts those). The headers
    returned share their ``entries`` and ``body`` (read, never changed). One per channel (its
    peer's headers: a server's working set does not grow with its workers) and one per node for
    a ZeroMQ ROUTER's peers (``Trace``), at most ``size`` remembered."""

    def __init__(self, schema: Schema = OPAQUE, size: int = 256) -> None:
        self.schema = schema
        self.size = size
        self._seen: dict[bytes, Header] = {}
        self.parsed = 0

    def decode(self, frame: bytes | bytearray | memoryview) -> Header:
        if len(frame) > _CACHED_FRAME_BYTES:
            self.parsed += 1
            return decode(frame, self.schema)  # (not remembered: no copy or search of a long frame)
        raw = frame if type(frame) is bytes else bytes(frame)
        cut = raw.rfind(_SEQ_LAST)
        digits = raw[cut + len(_SEQ_LAST) : -1] if cut > 0 and raw[-1:] == b"}" else b""
        if not (0 < len(digits) < 19 and digits.isdigit() and (digits[0] != 48 or len(digits) == 1)):
            self.parsed += 1
            return decode(raw, self.schema)  # (48: a leading "0", which JSON forbids)
        prefix = raw[:cut]
        seen = self._seen.get(prefix)
        if seen is not None:
            return Header(seen.op, int(digits), seen.src, seen.entries, seen.body)
        self.parsed += 1
        header = decode(raw, self.schema)
        if len(self._seen) >= self.size:
            self._seen.clear()
        self._seen[prefix] = header
        return header


def is_int(x: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def body_str(h: Header, name: str, default: str | None = None) -> str:
    """A string field of the body, or ``WireError``."""
    v = h.body.get(name, default)
    if not isinstance(v, str):
        raise WireError(f"field {name!r} missing or not a string")
    return v


def body_int(h: Header, name: str, default: int | None = None) -> int:
    """An integer field of the body, or ``WireError``."""
    v = h.body.get(name, default)
    if not is_int(v):
        raise WireError(f"field {name!r} missing or not an integer")
    assert isinstance(v, int)
    return v
