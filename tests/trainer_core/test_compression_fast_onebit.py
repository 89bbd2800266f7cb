"""The compiled 1-bit encoder (compression/_fast_onebit.py) at sizes where it takes four blocks per pass:
the same bytes and residuals as the numpy kernel (onebit.encode_xp), step after step, on random,
tied, wide-range and non-finite values, and the same as a per-element reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core.compression import _fast, get_compressor

pytestmark = pytest.mark.skipif(not _fast.available(), reason="numba not installed")

#: sizes and blocks: whole groups of four blocks, then leftover blocks and a short last block
SIZES = [(4 * 2048 * 3 + 2048 + 5, 2048), (4 * 64 * 7, 64), (4 * 8 * 9 + 3, 8), (4 * 16 - 1, 16)]


def values(kind: str, n: int, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    g = rng.standard_normal(n)
    if kind == "ties":  # exact zeros, negative zeros and repeated values
        g = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5]), size=n)
    elif kind == "wide":  # summation order matters
        g *= 10.0 ** rng.uniform(-30, 30, size=n)
    elif kind == "nonfinite":
        g[rng.integers(0, n, size=4)] = [np.nan, np.inf, -np.inf, np.nan]
    return g.astype(dtype)


@pytest.mark.parametrize("kind", ["random", "ties", "wide", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "block"), SIZES)
def test_the_compiled_1bit_encoder_matches_the_numpy_one(n, block, dtype, kind):
    rng = np.random.default_rng(n + block)
    slow = get_compressor({"type": "1bit", "block_size": block, "kernel": "numpy"})
    fast = get_compressor({"type": "1bit", "block_size": block, "kernel": "numba"})
    for _ in range(3):  # the residual carries over
        g = values(kind, n, dtype, rng)
        p1, _ = slow.encode(g)
        p2, _ = fast.encode(g)
        assert p1.tobytes() == p2.tobytes()
        assert slow.residual.tobytes() == fast.residual.tobytes()


def reference(g: np.ndarray, r: np.ndarray, block: int) -> tuple[bytes, np.ndarray]:
    """onebit.py's rule element by element: v = r + g; bit v >= 0; each block's two values the
    float32 of four lanes' float64 sums (lane j: elements 4 i + j, left to right) joined as
    (l0 + l1) + (l2 + l3), over the count; a block with a non-finite v sends NaN, r = v with its
    non-finite elements 0; otherwise r = v - the value its bit decodes to."""
    v = (r + g).astype(r.dtype)
    head, bits = [], np.packbits(v >= 0)
    out = v.copy()
    for s in range(0, v.size, block):
        blk = v[s : s + block]
        lanes = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # non-negative, negative
        for i, x in enumerate(blk):
            lanes[0 if x >= 0 else 1][i % 4] += float(x)
        sums = [(a[0] + a[1]) + (a[2] + a[3]) for a in lanes]
        cp = int((blk >= 0).sum())
        hi = np.float32(sums[0] / cp) if cp else np.float32(0)
        lo = np.float32(sums[1] / (blk.size - cp)) if blk.size - cp else np.float32(0)
        if not np.isfinite(blk).all():
            hi = lo = np.float32(np.nan)
            out[s : s + block] = np.where(np.isfinite(blk), blk, 0)
        else:
            out[s : s + block] = blk - np.where(blk >= 0, hi, lo).astype(blk.dtype)
        head += [lo, hi]
    return np.array(head, "<f4").tobytes() + bits.tobytes(), out


@pytest.mark.parametrize("kind", ["random", "ties", "nonfinite"])
def test_the_compiled_1bit_encoder_matches_a_per_element_reference(kind):
    n, block = 4 * 64 * 3 + 64 + 9, 64
    rng = np.random.default_rng(7)
    c = get_compressor({"type": "1bit", "block_size": block, "kernel": "numba"})
    r = np.zeros(n, np.float32)
    for _ in range(2):
        g = values(kind, n, np.float32, rng)
        want, r = reference(g, r, block)
        payload, _ = c.encode(g)
        assert payload.tobytes() == want
        assert c.residual.tobytes() == r.tobytes()


@pytest.mark.parametrize("kind", ["random", "ties", "wide", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "block"), SIZES)
def test_the_compiled_1bit_encoder_of_a_sum_of_two_is_encoding_the_sum(n, block, dtype, kind):
    """``encode(g, plus=g2)`` (``onebit_encode_sum``: never writes ``g + g2``) gives the payload
    and residual of ``encode(g + g2)``, step after step."""
    rng = np.random.default_rng(n * 3 + block)
    two = get_compressor({"type": "1bit", "block_size": block, "kernel": "numba"})
    one = get_compressor({"type": "1bit", "block_size": block, "kernel": "numba"})
    assert two.encodes_sum(np.zeros(n, dtype))
    for _ in range(3):
        g, g2 = values(kind, n, dtype, rng), values(kind, n, dtype, rng)
        p1, _ = one.encode(g + g2)
        p2, _ = two.encode(g, plus=g2)
        assert p1.tobytes() == p2.tobytes()
        assert one.residual.tobytes() == two.residual.tobytes()


@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("kernel", ["numba", "numpy"])
def test_encode_into_a_reused_buffer_gives_the_same_payload(kernel, plus):
    """``encode(..., into=buf)``: the compiled kernel writes the payload into ``buf`` (a view of
    it is returned) with the bytes and residual of a fresh payload; the numpy kernel, and a buffer
    too small, leave ``buf`` alone."""
    n, block = 4 * 2048 * 3 + 2048 + 5, 2048
    rng = np.random.default_rng(11)
    fresh = get_compressor({"type": "1bit", "block_size": block, "kernel": kernel})
    reused = get_compressor({"type": "1bit", "block_size": block, "kernel": kernel})
    buf = np.full(fresh.wire_bytes(n) + 9, 0xAB, np.uint8)
    small = np.full(fresh.wire_bytes(n) - 1, 0xCD, np.uint8)
    for step in range(3):
        g, g2 = values("random", n, np.float32, rng), values("random", n, np.float32, rng)
        more = g2 if plus else None
        want, _ = fresh.encode(g, plus=more)
        got, _ = reused.encode(g, plus=more, into=small if step == 2 else buf)
        assert got.tobytes() == want.tobytes()
        assert reused.residual.tobytes() == fresh.residual.tobytes()
        assert np.shares_memory(got, buf) == (kernel == "numba" and step < 2)
    assert (small == 0xCD).all() and (buf[fresh.wire_bytes(n) :] == 0xAB).all()
