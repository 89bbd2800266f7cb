"""``topk``: top-k sparsification with error feedback (Deep Gradient Compression; Lin et al. 2018).

With ``v = grad + residual``, send the ``k = ceil(ratio * n)`` entries of largest magnitude (at
least one when ``n > 0``) and keep everything else, plus the rounding of the sent values, in the
residual. Exactly: every entry whose magnitude is above the k-th largest magnitude ``T``, then the
lowest-index entries equal to ``T`` until there are ``k`` (every kernel). Magnitudes are ordered
by their bits (the sign cleared), so NaN ranks above +-inf, which ranks above every finite value:
a non-finite ``v`` is always among the first sent, as itself (NaN, +inf or -inf), and every
non-finite element's residual, sent or not, becomes 0 (the next step starts clean).

Payload (``8 * k`` bytes): ``k`` little-endian uint32 indices in increasing order, then the ``k``
values as little-endian float32, in the same order. ``meta = {'type': 'topk', 'ratio': r, 'k': k}``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from trainer_core.xp import array_module

from . import kernels
from .base import Compressor, param_error


def count(size: int, ratio: float) -> int:
    """How many entries are sent for ``size`` values."""
    return 0 if size == 0 else min(size, max(1, math.ceil(ratio * size)))


class TopK(Compressor):
    """Send the largest ``ratio`` of the entries (indices + float32 values)."""

    name: ClassVar[str] = "topk"
    param_names: ClassVar[tuple[str, ...]] = ("ratio",)

    def __init__(self, ratio: float = 0.01, kernel: str = "auto") -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (0 < ratio <= 1):
            raise param_error(self.name, "ratio", ratio, "a number in (0, 1]")
        super().__init__(kernel)
        self.ratio = float(ratio)

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        return 8 * count(size, self.ratio)

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        if g.size >= 2**32:
            raise ValueError("topk indices are uint32: at most 2**32 - 1 values per key")
        k = count(g.size, self.ratio)
        cuda = kernels.cuda(self.kernel, g, dtype)
        if cuda is not None:
            return cuda.topk_encode(g, r, k), {"ratio": self.ratio, "k": k}
        if self.use_fast(r, dtype):
            from . import _fast_topk

            bits, shift = (np.uint64, 48) if r.dtype == np.float64 else (np.uint32, 16)
            mask = bits(np.iinfo(bits).max >> 1)  # clears the sign bit: |v| as ordered unsigned ints
            idx = _fast_topk.topk_encode(g, r, r.view(bits), mask, k, shift, np.empty(k + 1, np.intp))[:k]
            payload = np.empty(8 * k, np.uint8)
            if _fast_topk.take(r, idx, payload[: 4 * k].view(np.uint32), payload[4 * k :].view(np.float32)):
                return payload, {"ratio": self.ratio, "k": k}
        else:
            xp.add(r, g, out=r)
            idx = select_xp(xp, r, k)
        held = r[idx]
        sent = held.astype(np.float32)
        # a non-finite value ranks first: when none is sent, there is none
        bad = None if bool(xp.isfinite(held).all()) else ~xp.isfinite(r)
        # what the receiver will hold: float32 on the wire, then the gradient's dtype
        with np.errstate(invalid="ignore"):  # inf - inf
            r[idx] -= sent.astype(dtype).astype(r.dtype)
        if bad is not None:
            r[bad] = 0
        payload = xp.concatenate([idx.astype("<u4").view(np.uint8), sent.astype("<f4").view(np.uint8)])
        return payload, {"ratio": self.ratio, "k": k}

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        k = int(meta["k"])
        if buf.size != 8 * k:
            raise ValueError(f"topk payload of {buf.size} bytes does not hold k={k} entries")
        buf = kernels.device_payload(buf, out)
        xp = array_module(buf)
        cuda = kernels.cuda(self.kernel, buf, dtype)
        if cuda is not None:
            return cuda.topk_decode(buf, k, n, out)
        idx = buf[: 4 * k].view("<u4")
        if k and int(idx.max()) >= n:
            raise ValueError(f"topk payload has an index beyond {n} values")
        if out is None:
            out = xp.zeros(n, dtype=dtype)
        else:
            out[...] = 0
        out[idx.astype(np.intp)] = buf[4 * k :].view("<f4").astype(dtype)
        return out


def magnitude_keys(v: Any) -> Any:
    """``|v|`` as unsigned ints (the bits with the sign cleared): ordered like the magnitudes, and
    NaN above +-inf above every finite value."""
    bits = np.dtype(f"uint{8 * v.dtype.itemsize}")
    return v.view(bits) & bits.type(np.iinfo(bits).max >> 1)


def select_xp(xp: Any, v: Any, k: int) -> Any:
    """Ascending indices of the ``k`` largest ``|v|``: all above the k-th largest magnitude ``T``,
    then the lowest-index ones equal to ``T``."""
    n = v.size
    if k == n:
        return xp.arange(n)
    if k == 0:
        return xp.zeros(0, np.intp)
    a = magnitude_keys(v)
    t = xp.partition(a, n - k)[n - k]
    mask = a > t
    ties = xp.flatnonzero(a == t)[: k - int(mask.sum())]
    mask[ties] = True
    return xp.flatnonzero(mask)
