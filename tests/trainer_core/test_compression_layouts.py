"""Exact packed layouts (docs/wire.md, "Compressed payloads"), checked byte by byte on both kernels."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.compression import _fast, get_compressor

KERNELS = ["numpy", "numba"] if _fast.available() else ["numpy"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_2bit_layout_is_mxnets(kernel):
    # codes: +t -> 11, -t -> 10, 0 -> 00; 4 per byte, first element in the high bits
    g = np.array([0.6, -0.7, 0.1, 0.5, -0.5, 0.0, 0.0, 1.0, -0.49], dtype=np.float32)
    c = get_compressor({"type": "2bit", "threshold": 0.5, "kernel": kernel})
    payload, meta = c.encode(g)
    assert meta == {"type": "2bit", "threshold": 0.5}
    assert payload.dtype == np.uint8 and payload.shape == (4,)  # one 32-bit word holds 16 values
    assert payload.tolist() == [0b11_10_00_11, 0b10_00_00_11, 0b00_000000, 0]
    np.testing.assert_allclose(
        c.residual, np.array([0.1, -0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.5, -0.49], np.float32), atol=1e-7
    )
    dec = c.decode(payload, meta, g.shape, np.float32)
    assert dec.tolist() == [0.5, -0.5, 0.0, 0.5, -0.5, 0.0, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_2bit_residual_accumulates_like_mxnet(kernel):
    # 0.3 twice: first step sends nothing, second step sends +0.5 and keeps 0.1
    c = get_compressor({"type": "2bit", "threshold": 0.5, "kernel": kernel})
    g = np.full(3, 0.3, np.float32)
    p1, _ = c.encode(g)
    assert p1.tolist() == [0, 0, 0, 0]
    p2, _ = c.encode(g)
    assert p2.tolist() == [0b11_11_11_00, 0, 0, 0]
    np.testing.assert_allclose(c.residual, np.full(3, 0.1, np.float32), atol=1e-7)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 33, 1000])
def test_2bit_payload_size(n):
    c = get_compressor({"type": "2bit"})
    payload, _ = c.encode(np.ones(n, np.float32))
    assert payload.nbytes == c.wire_bytes(n) == 4 * -(-n // 16)


@pytest.mark.parametrize("kernel", ["numpy", "auto"])
def test_2bit_code_01_reads_as_nan(kernel):
    """Code 01 is what a non-finite value is sent as (finite values never write it)."""
    c = get_compressor({"type": "2bit", "kernel": kernel})
    meta = {"type": "2bit", "threshold": 1.0}
    out = c.decode(np.array([0b01_11_10_00, 0b01_000000], np.uint8), meta, (5,), np.float32)
    assert np.isnan(out[0]) and np.isnan(out[4]) and out[1:4].tolist() == [1, -1, 0]


def test_2bit_threshold_is_rounded_to_the_gradient_dtype():
    c = get_compressor({"type": "2bit", "threshold": 0.1})
    _, meta = c.encode(np.ones(3, np.float16))
    assert meta["threshold"] == float(np.float16(0.1))
    _, meta = get_compressor({"type": "2bit", "threshold": 0.1}).encode(np.ones(3, np.float32))
    assert meta["threshold"] == float(np.float32(0.1))


@pytest.mark.parametrize("kernel", KERNELS)
def test_1bit_layout(kernel):
    # two blocks of 8: values first (float32 pairs: bit-0 value, bit-1 value), then packbits order
    g = np.array([1, -1, 3, -3, 0, 2, -2, 0, 5, 5, 5, 5, 5, 5, 5, 5, -1, 1], dtype=np.float32)
    c = get_compressor({"type": "1bit", "block_size": 8, "kernel": kernel})
    payload, meta = c.encode(g)
    assert meta == {"type": "1bit", "block_size": 8}
    assert payload.nbytes == c.wire_bytes(g.size) == 8 * 3 + 3
    vals = payload[:24].view("<f4").tolist()
    # block 0: negatives -1,-3,-2 -> -2; non-negatives 1,3,0,2,0 -> 1.2
    assert vals[0] == -2.0 and vals[1] == pytest.approx(1.2)
    assert vals[2:4] == [0.0, 5.0]  # block 1: no negatives -> 0
    assert vals[4:6] == [-1.0, 1.0]  # block 2 (short): -1 and 1
    assert payload[24:].tolist() == [0b10101101, 0b11111111, 0b01000000]
    assert payload[24:].tolist() == np.packbits(g >= 0).tolist()
    np.testing.assert_allclose(
        c.residual,
        g
        - np.where(g >= 0, np.repeat([np.float32(1.2), 5, 1], [8, 8, 2]), np.repeat([-2, 0, -1], [8, 8, 2])),
        atol=1e-6,
    )
    dec = c.decode(payload, meta, g.shape, np.float32)
    assert dec[:8].tolist() == [
        np.float32(1.2),
        -2,
        np.float32(1.2),
        -2,
        np.float32(1.2),
        np.float32(1.2),
        -2,
        np.float32(1.2),
    ]
    assert dec[8:].tolist() == [5.0] * 8 + [-1.0, 1.0]


@pytest.mark.parametrize("n", [1, 7, 8, 9, 2048, 2049, 5000])
def test_1bit_payload_size(n):
    c = get_compressor({"type": "1bit"})
    payload, _ = c.encode(np.linspace(-1, 1, n, dtype=np.float32))
    assert payload.nbytes == c.wire_bytes(n) == 8 * -(-n // 2048) + -(-n // 8)


def test_1bit_rejects_a_short_payload():
    c = get_compressor({"type": "1bit"})
    payload, meta = c.encode(np.ones(100, np.float32))
    with pytest.raises(ValueError, match="does not hold"):
        c.decode(payload[:-1], meta, (100,), np.float32)


def test_topk_layout():
    g = np.array([0.1, -5.0, 0.2, 3.0, -0.3, 0.0, 4.0, 0.05], dtype=np.float32)
    c = get_compressor({"type": "topk", "ratio": 0.375})  # k = 3
    payload, meta = c.encode(g)
    assert meta == {"type": "topk", "ratio": 0.375, "k": 3}
    assert payload.nbytes == 24 == c.wire_bytes(8)
    assert payload[:12].view("<u4").tolist() == [1, 3, 6]
    assert payload[12:].view("<f4").tolist() == [-5.0, 3.0, 4.0]
    np.testing.assert_array_equal(c.residual, np.where(np.isin(np.arange(8), [1, 3, 6]), 0, g))
    assert c.decode(payload, meta, (2, 4), np.float64).ravel().tolist() == [0, -5, 0, 3, 0, 0, 4, 0]


def test_topk_rejects_bad_payloads():
    c = get_compressor({"type": "topk", "ratio": 0.5})
    payload, meta = c.encode(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="k=2"):
        c.decode(payload[:8], meta, (4,), np.float32)
    with pytest.raises(ValueError, match="beyond"):
        c.decode(payload, meta, (3,), np.float32)


def test_none_is_the_raw_little_endian_bytes():
    g = np.arange(5, dtype=np.float64)
    c = get_compressor({"type": "none"})
    payload, meta = c.encode(g)
    assert payload.tobytes() == g.astype("<f8").tobytes()
    assert c.residual is None
    np.testing.assert_array_equal(c.decode(payload, meta, (5,), np.float64), g)
