"""Decoding several payloads into their sum (``Compressor.decode_sum``, the module-level
``compression.decode_sum`` and ``codec.decode_sum``; the compiled 1-bit kernel
``_fast_onebit.onebit_decode_sum``): the same bits as decoding each payload and adding them with numpy in
their order, which is what the compressed allreduce's first stage did before it took one pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core import compression
from trainer_core.compression import _fast, _fast_onebit, codec, get_compressor
from trainer_core.errors import CompressionError

needs_numba = pytest.mark.skipif(not _fast.available(), reason="numba not installed")

#: sizes and blocks: whole blocks only, a short last block, a last block shorter than a byte
SIZES = [(3 * 2048, 2048), (4 * 2048 * 2 + 2048 + 5, 2048), (64 * 7 + 3, 64), (16 * 3 + 9, 16)]


def gradients(kind: str, n: int, dtype: Any, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` gradients: random, wide-ranged (the order of the adds matters), or with non-finite
    values (a block of NaN, and inf - inf in a sum)."""
    out = []
    for j in range(k):
        g = rng.standard_normal(n)
        if kind == "wide":
            g *= 10.0 ** rng.uniform(-30, 30, size=n)
        elif kind == "nonfinite":
            g[rng.integers(0, n, size=2)] = [np.nan, np.inf if j % 2 else -np.inf]
        out.append(g.astype(dtype))
    return out


def payloads(params: dict[str, Any], gs: list[np.ndarray]) -> list[tuple[Any, dict[str, Any]]]:
    """Each gradient encoded by a compressor of its own, twice (the second payload carries the
    first one's residual)."""
    got = []
    for g in gs:
        c = get_compressor(params)
        c.encode(g)
        got.append(c.encode(g[::-1].copy()))
    return got


def reference(pairs: list[tuple[Any, dict[str, Any]]], n: int, dtype: Any) -> np.ndarray:
    """Decode each, add with numpy in their order (the first stage's reduction before)."""
    total = compression.decode(*pairs[0], (n,), dtype).copy()
    for p, m in pairs[1:]:
        np.add(total, compression.decode(p, m, (n,), dtype), out=total)
    return total


@needs_numba
@pytest.mark.parametrize("kind", ["random", "wide", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "block"), SIZES)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_compiled_1bit_decode_sum_is_bit_identical_to_decoding_and_adding(
    k: int, n: int, block: int, dtype: Any, kind: str
) -> None:
    rng = np.random.default_rng(n * k + block)
    pairs = payloads({"type": "1bit", "block_size": block}, gradients(kind, n, dtype, k, rng))
    want = reference(pairs, n, dtype)
    out = np.full(n, 7.0, dtype)
    c = get_compressor({"type": "1bit", "kernel": "numba"})
    assert c.decode_sum(pairs, n, dtype, out) is out
    assert out.tobytes() == want.tobytes()
    numpy_path = get_compressor({"type": "1bit", "kernel": "numpy"})
    assert numpy_path.decode_sum(pairs, n, dtype, np.empty(n, dtype)).tobytes() == want.tobytes()


@needs_numba
def test_the_1bit_kernel_takes_one_pass_and_no_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled path runs its kernel once and never decodes a payload on its own."""
    n, k = 5000, 3
    rng = np.random.default_rng(1)
    pairs = payloads({"type": "1bit"}, gradients("random", n, np.float32, k, rng))
    want = reference(pairs, n, np.float32)
    calls = {"sum": 0}
    kernel = _fast_onebit.onebit_decode_sum

    def counted(*a: Any) -> Any:
        calls["sum"] += 1
        return kernel(*a)

    def refused(*a: Any) -> Any:
        raise AssertionError("decoded one payload alone")

    monkeypatch.setattr(_fast_onebit, "onebit_decode_sum", counted)
    monkeypatch.setattr(_fast_onebit, "onebit_decode", refused)
    out = compression.decode_sum(pairs, n, np.float32, np.empty(n, np.float32), scratch=None)
    assert calls["sum"] == 1 and out.tobytes() == want.tobytes()


@needs_numba
def test_the_1bit_kernel_keeps_the_payloads_rows_in_the_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a scratch that holds them, the payloads' values and bits are copied into it (no fresh
    arrays to fault in on every call); a scratch too small for them is left alone."""
    n, k = 5000, 3
    rng = np.random.default_rng(3)
    pairs = payloads({"type": "1bit"}, gradients("random", n, np.float32, k, rng))
    want = reference(pairs, n, np.float32)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    kernel = _fast_onebit.onebit_decode_sum

    def watched(vals: Any, bits: Any, block: Any, out: Any) -> Any:
        seen.append((vals, bits))
        return kernel(vals, bits, block, out)

    monkeypatch.setattr(_fast_onebit, "onebit_decode_sum", watched)
    scratch = np.full(n, np.nan, np.float32)
    out = compression.decode_sum(pairs, n, np.float32, np.empty(n, np.float32), scratch)
    assert out.tobytes() == want.tobytes()
    assert np.shares_memory(seen[0][0], scratch) and np.shares_memory(seen[0][1], scratch)
    tiny = np.full(10, np.nan, np.float32)
    out = compression.decode_sum(pairs, n, np.float32, np.empty(n, np.float32), tiny)
    assert out.tobytes() == want.tobytes() and np.isnan(tiny).all()
    assert not np.shares_memory(seen[1][0], tiny)


