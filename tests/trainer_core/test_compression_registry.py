"""The compressor registry: params in MXNet's style, clear errors, fresh state per key."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core import compression
from trainer_core.compression import get_compressor


def test_available_names():
    assert compression.available() == ["1bit", "2bit", "none", "powersgd", "topk"]


@pytest.mark.parametrize(
    ("params", "cls", "attrs"),
    [
        ({"type": "2bit", "threshold": 0.5}, "TwoBit", {"threshold": 0.5}),
        ({"type": "2bit"}, "TwoBit", {"threshold": 0.5}),
        ({"type": "2bit", "threshold": 2}, "TwoBit", {"threshold": 2.0}),
        ({"type": "1bit"}, "OneBit", {"block_size": 2048}),
        ({"type": "1bit", "block_size": 64}, "OneBit", {"block_size": 64}),
        ({"type": "topk", "ratio": 0.1}, "TopK", {"ratio": 0.1}),
        ({"type": "powersgd"}, "PowerSGD", {"rank": 4, "seed": 0}),
        ({"type": "powersgd", "rank": 2, "seed": 5}, "PowerSGD", {"rank": 2, "seed": 5}),
        ({"type": "none"}, "Identity", {}),
        (None, "Identity", {}),
    ],
)
def test_get_compressor(params, cls, attrs):
    c = get_compressor(params)
    assert type(c).__name__ == cls
    for k, v in attrs.items():
        assert getattr(c, k) == v
    assert c.residual is None
    # params() rebuilds an equal compressor
    again = get_compressor(c.params())
    assert type(again) is type(c) and again.params() == c.params()


def test_each_call_is_a_fresh_object_with_its_own_residual():
    a = get_compressor({"type": "2bit"})
    b = get_compressor({"type": "2bit"})
    a.encode(np.full(4, 0.3, np.float32))
    assert a.residual is not None and b.residual is None


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"type": "3bit"}, "unknown compression type '3bit'"),
        ({"type": 2}, "unknown compression type 2"),
        ({}, "need a 'type'"),
        ("2bit", "must be a dict"),
        ({"type": "2bit", "threshold": 0}, "threshold"),
        ({"type": "2bit", "threshold": -1.0}, "threshold"),
        ({"type": "2bit", "threshold": float("nan")}, "threshold"),
        ({"type": "2bit", "threshold": "0.5"}, "threshold"),
        ({"type": "2bit", "threshold": True}, "threshold"),
        ({"type": "2bit", "ratio": 0.1}, r"no parameter\(s\) \['ratio'\]"),
        ({"type": "1bit", "block_size": 12}, "multiple of 8"),
        ({"type": "1bit", "block_size": 0}, "multiple of 8"),
        ({"type": "1bit", "block_size": 16.0}, "multiple of 8"),
        ({"type": "topk", "ratio": 0}, "ratio"),
        ({"type": "topk", "ratio": 1.5}, "ratio"),
        ({"type": "none", "threshold": 0.5}, "no parameter"),
        ({"type": "powersgd", "rank": 0}, "rank"),
        ({"type": "powersgd", "rank": 2.0}, "rank"),
        ({"type": "powersgd", "seed": "x"}, "seed"),
        ({"type": "2bit", "kernel": "fortran"}, "kernel"),
    ],
)
def test_bad_params_raise_value_error(params, match):
    with pytest.raises(ValueError, match=match):
        get_compressor(params)


def test_unsupported_dtype_is_a_type_error():
    c = get_compressor({"type": "2bit"})
    with pytest.raises(TypeError, match="int32"):
        c.encode(np.zeros(4, np.int32))
    with pytest.raises(TypeError):
        c.decode(np.zeros(4, np.uint8), {"type": "2bit", "threshold": 0.5}, (4,), np.int64)


def test_one_compressor_per_key():
    c = get_compressor({"type": "1bit"})
    c.encode(np.ones(10, np.float32))
    with pytest.raises(ValueError, match="one compressor per key"):
        c.encode(np.ones(11, np.float32))
    c.reset()
    c.encode(np.ones(11, np.float32))  # fine after reset


def test_decode_checks_the_type_and_module_level_decode_dispatches():
    g = np.linspace(-1, 1, 40, dtype=np.float32)
    c = get_compressor({"type": "2bit", "threshold": 0.25})
    payload, meta = c.encode(g)
    with pytest.raises(ValueError, match="cannot decode"):
        get_compressor({"type": "1bit"}).decode(payload, meta, g.shape, g.dtype)
    np.testing.assert_array_equal(
        compression.decode(payload, meta, g.shape, g.dtype), c.decode(payload, meta, 40, g.dtype)
    )
    with pytest.raises(ValueError, match="unknown compression type"):
        compression.decode(payload, {"type": "zip"}, g.shape, g.dtype)
    # payload as plain bytes works too
    np.testing.assert_array_equal(
        compression.decode(bytes(payload), meta, (5, 8), np.float32),
        c.decode(payload, meta, (5, 8), np.float32),
    )


def test_meta_is_plain_data():
    g = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    for name in compression.available():
        _, meta = get_compressor({"type": name}).encode(g)
        assert meta["type"] == name
        for v in meta.values():
            assert type(v) in (int, float, str)


def test_ratios():
    n = 1_000_000
    assert compression.ratio({"type": "2bit"}, n) == 16.0
    assert 30.0 < compression.ratio({"type": "1bit"}, n) < 32.0
    assert compression.ratio({"type": "topk", "ratio": 0.01}, n) == 50.0
    assert compression.ratio(None, n) == 1.0
    assert compression.ratio({"type": "powersgd", "rank": 4}, 1024 * 3072, shape=(1024, 3072)) == 192.0
    assert compression.ratio({"type": "powersgd", "rank": 4}, 1024 * 3072) == 1.0  # no shape: raw


def test_kernel_numba_when_missing(monkeypatch):
    from trainer_core.compression import _fast

    monkeypatch.setattr(_fast, "numba", None)
    with pytest.raises(ValueError, match="numba"):
        get_compressor({"type": "2bit", "kernel": "numba"})
    # auto falls back to numpy and still works
    c = get_compressor({"type": "2bit"})
    payload, meta = c.encode(np.ones(8, np.float32))
    assert c.decode(payload, meta, (8,), np.float32).tolist() == [0.5] * 8


def test_decode_into_out():
    g = np.random.default_rng(1).standard_normal((6, 7)).astype(np.float32)
    for name in compression.available():
        c = get_compressor({"type": name})
        payload, meta = c.encode(g)
        out = np.full((6, 7), 99.0, np.float32)
        res = c.decode(payload, meta, g.shape, g.dtype, out=out)
        assert res.base is out or res is out
        np.testing.assert_array_equal(out, c.decode(payload, meta, g.shape, g.dtype))
        with pytest.raises(ValueError, match="C-contiguous"):
            c.decode(payload, meta, g.shape, g.dtype, out=np.empty(5, np.float32))


def test_decode_from_an_unaligned_received_buffer():
    """A payload that arrives inside a larger frame, at an odd address, decodes the same."""
    g = np.random.default_rng(2).standard_normal((50, 100)).astype(np.float32)
    for name in compression.available():
        payload, meta = get_compressor({"type": name}).encode(g)
        buf = np.frombuffer(b"x" + payload.tobytes(), np.uint8)[1:]
        assert buf.ctypes.data % 4 != 0
        np.testing.assert_array_equal(
            compression.decode(buf, meta, g.shape, g.dtype),
            compression.decode(payload, meta, g.shape, g.dtype),
        )


def test_state_dict_resumes_exactly():
    """A compressor rebuilt from ``state_dict`` (as after a checkpoint) continues bit for bit."""
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal((30, 40)).astype(np.float32) for _ in range(4)]
    for name in compression.available():
        a = get_compressor({"type": name})
        for g in grads[:2]:
            a.encode(g)
        state = {k: v.copy() for k, v in a.state_dict().items()}
        b = get_compressor(a.params())
        b.load_state_dict(state)
        for g in grads[2:]:
            pa, ma = a.encode(g)
            pb, mb = b.encode(g)
            assert ma == mb and pa.tobytes() == pb.tobytes(), name
    assert get_compressor({"type": "2bit"}).state_dict() == {}


@pytest.mark.parametrize(
    "name, missing", [("topk", "k"), ("powersgd", "rank"), ("1bit", "block_size"), ("2bit", "threshold")]
)
def test_codec_decode_with_a_parameter_missing_from_the_metadata_is_a_compression_error(name, missing):
    """A received payload whose metadata lacks what its compressor needs is refused as bad input
    (a ``CompressionError`` naming the field), never a ``KeyError`` out of the server's handler."""
    from trainer_core.compression.codec import decode
    from trainer_core.errors import CompressionError

    with pytest.raises(CompressionError, match=f"lacks '{missing}'"):
        decode(bytes(64), {"type": name}, 10, "float32")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_encode_with_plus_is_encoding_the_sum(dtype):
    """``encode(g, plus=g2)``: the payload and residual of ``encode(g + g2)``, for every compressor
    (a kernel that reads both, or the sum formed first); a ``plus`` unlike ``g`` is refused."""
    rng = np.random.default_rng(4)
    for name in compression.available():
        if name == "powersgd":
            continue  # a matrix's factors: the collectives allreduce them, never a sum of two
        one, two = get_compressor({"type": name}), get_compressor({"type": name})
        for _ in range(2):
            g, g2 = (rng.standard_normal(3000).astype(dtype) for _ in range(2))
            p1, m1 = one.encode(g + g2)
            p2, m2 = two.encode(g, plus=g2)
            assert (bytes(np.asarray(p1)), m1) == (bytes(np.asarray(p2)), m2), name
            if one.stateful:
                assert one.residual.tobytes() == two.residual.tobytes(), name
        with pytest.raises(ValueError, match=r"plus \(2999 x .*\) must be like the gradient"):
            two.encode(g, plus=g2[1:])
