"""The compiled top-k selection (compression/_fast_topk.py) at sizes where it selects from a sampled
candidate list: the same indices, values and residuals as the numpy kernel (topk.select_xp) and as
a stable sort, on random, tied, equal, wide-range and non-finite values; and the fallbacks (too
many candidates, too few) give the same too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core.compression import _fast, get_compressor

pytestmark = pytest.mark.skipif(not _fast.available(), reason="numba not installed")

N = (1 << 16) + 4099  # sampled, with a short last chunk and a few values past the last word


def values(kind: str, n: int, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    g = rng.standard_normal(n)
    if kind == "ties":
        g = rng.choice(np.array([-2.0, -1.0, 0.0, -0.0, 1.0, 2.0, 3.0]), size=n)
    elif kind == "equal":  # every value reaches the sampled bucket: more than the list holds
        g = np.full(n, 1.5)
    elif kind == "wide":
        g *= 10.0 ** rng.uniform(-30, 30, size=n)
    elif kind == "nonfinite":
        g[rng.integers(0, n, size=5)] = [np.nan, np.inf, -np.inf, np.nan, -0.0]
    return g.astype(dtype)


@pytest.mark.parametrize("kind", ["random", "ties", "equal", "wide", "nonfinite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ratio", [1e-5, 0.01, 0.1, 0.2])
def test_the_compiled_topk_matches_the_numpy_one(ratio, dtype, kind):
    rng = np.random.default_rng(int(ratio * 1e5))
    slow = get_compressor({"type": "topk", "ratio": ratio, "kernel": "numpy"})
    fast = get_compressor({"type": "topk", "ratio": ratio, "kernel": "numba"})
    for _ in range(3):  # the residual carries over
        g = values(kind, N, dtype, rng)
        p1, m1 = slow.encode(g)
        p2, m2 = fast.encode(g)
        assert m1 == m2
        assert p1.tobytes() == p2.tobytes()
        assert slow.residual.tobytes() == fast.residual.tobytes()


@pytest.mark.parametrize("kind", ["random", "ties", "nonfinite"])
def test_the_compiled_topk_takes_the_largest_with_ties_to_the_lowest_index(kind):
    g = values(kind, N, np.float32, np.random.default_rng(3))
    c = get_compressor({"type": "topk", "ratio": 0.01, "kernel": "numba"})
    payload, meta = c.encode(g)
    k = meta["k"]
    keys = g.view(np.uint32) & np.uint32(0x7FFFFFFF)  # NaN above inf above every finite value
    want = np.sort(np.argsort(-keys.astype(np.int64), kind="stable")[:k])
    assert payload[: 4 * k].view("<u4").tolist() == want.tolist()
    assert payload[4 * k :].tobytes() == g[want].tobytes()


def test_the_sampled_bucket_lets_a_little_more_than_k_through():
    """The sampled path is the one taken on random values (not the full radix select): between k
    and the list's room reach the sampled bucket."""
    from trainer_core.compression import _fast_topk

    rng = np.random.default_rng(0)
    g = rng.standard_normal(N).astype(np.float32)
    r = np.zeros(N, np.float32)
    k = N // 100
    mask = np.uint32(0x7FFFFFFF)
    low = _fast_topk._sample_bound(g, r, r.view(np.uint32), mask, k, 16)
    reach = int((((g.view(np.uint32) & mask) >> 16) >= low).sum())
    assert k <= reach <= 2 * k