@pytest.mark.parametrize(
    "params",
    [
        {"type": "1bit", "block_size": 64},
        {"type": "2bit", "threshold": 0.5},
        {"type": "topk", "ratio": 0.05},
        {"type": "none"},
    ],
    ids=lambda p: p["type"],
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_compressor_decode_sum_is_bit_identical_to_decoding_and_adding(
    params: dict[str, Any], dtype: Any
) -> None:
    n, k = 1001, 3
    rng = np.random.default_rng(5)
    pairs = payloads(params, gradients("random", n, dtype, k, rng))
    want = reference(pairs, n, dtype)
    for scratch in (None, np.empty(n, dtype)):
        out = np.full(n, np.nan, dtype)
        compression.decode_sum(pairs, n, dtype, out, scratch)
        assert out.tobytes() == want.tobytes()
    # as the links deliver them: inside a larger frame, at an odd address
    frames = [(np.frombuffer(b"x" + bytes(np.asarray(p)), np.uint8)[1:], m) for p, m in pairs]
    out = codec.decode_sum(frames, n, dtype, np.empty(n, dtype), np.empty(n, dtype))
    assert out.tobytes() == want.tobytes()


def test_payloads_of_several_block_sizes_take_the_general_path() -> None:
    n = 3000
    rng = np.random.default_rng(2)
    gs = gradients("random", n, np.float32, 2, rng)
    pairs = payloads({"type": "1bit", "block_size": 64}, gs[:1]) + payloads({"type": "1bit"}, gs[1:])
    out = compression.decode_sum(pairs, n, np.float32, np.empty(n, np.float32))
    assert out.tobytes() == reference(pairs, n, np.float32).tobytes()


def test_refusals() -> None:
    n = 100
    g = np.linspace(-1, 1, n, dtype=np.float32)
    one = get_compressor({"type": "1bit"}).encode(g)
    two = get_compressor({"type": "2bit"}).encode(g)
    out = np.empty(n, np.float32)
    with pytest.raises(ValueError, match=r"of one type, not of \['1bit', '2bit'\]"):
        compression.decode_sum([one, two], n, np.float32, out)
    with pytest.raises(ValueError, match="one or more payloads"):
        compression.decode_sum([], n, np.float32, out)
    with pytest.raises(ValueError, match="unknown compression type 'zip'"):
        compression.decode_sum([(one[0], {"type": "zip"})], n, np.float32, out)
    with pytest.raises(ValueError, match="1bit cannot decode a payload of type '2bit'"):
        get_compressor({"type": "1bit"}).decode_sum([two], n, np.float32, out)
    with pytest.raises(ValueError, match="C-contiguous float32 array of 100 values"):
        compression.decode_sum([one], n, np.float32, np.empty(99, np.float32))
    with pytest.raises(CompressionError, match="cannot decode 1bit payloads: 1bit payload of 17 bytes"):
        codec.decode_sum([one, (one[0][:17], one[1])], n, np.float32, out)
    with pytest.raises(CompressionError, match="its metadata lacks 'block_size'"):
        codec.decode_sum([one, (one[0], {"type": "1bit"})], n, np.float32, out)


@needs_numba
@pytest.mark.parametrize("kind", ["random", "wide", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "block"), [*SIZES, (4 * 2048 * 3 + 2048 + 5, 2048), (4 * 8 * 9 + 3, 8)])
@pytest.mark.parametrize(("k", "divisor"), [(1, 1), (3, 1), (3, 6), (2, 2)])
def test_encoding_a_sum_of_payloads_is_encoding_their_decoded_sum(
    k: int, divisor: int, n: int, block: int, dtype: Any, kind: str
) -> None:
    """``encode_payload_sum`` (the compiled ``onebit_sum_encode``: never writes the sum) gives the
    payload and residual of ``decode_sum``, numpy's division and ``encode``, step after step."""
    rng = np.random.default_rng(n * k + block + divisor)
    params = {"type": "1bit", "block_size": block, "kernel": "numba"}
    fused, plain = get_compressor(params), get_compressor(params)
    for _ in range(3):
        pairs = payloads({"type": "1bit", "block_size": block}, gradients(kind, n, dtype, k, rng))
        assert fused.encodes_payload_sum(pairs, dtype)
        total = reference(pairs, n, dtype) if k > 1 else compression.decode(*pairs[0], (n,), dtype).copy()
        if divisor != 1:
            np.divide(total, np.dtype(dtype).type(divisor), out=total)
        want, want_meta = plain.encode(total)
        got, meta = fused.encode_payload_sum(pairs, n, dtype, divisor)
        assert meta == want_meta and np.asarray(got).tobytes() == np.asarray(want).tobytes()
        assert fused.residual.tobytes() == plain.residual.tobytes()


def test_only_the_compiled_1bit_kernel_encodes_a_sum_of_payloads() -> None:
    n = 1000
    rng = np.random.default_rng(4)
    pairs = payloads({"type": "1bit", "block_size": 64}, gradients("random", n, np.float32, 2, rng))
    one = get_compressor({"type": "1bit", "block_size": 64})
    assert one.encodes_payload_sum(pairs, np.float32) == _fast.available()
    assert not one.encodes_payload_sum(pairs, np.float16)
    assert not one.encodes_payload_sum([], np.float32)
    assert not get_compressor({"type": "1bit", "block_size": 64, "kernel": "numpy"}).encodes_payload_sum(
        pairs, np.float32
    )
    assert not get_compressor({"type": "1bit", "block_size": 128}).encodes_payload_sum(pairs, np.float32)
    two = payloads({"type": "2bit"}, gradients("random", n, np.float32, 2, rng))
    assert not get_compressor({"type": "2bit"}).encodes_payload_sum(two, np.float32)
    with pytest.raises(ValueError, match="no kernel"):
        get_compressor({"type": "2bit"}).encode_payload_sum(two, n, np.float32)
