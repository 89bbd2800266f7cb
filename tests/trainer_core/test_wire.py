"""wire.py: round trips, and every malformed header is a WireError (never another exception)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer_core.errors import WireError
from trainer_core.ps import protocol as wire


def test_round_trip() -> None:
    h = wire.Header(
        op=wire.PUSHPULL,
        seq=7,
        src="worker 1",
        entries=(wire.Entry("w", 0, 10, "<f4", "launchkit-j-w1-2-0"), wire.Entry(3, 2, 5, "<f8")),
        body={"rank": 1},
    )
    assert wire.decode(wire.encode(h)) == h


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v":2,"op":"push"}',
        b'{"v":1,"op":"exec"}',
        b'{"v":1,"op":"push","seq":-1}',
        b'{"v":1,"op":"push","seq":true}',
        b'{"v":1,"op":"push","e":[{"k":true,"p":0,"n":1,"dt":"<f4"}]}',
        b'{"v":1,"op":"push","e":[{"k":1,"p":0,"n":1,"dt":"object"}]}',
        b'{"v":1,"op":"push","e":[{"k":1,"p":0,"n":1,"dt":"<f4","shm":"../../etc/passwd"}]}',
        b'{"v":1,"op":"push","e":[{"k":1,"p":0,"n":-5,"dt":"<f4"}]}',
        b'{"v":1,"op":"push","b":[]}',
        b'{"v":1,"op":[]}',  # unhashable values where a set is consulted: not a TypeError
        b'{"v":1,"op":{}}',
        b'{"v":1,"op":"push","e":[{"k":1,"p":0,"n":1,"dt":[]}]}',
        b'{"v":1,"op":"push","e":[{"k":1,"p":0,"n":1,"dt":"<f4","shm":[]}]}',
        b'{"v":1,"op":"push","e":{}}',
    ],
)
def test_malformed_headers_are_rejected(raw: bytes) -> None:
    with pytest.raises(WireError):
        wire.decode(raw)


@given(st.binary(max_size=300))
def test_random_bytes_only_raise_wire_error(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        wire.decode(raw)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=3), c),
        max_leaves=20,
    )
)
def test_random_json_only_raises_wire_error(value: object) -> None:
    doc = {"v": 1, "op": "push", "e": [value], "b": {"rank": value}}
    try:
        h = wire.decode(json.dumps(doc).encode())
    except WireError:
        return
    with pytest.raises(WireError):
        wire.body_str(h, "rank") if not isinstance(value, str) else wire.body_int(h, "rank")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=8,
)


@given(
    st.sampled_from(["v", "op", "seq", "src", "e", "b"]),
    st.sampled_from(["k", "p", "n", "dt", "shm", "c"]),
    _JSON,
)
def test_any_value_in_any_field_only_raises_wire_error(field: str, entry_field: str, value: object) -> None:
    """Every field of the header and of an entry, replaced by any JSON value."""
    entry: dict[str, object] = {"k": "w", "p": 0, "n": 4, "dt": "<f4"}
    doc: dict[str, object] = {"v": 1, "op": "push", "seq": 1, "src": "worker 0", "e": [entry], "b": {}}
    for target, name in ((doc, field), (entry, entry_field)):
        changed = dict(doc, e=[dict(entry)]) if target is doc else dict(doc, e=[dict(entry, **{name: value})])
        if target is doc:
            changed[name] = value
        with contextlib.suppress(WireError):
            wire.decode(json.dumps(changed).encode())


def test_encode_writes_seq_last() -> None:
    raw = wire.encode(wire.Header(wire.PULL, 12, "worker 0", (wire.Entry("w", 0, 4, "<f4"),), {"rank": 0}))
    assert raw.endswith(b',"seq":12}')


def test_the_decoder_remembers_a_header_but_reads_each_seq() -> None:
    d = wire.Decoder()
    h = wire.Header(
        wire.PUSHPULL, 1, "worker 1", (wire.Entry("w", 0, 10, "<f4", "launchkit-j-w1-2-0"),), {"rank": 1}
    )
    for seq in (1, 2, 0, 10**17, 999):
        raw = wire.encode(h._replace(seq=seq))
        assert d.decode(raw) == wire.decode(raw) == h._replace(seq=seq)
    assert len(d._seen) == 1 and d.parsed == 1
    for odd in (b"01", b"-1", b"1.5", b"", b" 1", b"1e3", b"true", b"9" * 30):  # the full decoder's say
        raw = wire.encode(h)[: -len(b"1}")] + odd + b"}"
        assert outcome(d.decode, raw) == outcome(wire.decode, raw)


def outcome(decode: Callable[[bytes], wire.Header], raw: bytes) -> object:
    try:
        return decode(raw)
    except WireError:
        return WireError


def test_the_decoder_decodes_a_long_header_in_full_without_remembering_it() -> None:
    d = wire.Decoder()
    h = wire.Header(wire.PULL, 5, "worker 0", body={"note": "x" * 4000})
    assert d.decode(wire.encode(h)) == h and d.decode(bytearray(wire.encode(h))) == h
    assert not d._seen


def test_the_decoder_forgets_when_full() -> None:
    d = wire.Decoder(size=3)
    for i in range(10):
        d.decode(wire.encode(wire.Header(wire.PULL, i, f"worker {i}")))
        assert len(d._seen) <= 3


@given(st.binary(max_size=40), st.binary(max_size=40), st.integers(0, 10**18))
def test_the_decoder_says_what_decode_says(head: bytes, tail: bytes, seq: int) -> None:
    """Frames around a remembered one (same bytes but the seq, or changed before it, or after it)."""
    d = wire.Decoder()
    base = wire.encode(wire.Header(wire.PUSH, 3, "worker 0", (wire.Entry(7, 1, 4, "<f8"),), {"rank": 0}))
    prefix = base[: base.rfind(b',"seq":')]
    d.decode(base)
    for raw in (prefix + b',"seq":' + str(seq).encode() + b"}", head + base, base + tail, prefix + tail):
        assert outcome(d.decode, raw) == outcome(wire.decode, raw)
