"""PowerSGD: payload layout, the raw fallback, warm start recovering a low-rank gradient."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.compression import decode, get_compressor


def test_layout_is_p_then_q_float32():
    g = np.random.default_rng(0).standard_normal((20, 30)).astype(np.float32)
    c = get_compressor({"type": "powersgd", "rank": 2})
    payload, meta = c.encode(g)
    assert meta == {"type": "powersgd", "rank": 2, "rows": 20, "cols": 30}
    assert payload.nbytes == 4 * 2 * (20 + 30) == c.wire_bytes(g.size, np.float32, g.shape)
    f = payload.view("<f4")
    p, q = f[:40].reshape(20, 2), f[40:].reshape(30, 2)
    np.testing.assert_allclose(p.T @ p, np.eye(2), atol=1e-5)  # P has orthonormal columns
    np.testing.assert_allclose(c.decode(payload, meta, g.shape, np.float32), p @ q.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        decode(payload, meta, g.shape, np.float32) + c.residual.reshape(g.shape), g, atol=1e-5
    )


def test_higher_dimensions_use_the_first_axis_as_rows():
    g = np.random.default_rng(1).standard_normal((8, 4, 5)).astype(np.float64)
    c = get_compressor({"type": "powersgd", "rank": 1})
    payload, meta = c.encode(g)
    assert (meta["rows"], meta["cols"]) == (8, 20)
    assert c.decode(payload, meta, g.shape, np.float64).shape == (8, 4, 5)


@pytest.mark.parametrize("shape", [(50,), (3, 3), (4, 100)])
def test_small_or_flat_arrays_go_raw(shape):
    g = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    c = get_compressor({"type": "powersgd", "rank": 4})
    payload, meta = c.encode(g)
    assert meta == {"type": "powersgd", "rank": 4, "raw": 1}
    assert payload.tobytes() == g.astype("<f4").tobytes()
    np.testing.assert_array_equal(c.decode(payload, meta, shape, np.float32), g)
    assert not c.residual.any()


def test_a_low_rank_gradient_is_sent_exactly():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((64, 2)) @ rng.standard_normal((2, 48))
    c = get_compressor({"type": "powersgd", "rank": 2})
    payload, meta = c.encode(g)
    np.testing.assert_allclose(c.decode(payload, meta, g.shape, np.float64), g, atol=1e-5)


def test_warm_start_converges_to_the_best_rank_r_approximation():
    """Without error feedback (residual cleared), repeated steps are a power iteration."""
    rng = np.random.default_rng(4)
    u, _ = np.linalg.qr(rng.standard_normal((40, 6)))
    v, _ = np.linalg.qr(rng.standard_normal((30, 6)))
    s = np.array([10.0, 4.0, 1.0, 0.5, 0.2, 0.1])
    g = u @ np.diag(s) @ v.T
    best = np.sqrt((s[1:] ** 2).sum())  # Frobenius error of the best rank-1 approximation
    c = get_compressor({"type": "powersgd", "rank": 1})
    for _ in range(12):
        payload, meta = c.encode(g)
        c.residual[:] = 0
    err = np.linalg.norm(c.decode(payload, meta, g.shape, np.float64) - g)
    assert err < 1.0001 * best


def test_bad_payloads():
    g = np.ones((10, 10), np.float32)
    c = get_compressor({"type": "powersgd", "rank": 1})
    payload, meta = c.encode(g)
    with pytest.raises(ValueError, match="does not hold"):
        c.decode(payload[:-4], meta, g.shape, np.float32)
    with pytest.raises(ValueError, match="does not hold"):
        c.decode(payload, meta, (5, 10), np.float32)
