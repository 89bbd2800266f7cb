"""The non-temporal stores (compression/_fast_stream.py) and their users: ``stream_copy`` and
``kernels.copy_streaming`` copy every byte at every alignment and length (the head and tail
around the 64-byte lines take plain stores), and ``onebit_decode_stream`` writes the values of
``onebit_decode``, bit for bit, which ``OneBit.decode`` runs for a large ``out``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core.compression import _fast, get_compressor, kernels

pytestmark = pytest.mark.skipif(not _fast.available(), reason="numba not installed")


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 200, 4096 + 17])
@pytest.mark.parametrize(("src_at", "dst_at"), [(0, 0), (1, 0), (0, 5), (13, 63)])
def test_stream_copy_copies_every_byte_and_nothing_else(n: int, src_at: int, dst_at: int) -> None:
    from trainer_core.compression import _fast_stream

    rng = np.random.default_rng(n + src_at)
    src = rng.integers(0, 256, n + src_at, dtype=np.uint8)[src_at:]
    room = np.full(n + dst_at + 64, 0xEE, np.uint8)
    dst = room[dst_at : dst_at + n]
    assert _fast_stream.stream_copy(src, dst) is dst
    assert dst.tobytes() == src.tobytes()
    assert (room[:dst_at] == 0xEE).all() and (room[dst_at + n :] == 0xEE).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_copy_streaming_is_copyto(dtype: Any) -> None:
    """Above ``STREAM_BYTES`` through the kernel, below it ``copyto``: the same bytes either way,
    at an address that is not on a line."""
    for n in (1000, kernels.STREAM_BYTES // np.dtype(dtype).itemsize + 3):
        src = np.arange(n + 1, dtype=dtype)[1:]
        dst = np.zeros(n + 1, dtype)[1:]
        kernels.copy_streaming(dst, src)
        assert dst.tobytes() == src.tobytes()


@pytest.mark.parametrize("kind", ["random", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "block", "at"), [(2048 * 5 + 3, 2048, 0), (64 * 9 + 5, 64, 3), (8 * 7, 8, 1)])
def test_the_streaming_1bit_decode_writes_the_same_values(
    n: int, block: int, at: int, dtype: Any, kind: str
) -> None:
    from trainer_core.compression import _fast_onebit

    rng = np.random.default_rng(n + block)
    g = rng.standard_normal(n).astype(dtype)
    if kind == "nonfinite":
        g[rng.integers(0, n, size=3)] = [np.nan, np.inf, -np.inf]
    c = get_compressor({"type": "1bit", "block_size": block, "kernel": "numba"})
    payload, _ = c.encode(g)
    nblocks = -(-n // block)
    vals, bits = payload[: 8 * nblocks].view(np.float32), payload[8 * nblocks :]
    want = _fast_onebit.onebit_decode(vals, bits, block, np.empty(n, dtype))
    room = np.full(n + at + 1, 7.0, dtype)
    got = _fast_onebit.onebit_decode_stream(vals, bits, block, room[at : at + n])
    assert got.tobytes() == want.tobytes()
    assert (room[:at] == 7.0).all() and room[at + n] == 7.0


def test_a_large_out_is_decoded_with_the_streaming_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OneBit.decode`` into an ``out`` of at least ``STREAM_BYTES`` streams; a smaller one, or
    a fresh result, does not; the values are the numpy kernel's."""
    from trainer_core.compression import _fast_onebit

    calls: list[str] = []
    for name in ("onebit_decode", "onebit_decode_stream"):
        kernel = getattr(_fast_onebit, name)
        monkeypatch.setattr(_fast_onebit, name, lambda *a, k=kernel, nm=name: calls.append(nm) or k(*a))
    n = kernels.STREAM_BYTES // 4 + 9
    g = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    payload, meta = get_compressor({"type": "1bit"}).encode(g)
    want = get_compressor({"type": "1bit", "kernel": "numpy"}).decode(payload, meta, n, np.float32)
    c = get_compressor({"type": "1bit", "kernel": "numba"})
    assert c.decode(payload, meta, n, np.float32, out=np.empty(n, np.float32)).tobytes() == want.tobytes()
    assert c.decode(payload, meta, n, np.float32).tobytes() == want.tobytes()
    assert calls == ["onebit_decode_stream", "onebit_decode"]
