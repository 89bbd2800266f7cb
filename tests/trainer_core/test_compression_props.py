"""Property tests over random shapes, dtypes and parameters: error feedback loses nothing, and the
numba and numpy kernels produce identical bytes and residuals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_core.compression import _fast, get_compressor

DTYPES = [np.float16, np.float32, np.float64]
PARAMS = [
    {"type": "2bit", "threshold": 0.5},
    {"type": "2bit", "threshold": 0.03},
    {"type": "1bit"},
    {"type": "1bit", "block_size": 8},
    {"type": "1bit", "block_size": 64},
    {"type": "topk", "ratio": 0.1},
    {"type": "topk", "ratio": 1.0},
    {"type": "powersgd", "rank": 1},
    {"type": "powersgd", "rank": 3},
    {"type": "none"},
]
TOL = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-14}

shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple)


def grads(rng, shape, dtype, steps):
    scale = 10.0 ** rng.uniform(-3, 1)
    return [(rng.standard_normal(shape) * scale).astype(dtype) for _ in range(steps)]


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    params=st.sampled_from(PARAMS),
    kernel=st.sampled_from(["numpy", "auto"]),
    seed=st.integers(0, 2**31),
)
def test_residual_carries_exactly_what_was_lost(shape, dtype, params, kernel, seed):
    rng = np.random.default_rng(seed)
    c = get_compressor({**params, "kernel": kernel})
    n = int(np.prod(shape))
    sent_total = np.zeros(n)
    grad_total = np.zeros(n)
    for g in grads(rng, shape, dtype, steps=3):
        old = np.zeros(n) if c.residual is None else c.residual.astype(np.float64)
        payload, meta = c.encode(g)
        assert payload.dtype == np.uint8 and payload.ndim == 1
        assert payload.nbytes == c.wire_bytes(n, dtype, shape) == c.last_wire_bytes
        dec = c.decode(payload, meta, shape, dtype)
        assert dec.shape == shape and dec.dtype == dtype
        new = np.zeros(n) if c.residual is None else c.residual.astype(np.float64)
        d = dec.astype(np.float64).ravel()
        scale = 1.0 + np.abs(g.astype(np.float64)).max(initial=0) + np.abs(old).max(initial=0)
        np.testing.assert_allclose(
            d + new, g.astype(np.float64).ravel() + old, rtol=0, atol=TOL[dtype] * scale
        )
        sent_total += d
        grad_total += g.astype(np.float64).ravel()
    # over several steps nothing is lost either: what was sent plus what is held is what came in
    held = np.zeros(n) if c.residual is None else c.residual.astype(np.float64)
    np.testing.assert_allclose(
        sent_total + held, grad_total, rtol=0, atol=10 * TOL[dtype] * (1 + np.abs(grad_total).max(initial=0))
    )


@pytest.mark.skipif(not _fast.available(), reason="numba not installed")
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 5000),
    dtype=st.sampled_from([np.float32, np.float64]),
    params=st.sampled_from([p for p in PARAMS if p["type"] in ("1bit", "2bit", "topk")]),
    seed=st.integers(0, 2**31),
    special=st.booleans(),
)
def test_numba_and_numpy_kernels_are_identical(n, dtype, params, seed, special):
    rng = np.random.default_rng(seed)
    slow = get_compressor({**params, "kernel": "numpy"})
    fast = get_compressor({**params, "kernel": "numba"})
    for g in grads(rng, (n,), dtype, steps=3):
        if special and n:  # a wide dynamic range (summation order matters), exact zeros,
            # negative zeros and ties at the threshold
            g *= (10.0 ** rng.uniform(-20, 20, size=n)).astype(dtype)
            picks = rng.integers(0, n, size=max(1, n // 4))
            g[picks] = rng.choice(np.array([0.0, -0.0, 0.5, -0.5], dtype=dtype), size=picks.size)
        p1, m1 = slow.encode(g)
        p2, m2 = fast.encode(g)
        assert m1 == m2
        assert p1.tobytes() == p2.tobytes()
        np.testing.assert_array_equal(slow.residual, fast.residual)
        for out_dtype in (np.float32, np.float64):
            np.testing.assert_array_equal(
                slow.decode(p1, m1, (n,), out_dtype), fast.decode(p1, m1, (n,), out_dtype)
            )


@settings(max_examples=25, deadline=None)
@given(shape=shapes.filter(lambda s: 0 < int(np.prod(s)) <= 500), seed=st.integers(0, 2**31))
def test_2bit_matches_an_elementwise_reference(shape, seed):
    """MXNet's quantize_2bit loop, written out per element in plain Python."""
    rng = np.random.default_rng(seed)
    t = np.float32(0.5)
    c = get_compressor({"type": "2bit"})
    res = np.zeros(int(np.prod(shape)), np.float32)
    for g in grads(rng, shape, np.float32, steps=2):
        want = np.zeros(4 * -(-res.size // 16), np.uint8)
        for i, x in enumerate(g.ravel()):
            res[i] += x
            if res[i] >= t:
                want[i // 4] |= 0xC0 >> (2 * (i % 4))
                res[i] -= t
            elif res[i] <= -t:
                want[i // 4] |= 0x80 >> (2 * (i % 4))
                res[i] += t
        payload, _ = c.encode(g)
        assert payload.tolist() == want.tolist()
        np.testing.assert_array_equal(c.residual, res)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), block=st.sampled_from([8, 16, 64]), seed=st.integers(0, 2**31))
def test_1bit_matches_a_reference(n, block, seed):
    """Per block: bit = v >= 0, values = means of the negative and non-negative entries."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n).astype(np.float32)
    c = get_compressor({"type": "1bit", "block_size": block})
    payload, _ = c.encode(g)
    nb = -(-n // block)
    vals = payload[: 8 * nb].view("<f4").reshape(nb, 2)
    assert payload[8 * nb :].tolist() == np.packbits(g >= 0).tolist()
    for b in range(nb):
        blk = g[b * block : (b + 1) * block].astype(np.float64)
        neg, pos = blk[blk < 0], blk[blk >= 0]
        assert vals[b, 0] == pytest.approx(neg.mean() if neg.size else 0.0, rel=1e-6)
        assert vals[b, 1] == pytest.approx(pos.mean() if pos.size else 0.0, rel=1e-6)


def test_1bit_error_feedback_tracks_a_constant_gradient():
    """With a constant gradient the residual stays bounded, so the mean of what is sent converges to
    the gradient at rate 1/steps (the point of error feedback)."""
    g = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    c = get_compressor({"type": "1bit", "block_size": 256})
    total = np.zeros(4096)
    errors, peaks = {}, {}
    for step in range(1, 401):
        payload, meta = c.encode(g)
        total += c.decode(payload, meta, g.shape, np.float32)
        if step in (200, 400):
            errors[step] = np.abs(total / step - g).mean() / np.abs(g).mean()
            peaks[step] = np.abs(c.residual).max()
    assert errors[400] < 0.6 * errors[200] and errors[400] < 0.02
    assert peaks[400] < 1.3 * peaks[200]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    ratio=st.sampled_from([0.01, 0.1, 0.5, 1.0]),
    kernel=st.sampled_from(["numpy", "auto"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31),
)
def test_topk_selects_the_largest_with_ties_to_the_lowest_index(n, ratio, kernel, dtype, seed):
    rng = np.random.default_rng(seed)
    g = rng.choice(np.array([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]), size=n).astype(dtype)  # many ties
    c = get_compressor({"type": "topk", "ratio": ratio, "kernel": kernel})
    payload, meta = c.encode(g)
    k = meta["k"]
    # reference: a stable sort by decreasing magnitude, the first k, in index order
    want = np.sort(np.argsort(-np.abs(g.astype(np.float64)), kind="stable")[:k])
    assert payload[: 4 * k].view("<u4").tolist() == want.tolist()
    assert payload[4 * k :].view("<f4").tolist() == g[want].astype(np.float32).tolist()
