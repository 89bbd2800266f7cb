"""The metrics wire (dmlc_env.telemetry): what decodes, and everything that must not."""

from __future__ import annotations

import hashlib
import hmac
import json

from hypothesis import given
from hypothesis import strategies as st

from dmlc_env import telemetry as wire

KEY = wire.metrics_key("s" * 64)


def report(**kw: object) -> wire.Report:
    base: dict = dict(job="j1", role="worker", rank=1, seq=5, t=1.5, figures={"loss": 0.25}, pid=42)
    base.update(kw)
    return wire.Report(**base)


def test_a_report_round_trips() -> None:
    r = report(figures={"loss": 0.25, "bytes_pushed": 4096, "step": 3})
    assert wire.decode(KEY, "j1", wire.encode(KEY, r)) == report(
        figures={"loss": 0.25, "bytes_pushed": 4096.0, "step": 3.0}
    )


def test_the_key_is_derived_not_the_secret() -> None:
    assert wire.metrics_key("abc") != b"abc" and len(wire.metrics_key("abc")) == 32
    assert wire.metrics_key("abc") != wire.metrics_key("abd")


def test_another_secret_or_another_job_is_refused() -> None:
    data = wire.encode(KEY, report())
    assert wire.decode(wire.metrics_key("t" * 64), "j1", data) is None
    assert wire.decode(KEY, "j2", data) is None


def test_a_changed_byte_is_refused() -> None:
    data = bytearray(wire.encode(KEY, report()))
    data[-3] ^= 1
    assert wire.decode(KEY, "j1", bytes(data)) is None


def signed(body: object) -> bytes:
    raw = json.dumps(body).encode()
    return hmac.new(KEY, raw, hashlib.sha256).digest() + raw


GOOD = {"v": 1, "job": "j1", "role": "worker", "rank": 0, "pid": 1, "seq": 1, "t": 1.0, "m": {"loss": 1}}


def test_signed_but_badly_shaped_is_refused() -> None:
    assert wire.decode(KEY, "j1", signed(GOOD)) is not None
    for change in (
        {"v": 2},
        {"role": "admin"},
        {"rank": -1},
        {"rank": "0"},
        {"seq": True},
        {"t": "now"},
        {"m": [1, 2]},
        {"m": {"loss": "1"}},
        {"m": {"loss": True}},
        {"m": {"bad name": 1}},
        {"m": {f"f{i}": i for i in range(wire.MAX_FIGURES + 1)}},
    ):
        assert wire.decode(KEY, "j1", signed({**GOOD, **change})) is None, change
    assert wire.decode(KEY, "j1", signed([1, 2])) is None
    nan = signed(GOOD).replace(b'"loss": 1', b'"loss": NaN')
    assert wire.decode(KEY, "j1", nan) is None  # re-signed below: the tag is not what refuses it
    raw = nan[wire.TAG_BYTES :]
    assert wire.decode(KEY, "j1", hmac.new(KEY, raw, hashlib.sha256).digest() + raw) is None


def test_oversize_is_refused_both_ways() -> None:
    big = {f"figure_{i:02d}": 1.0e300 for i in range(wire.MAX_FIGURES)}
    try:
        wire.encode(KEY, report(job="j" * 4000, figures=big))
    except ValueError as exc:
        assert "at most" in str(exc)
    else:
        raise AssertionError("an oversize report was encoded")
    padded = signed({**GOOD, "pad": "x" * wire.MAX_DATAGRAM})
    assert wire.decode(KEY, "j1", padded) is None


def test_encode_leaves_out_what_is_not_a_finite_number() -> None:
    r = report(figures={"loss": float("nan"), "acc": float("inf"), "ok": 1, "bad name": 2, "huge": 10**400})
    decoded = wire.decode(KEY, "j1", wire.encode(KEY, r))
    assert decoded is not None and decoded.figures == {"ok": 1.0}


def test_fresh_drops_replays_per_sender() -> None:
    fresh = wire.Fresh()
    assert fresh(report(seq=5))
    assert not fresh(report(seq=5))  # the same datagram again
    assert not fresh(report(seq=4))  # an older one
    assert fresh(report(seq=6))
    assert fresh(report(rank=2, seq=1))  # another sender has its own sequence


@given(st.binary(max_size=5000))
def test_garbage_never_decodes_nor_raises(data: bytes) -> None:
    assert wire.decode(KEY, "j1", data) is None


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=20),
        st.one_of(st.floats(), st.integers(), st.booleans(), st.text(), st.none()),
        max_size=20,
    )
)
def test_any_figures_encode_to_a_valid_report_or_refuse(figures: dict) -> None:
    try:
        data = wire.encode(KEY, report(figures=figures))
    except ValueError:
        return
    decoded = wire.decode(KEY, "j1", data)
    assert decoded is not None
    assert all(wire.figure_name(k) for k in decoded.figures)
