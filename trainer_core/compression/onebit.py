"""``1bit``: CNTK's 1-bit SGD with error feedback and per-block reconstruction values.

With ``v = grad + residual`` split into blocks of ``block_size`` consecutive elements (C order;
the last block may be shorter), each element sends one bit, ``v >= 0``; the receiver rebuilds a
0 bit as the block's mean of its negative entries and a 1 bit as the mean of its non-negative
entries (Seide et al. 2014 use matrix columns; a block is our column). The residual keeps
``v - reconstruction``. Means are float64 sums (in the fixed order of ``lane_sums``) divided by
the count, then rounded to float32 (and to the gradient's dtype when that is float16); a block
with no negative (or no non-negative) entry sends 0 for the missing value. A block holding a
non-finite ``v`` (NaN, +inf, -inf) sends NaN for both values, so it decodes as NaN throughout
(one bit cannot single out an element); its non-finite elements keep a residual of 0, its finite
ones keep ``v`` (nothing usable of them was sent).

Payload (``8 * nblocks + ceil(n / 8)`` bytes, about 31x smaller than float32 at the default
block of 2048): first ``nblocks`` pairs of little-endian float32 ``(value of bit 0, value of
bit 1)``, then the bits packed as ``numpy.packbits(bits, bitorder='big')`` (element ``i`` in bit
``7 - i % 8`` of bit byte ``i // 8``; blocks start on byte boundaries since ``block_size`` is a
multiple of 8). ``meta = {'type': '1bit', 'block_size': B}``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trainer_core.xp import array_module, is_device_array

from . import kernels
from .base import Compressor, param_error

DEFAULT_BLOCK = 2048


def wire_bytes(size: int, block_size: int = DEFAULT_BLOCK) -> int:
    """Payload bytes for ``size`` values."""
    return 8 * math.ceil(size / block_size) + math.ceil(size / 8)


class OneBit(Compressor):
    """Sign quantizer with two float32 reconstruction values per block: ~31x smaller than float32."""

    name: ClassVar[str] = "1bit"
    param_names: ClassVar[tuple[str, ...]] = ("block_size",)

    def __init__(self, block_size: int = DEFAULT_BLOCK, kernel: str = "auto") -> None:
        if (
            isinstance(block_size, bool)
            or not isinstance(block_size, int)
            or block_size <= 0
            or block_size % 8
        ):
            raise param_error(self.name, "block_size", block_size, "a positive multiple of 8")
        super().__init__(kernel)
        self.block_size = block_size

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        return wire_bytes(size, self.block_size)

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        return self._encode_into(xp, g, r, dtype, None)

    def _encode_into(self, xp: Any, g: Any, r: Any, dtype: np.dtype, into: Any) -> tuple[Any, dict[str, Any]]:
        n, b = g.size, self.block_size
        nblocks = math.ceil(n / b)
        meta = {"block_size": b}
        cuda = kernels.cuda(self.kernel, g, dtype)
        if cuda is not None:
            return cuda.onebit_encode(g, r, b), meta
        if self.use_fast(g, dtype):
            from . import _fast_onebit

            out = _payload(n, b, into)
            vals = out[: 8 * nblocks].view(np.float32)
            _fast_onebit.onebit_encode(g, r, b, vals, out[8 * nblocks :])
            return out, meta
        return encode_xp(xp, g, r, b, dtype), meta

    def encodes_sum(self, grad: Any) -> bool:
        """The compiled kernel does (host float32/float64 arrays)."""
        return self.use_fast(grad, grad.dtype)

    def _encode_sum(
        self, g: Any, g2: Any, r: Any, dtype: np.dtype, into: Any = None
    ) -> tuple[Any, dict[str, Any]]:
        from . import _fast_onebit

        n, b = g.size, self.block_size
        out = _payload(n, b, into)
        nblocks = math.ceil(n / b)
        _fast_onebit.onebit_encode_sum(g, g2, r, b, out[: 8 * nblocks].view(np.float32), out[8 * nblocks :])
        return out, {"block_size": b}

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        b = int(meta["block_size"])
        if buf.size != wire_bytes(n, b):
            raise ValueError(
                f"1bit payload of {buf.size} bytes does not hold {n} values (want {wire_bytes(n, b)})"
            )
        buf = kernels.device_payload(buf, out)
        xp = array_module(buf)
        cuda = kernels.cuda(self.kernel, buf, dtype)
        if cuda is not None:
            return cuda.onebit_decode(buf, b, n, out)
        nblocks = math.ceil(n / b)
        vals = buf[: 8 * nblocks].view(np.float32)
        bits = buf[8 * nblocks :]
        if self.use_fast(buf, dtype):
            from . import _fast_onebit

            if out is not None and out.nbytes >= kernels.STREAM_BYTES:
                return _fast_onebit.onebit_decode_stream(vals, bits, b, out)
            return _fast_onebit.onebit_decode(vals, bits, b, np.empty(n, dtype=dtype) if out is None else out)
        return decode_xp(xp, vals, bits, b, n, dtype)

    def _decode_sum(
        self, bufs: list[Any], metas: list[dict[str, Any]], n: int, dtype: np.dtype, out: Any, scratch: Any
    ) -> bool:
        """The compiled kernel (host arrays, one block size): the payloads' values and bits as the
        rows of two arrays (a few bytes per block; in ``scratch`` where it holds them, else fresh),
        then one pass over ``out``."""
        b = int(metas[0]["block_size"])
        if any(int(m["block_size"]) != b for m in metas) or not self.use_fast(out, dtype):
            return False
        if any(is_device_array(buf) for buf in bufs):
            return False
        vals, bits = _rows(bufs, n, b, scratch)
        from . import _fast_onebit

        _fast_onebit.onebit_decode_sum(vals, bits, b, out)
        return True

    def encodes_payload_sum(self, payloads: Sequence[tuple[Any, dict[str, Any]]], dtype: Any) -> bool:
        """The compiled kernel does, for host payloads of this compressor's block size and
        float32/float64 (one block size for the sum's decoding and its encoding)."""
        dt = np.dtype(dtype)
        if not payloads or dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            return False
        if any(m.get("type") != self.name or is_device_array(p) for p, m in payloads):
            return False
        ok = all(m.get("block_size") == self.block_size for _, m in payloads)
        return ok and self.use_fast(np.zeros(0, dt), dt)

    def _encode_payload_sum(
        self,
        bufs: list[Any],
        metas: list[dict[str, Any]],
        n: int,
        dtype: np.dtype,
        divisor: int,
        r: Any,
        into: Any,
        scratch: Any,
    ) -> tuple[Any, dict[str, Any]]:
        b = int(metas[0]["block_size"])
        from . import _fast_onebit

        vals, bits = _rows(bufs, n, b, scratch)
        out = _payload(n, b, into)
        nblocks = math.ceil(n / b)
        d = dtype.type(divisor)
        _fast_onebit.onebit_sum_encode(
            vals, bits, b, d, r, out[: 8 * nblocks].view(np.float32), out[8 * nblocks :]
        )
        return out, {"block_size": b}


def _rows(bufs: list[Any], n: int, b: int, scratch: Any) -> tuple[np.ndarray, np.ndarray]:
    """The host payloads' values and bits as the rows of two arrays (in ``scratch`` where it is a
    C-contiguous array that holds them, else fresh); ``ValueError`` for a payload of another size."""
    want, nblocks = wire_bytes(n, b), math.ceil(n / b)
    rows = (len(bufs), 2 * nblocks), (len(bufs), want - 8 * nblocks)
    room = (
        scratch.reshape(-1).view(np.uint8)
        if isinstance(scratch, np.ndarray) and scratch.flags.c_contiguous
        else None
    )
    if room is not None and room.size >= len(bufs) * want:  # the rows in the caller's scratch
        vals = room[: 4 * rows[0][0] * rows[0][1]].view(np.float32).reshape(rows[0])
        bits = room[vals.nbytes : vals.nbytes + rows[1][0] * rows[1][1]].reshape(rows[1])
    else:
        vals = np.empty(rows[0], dtype=np.float32)
        bits = np.empty(rows[1], dtype=np.uint8)
    for j, buf in enumerate(bufs):
        if buf.size != want:
            raise ValueError(f"1bit payload of {buf.size} bytes does not hold {n} values (want {want})")
        vals[j] = buf[: 8 * nblocks].view(np.float32)
        bits[j] = buf[8 * nblocks :]
    return vals, bits


def _payload(n: int, b: int, into: Any) -> np.ndarray:
    """The host payload array of ``n`` values: the first bytes of ``into`` where it is a
    C-contiguous uint8 array that holds them, else a fresh array."""
    want = wire_bytes(n, b)
    if (
        isinstance(into, np.ndarray)
        and into.dtype == np.uint8
        and into.flags.c_contiguous
        and into.size >= want
    ):
        return into.reshape(-1)[:want]
    return np.empty(want, dtype=np.uint8)


def _blocks(x: Any, b: int) -> list[Any]:
    """``x`` as 2-D views: the full blocks ``(n // b, b)`` and the short last block ``(1, n % b)``."""
    full = (x.size // b) * b
    parts = [x[:full].reshape(-1, b)] if full else []
    if full < x.size:
        parts.append(x[full:].reshape(1, -1))
    return parts


def lane_sums(xp: Any, w: Any) -> Any:
    """Row sums of ``w``, in float64, in the compiled kernel's order: four interleaved running sums
    (lane j holds columns 4 i + j, each summed left to right from +0.0), joined as
    ``(l0 + l1) + (l2 + l3)``. The same order on both host paths and in the CUDA kernel
    (``_cuda.py``) makes their outputs identical; only this function run on cupy (the fallback
    when the CUDA kernels cannot compile) may differ in a mean's last bit, cupy's cumsum being a
    parallel scan."""
    pad = (-w.shape[1]) % 4
    if pad:
        w = xp.concatenate([w, xp.zeros((w.shape[0], pad), dtype=w.dtype)], axis=1)
    # cumsum is a left-to-right running sum; "+ 0.0" turns a -0.0 start into the kernel's +0.0
    lanes = xp.cumsum(w.reshape(w.shape[0], -1, 4), axis=1, dtype=np.float64)[:, -1, :] + 0.0
    return (lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3])


def _mean32(xp: Any, total: Any, count: Any, dtype: np.dtype) -> Any:
    mean = xp.where(count > 0, total / xp.maximum(count, 1), 0.0).astype(np.float32)
    return mean.astype(np.float16).astype(np.float32) if dtype == np.float16 else mean


#: On the host the numpy kernel works on about this many values at a time, so its float64
#: temporaries stay in cache (a loop over chunks of blocks, not over elements).
HOST_CHUNK = 1 << 16


def _nonfinite_rows(xp: Any, v: Any, sp: Any, sn: Any) -> Any:
    """The rows of ``v`` holding a NaN or +-inf (a bool mask), or ``None`` when there is none: only
    looked for when a row's sums are not finite (a finite float64 sum can overflow too)."""
    if bool(xp.isfinite(sp).all()) and bool(xp.isfinite(sn).all()):
        return None
    rows = ~xp.isfinite(v).all(axis=1)
    return rows if bool(rows.any()) else None


def encode_xp(xp: Any, g: Any, r: Any, b: int, dtype: np.dtype) -> Any:
    """The array-module kernel (numpy or cupy): updates ``r`` in place, returns the payload."""
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite values: see the module's doc
        return _encode_xp(xp, g, r, b, dtype)


def _encode_xp(xp: Any, g: Any, r: Any, b: int, dtype: np.dtype) -> Any:
    xp.add(r, g, out=r)
    vals = []
    bits = r >= 0
    for part, signs in zip(_blocks(r, b), _blocks(bits, b), strict=True):
        step = max(1, HOST_CHUNK // b) if xp is np else part.shape[0]
        for i in range(0, part.shape[0], step):
            v, s = part[i : i + step], signs[i : i + step]
            # the masked values (unselected ones become +-0.0, which leave a running sum unchanged)
            pos = v * s
            sp = lane_sums(xp, pos)
            sn = lane_sums(xp, v - pos)  # v - v is +0.0, v - 0.0 is v: exact
            cp = s.sum(axis=1)
            hi = _mean32(xp, sp, cp, dtype)
            lo = _mean32(xp, sn, s.shape[1] - cp, dtype)
            bad = _nonfinite_rows(xp, v, sp, sn)
            if bad is None:
                v -= xp.where(s, hi[:, None].astype(v.dtype), lo[:, None].astype(v.dtype))
            else:
                hi[bad] = lo[bad] = np.float32(np.nan)
                sent = xp.where(s, hi[:, None].astype(v.dtype), lo[:, None].astype(v.dtype))
                sent[bad] = 0
                v -= sent
                rows = v[bad]
                rows[~xp.isfinite(rows)] = 0
                v[bad] = rows
            vals.append(xp.stack([lo, hi], axis=1).reshape(-1))
    head = xp.concatenate(vals).view(np.uint8) if vals else xp.zeros(0, np.uint8)
    return xp.concatenate([head, xp.packbits(bits)])


def decode_xp(xp: Any, vals: Any, bits: Any, b: int, n: int, dtype: np.dtype) -> Any:
    """The array-module kernel: unpack the bits, pick each block's value for 0 or 1."""
    table = vals.astype(dtype).reshape(-1, 2)
    flat = xp.unpackbits(bits)[:n].view(np.bool_)
    parts = [
        xp.where(s, table[i : i + len(s), 1:2], table[i : i + len(s), 0:1]).reshape(-1)
        for i, s in zip(_row_starts(n, b), _blocks(flat, b), strict=True)
    ]
    return parts[0] if len(parts) == 1 else xp.concatenate(parts) if parts else xp.zeros(0, dtype)


def _row_starts(n: int, b: int) -> list[int]:
    """The first block row of each part returned by ``_blocks``."""
    full = n // b
    return ([0] if full else []) + ([full] if full * b < n else [])
