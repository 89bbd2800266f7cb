"""Non-finite gradients through every compressor (compression/twobit.py, onebit.py, topk.py and
their numba kernels in _fast*.py; the CUDA kernels: test_compression_cuda.py).

The rule: a NaN or +-inf reaches the receiver as a non-finite value (2bit: NaN; 1bit: its whole
block NaN; topk: itself), so a sum over workers, a divergence check or an AMP overflow check sees
it; the element's residual becomes 0, so the next finite step decodes finite values again. The
numpy and numba kernels write the same bytes and the same residual.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.trainer_core.gpu import same_bits
from trainer_core.compression import _fast, get_compressor

KERNELS = ["numpy", *(["numba"] if _fast.available() else [])]
DTYPES = [np.float32, np.float64, np.float16]
PARAMS = [
    {"type": "2bit", "threshold": 0.5},
    {"type": "1bit", "block_size": 16},
    {"type": "topk", "ratio": 0.1},
]
N = 100
BAD = {3: np.nan, 40: np.inf, 77: -np.inf}


def poisoned(dtype: Any, seed: int = 0) -> np.ndarray:
    g = (np.random.default_rng(seed).standard_normal(N) * 0.7).astype(dtype)
    for i, x in BAD.items():
        g[i] = x
    return g


def finite(dtype: Any, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(N) * 0.7).astype(dtype)


@pytest.mark.parametrize("shape", [(10, 10), (100,)], ids=["matrix", "raw"])
def test_powersgd_sends_nan_for_a_matrix_holding_a_non_finite_value_and_starts_clean_after(shape):
    c = get_compressor({"type": "powersgd", "rank": 2})
    c.encode(finite(np.float32, seed=5).reshape(shape))
    q = None if c.q is None else c.q.copy()
    payload, meta = c.encode(poisoned(np.float32).reshape(shape))
    out = c.decode(payload, meta, shape, np.float32).reshape(-1)
    if len(shape) == 2:
        assert np.isnan(out).all() and same_bits(c.q, q)  # the warm start is kept
    else:
        assert np.isnan(out[3]) and out[40] == np.inf and out[77] == -np.inf
    assert np.isfinite(c.residual).all() and np.all(c.residual[list(BAD)] == 0)
    payload, meta = c.encode(finite(np.float32).reshape(shape))
    assert np.isfinite(c.decode(payload, meta, shape, np.float32)).all()


def compressor(params: dict[str, Any], kernel: str, dtype: Any) -> Any:
    if kernel == "numba" and dtype == np.float16:
        pytest.skip("float16 runs the numpy kernels")
    return get_compressor({**params, "kernel": kernel})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: p["type"])
def test_a_non_finite_value_is_decoded_non_finite_and_leaves_a_zero_residual(params, kernel, dtype):
    c = compressor(params, kernel, dtype)
    c.encode(finite(dtype, seed=5))  # a residual to start from
    payload, meta = c.encode(poisoned(dtype))
    out = c.decode(payload, meta, N, dtype)
    bad = list(BAD)
    assert not np.isfinite(out[bad]).any()
    assert np.isnan(out.sum())  # what a server's sum, or an overflow check, sees
    assert np.all(c.residual[bad] == 0) and np.isfinite(c.residual).all()
    if params["type"] == "2bit":
        assert np.isnan(out[bad]).all()
        assert np.isfinite(np.delete(out, bad)).all()
    elif params["type"] == "1bit":  # the blocks holding 3, 40 and 77 (of 16 values each)
        blocks = np.isnan(out.reshape(-1)[:96].reshape(6, 16)).all(axis=1)
        assert blocks.tolist() == [True, False, True, False, True, False]
        assert np.isfinite(out[np.r_[16:32, 48:64, 80:96]]).all()
    else:  # sent as themselves: they rank first
        assert np.isnan(out[3]) and out[40] == np.inf and out[77] == -np.inf
    # the next finite step decodes finite values: nothing froze
    payload, meta = c.encode(finite(dtype))
    assert np.isfinite(c.decode(payload, meta, N, dtype)).all()
    assert np.isfinite(c.residual).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: p["type"])
def test_the_numpy_and_numba_kernels_agree_on_non_finite_values(params, dtype):
    if not _fast.available():
        pytest.skip("numba not installed")
    a, b = compressor(params, "numpy", dtype), compressor(params, "numba", dtype)
    for g in (finite(dtype, seed=5), poisoned(dtype), finite(dtype), poisoned(dtype, seed=2)):
        pa, ma = a.encode(g)
        pb, mb = b.encode(g)
        assert same_bits(pa, pb) and ma == mb and same_bits(a.residual, b.residual)
        assert same_bits(a.decode(pa, ma, N, dtype), b.decode(pb, mb, N, dtype))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_2bit_payload_of_finite_values_never_holds_code_01(kernel):
    """MXNet reads code 01 as 0: finite gradients never write it, so their payload is MXNet's."""
    c = compressor({"type": "2bit", "threshold": 0.25}, kernel, np.float32)
    for seed in range(3):
        payload, _ = c.encode(finite(np.float32, seed=seed) * 3)
        codes = np.unpackbits(np.asarray(payload)).reshape(-1, 2)
        assert not np.any((codes[:, 0] == 0) & (codes[:, 1] == 1))


@pytest.mark.parametrize("kernel", KERNELS)
def test_topk_sends_every_non_finite_value_first_when_k_allows(kernel):
    c = compressor({"type": "topk", "ratio": 0.03}, kernel, np.float32)  # k = 3
    payload, _ = c.encode(poisoned(np.float32))
    idx = np.asarray(payload)[:12].view("<u4")
    assert idx.tolist() == [3, 40, 77]


@pytest.mark.parametrize("kernel", KERNELS)
def test_topk_with_more_non_finite_values_than_k_still_sends_one_and_clears_them_all(kernel):
    c = compressor({"type": "topk", "ratio": 0.01}, kernel, np.float32)  # k = 1
    payload, meta = c.encode(poisoned(np.float32))
    out = c.decode(payload, meta, N, np.float32)
    assert np.isnan(out[3]) and np.count_nonzero(out) == 1  # NaN ranks above +-inf
    assert np.isfinite(c.residual).all() and np.all(c.residual[list(BAD)] == 0)
