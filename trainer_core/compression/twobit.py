"""``2bit``: MXNet's threshold quantizer with error feedback (``{'type': '2bit', 'threshold': 0.5}``).

Per element, with ``v = grad + residual``: ``v >= t`` sends ``+t`` (``residual = v - t``),
``v <= -t`` sends ``-t`` (``residual = v + t``), otherwise sends 0 (``residual = v``). A
non-finite ``v`` (NaN, +inf, -inf) sends code ``01``, which decodes as NaN, and its residual
becomes 0: a NaN or an overflow reaches the receiver's sum, and the next step starts clean.

Payload (the same bit layout as MXNet's ``quantize_2bit``): 2 bits per value, 4 values per byte,
element ``i`` in bits ``7-2*(i%4)`` and ``6-2*(i%4)`` of byte ``i//4`` (first element in the high
bits); ``11`` = +t, ``10`` = -t, ``00`` = 0, ``01`` = NaN (MXNet never writes ``01``; it reads it
as 0, so a finite gradient's payload is MXNet's, bit for bit). The payload is
padded with zero bytes to whole 32-bit words, as MXNet does: ``4 * ceil(n / 16)`` bytes, 16x
smaller than float32. ``meta = {'type': '2bit', 'threshold': t}`` where ``t`` is the threshold as
the gradient's dtype holds it.
"""

from __future__ import annotations

import math
import sys
from typing import Any, ClassVar

import numpy as np

from trainer_core.xp import array_module

from . import kernels
from .base import Compressor, param_error, work_dtype

#: byte -> its four decoded codes as multiples of t (+1, -1, 0, NaN), first element first.
_SIGNS = np.array(
    [[(0.0, math.nan, -1.0, 1.0)[(b >> (6 - 2 * j)) & 3] for j in range(4)] for b in range(256)],
    dtype=np.float64,
)
#: packs four code bytes c0..c3 read as one little-endian uint32 w into (c0<<6)|(c1<<4)|(c2<<2)|c3,
#: found in bits 24..31 of w * _PACK (the other partial products stay below bit 24 or overflow).
_PACK = np.uint32(0x40100401)


def wire_bytes(size: int) -> int:
    """Payload bytes for ``size`` values: whole 32-bit words of 16 values."""
    return 4 * math.ceil(size / 16)


class TwoBit(Compressor):
    """Threshold quantizer: 16x smaller than float32, error feedback in the residual."""

    name: ClassVar[str] = "2bit"
    param_names: ClassVar[tuple[str, ...]] = ("threshold",)

    def __init__(self, threshold: float = 0.5, kernel: str = "auto") -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise param_error(self.name, "threshold", threshold, "a positive number")
        if not (math.isfinite(threshold) and threshold > 0):
            raise param_error(self.name, "threshold", threshold, "a positive finite number")
        super().__init__(kernel)
        self.threshold = float(threshold)

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        return wire_bytes(size)

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        # the threshold as the gradient's dtype holds it, compared and subtracted in the work dtype
        t = float(dtype.type(self.threshold))
        tw = work_dtype(dtype).type(t)
        n = g.size
        cuda = kernels.cuda(self.kernel, g, dtype)
        if cuda is not None:
            return cuda.twobit_encode(g, r, tw), {"threshold": t}
        if self.use_fast(g, dtype):
            from . import _fast

            out = np.empty(wire_bytes(n), dtype=np.uint8)
            _fast.twobit_encode(g, r, tw, out)
            return out, {"threshold": t}
        return encode_xp(xp, g, r, tw), {"threshold": t}

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        t = float(meta["threshold"])
        if buf.size < (n + 3) // 4:
            raise ValueError(f"2bit payload of {buf.size} bytes is too short for {n} values")
        buf = kernels.device_payload(buf, out)
        xp = array_module(buf)
        cuda = kernels.cuda(self.kernel, buf, dtype)
        if cuda is not None:
            return cuda.twobit_decode(buf, t, n, out)
        if self.use_fast(buf, dtype):
            from . import _fast

            return _fast.twobit_decode(buf, dtype.type(t), np.empty(n, dtype=dtype) if out is None else out)
        return decode_xp(xp, buf, t, n, dtype, out)


def encode_xp(xp: Any, g: Any, r: Any, t: Any) -> Any:
    """The array-module kernel (numpy or cupy): updates ``r`` in place, returns the payload."""
    n = g.size
    xp.add(r, g, out=r)
    pos = r >= t
    neg = r <= -t
    sent = pos * t  # +t, -t or 0 in the work dtype
    sent -= neg * t
    r -= sent
    codes = xp.zeros(4 * wire_bytes(n), dtype=np.uint8)
    c = codes[:n]
    xp.multiply(pos.view(np.uint8), np.uint8(3), out=c)
    c |= neg.view(np.uint8) << np.uint8(1)
    bad = ~xp.isfinite(r)
    if bad.any():  # NaN and +-inf: code 01 (decoded as NaN), residual 0
        c[bad] = 1
        r[bad] = 0
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        q = codes.reshape(-1, 4)
        return (q[:, 0] << 6) | (q[:, 1] << 4) | (q[:, 2] << 2) | q[:, 3]
    w = codes.view(np.uint32)
    w *= _PACK
    w >>= np.uint32(24)
    return w.astype(np.uint8)


def decode_xp(xp: Any, buf: Any, t: float, n: int, dtype: np.dtype, out: Any = None) -> Any:
    """The array-module kernel: one table gather of 4 values per payload byte (straight into
    ``out`` when it is given and ``n`` is a multiple of 4)."""
    table = xp.asarray((_SIGNS * t).astype(dtype))  # (256, 4) rows of 4 * itemsize bytes
    row = 4 * dtype.itemsize
    # gather whole rows as single wide items (8 or 16 bytes each) so the gather is a plain copy
    wide = np.dtype(np.uint64) if row == 8 else np.dtype(np.complex128)
    rows = table.view(wide)  # (256, row // wide.itemsize)
    idx = buf[: (n + 3) // 4]
    if out is not None and n % 4 == 0:
        # numpy buffers ``out`` unless mode != 'raise'; byte indices are always in range anyway
        kw = {"mode": "clip"} if xp is np else {}
        if rows.shape[1] == 1:
            xp.take(rows.reshape(-1), idx, out=out.view(wide), **kw)
        else:
            xp.take(rows, idx, axis=0, out=out.view(wide).reshape(idx.size, -1), **kw)
        return out
    res = xp.take(rows.reshape(-1), idx) if rows.shape[1] == 1 else xp.take(rows, idx, axis=0)
    return res.view(dtype).reshape(-1)[:n]
