"""CUDA kernels for cupy arrays: the 1-bit, 2-bit and top-k encoders and decoders, byte-identical
to the host kernels (``_fast*.py`` and the numpy twins in each compressor module).

The CUDA C source is one template (``BODY``) filled in per gradient dtype (``render``): ``G`` the
gradient's storage type (float16 as raw ``unsigned short``), ``W`` the residual's work type and
``K`` the unsigned type whose bits order like ``|W|``. Every kernel loops over its work with a grid
stride, so any launch geometry gives the same result, and no kernel depends on how threads
interleave except through integer atomics (order-free). ``PREAMBLE`` holds the few lines that
are CUDA-only (float16 conversions in PTX, bit casts); the tests compile ``BODY`` with a host C++
compiler behind a shim of those lines and run the same glue on numpy (tests/trainer_core/
test_compression_cuda.py), so the arithmetic is checked on any machine, and on cupy where a GPU is.

Where the float arithmetic decides a bit, the kernels do what the host kernels do, in the same
order: 2-bit compares and subtracts in the work type; 1-bit sums each block's four lanes (elements
``4 i + j``) sequentially in float64, one thread per lane, joins them as ``(l0 + l1) + (l2 + l3)``
and divides in float64 (so its means are bitwise those of the host, not those of a parallel
scan); top-k finds the k-th largest ``|v|`` exactly (radix histogram, then a sort of one bucket)
and breaks ties by lowest index. Every float32 add, subtract, compare and conversion is a PTX
instruction without ``.ftz`` (cupy compiles with ``-ftz=true``, which would flush subnormals to
zero: a value of -1e-40 would then count as >= 0), and ``--fmad=false`` fuses nothing.

This module imports cupy only in ``compile_cupy``; ``Kernels`` works on whatever array module and
launcher it is given (cupy and ``RawModule`` functions here, numpy and host-compiled ones in tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

# the source, re-exported: the tests compile it on the host
from ._cuda_source import NAMES as NAMES
from ._cuda_source import NBINS as NBINS
from ._cuda_source import PREAMBLE as PREAMBLE
from ._cuda_source import TYPES as TYPES
from ._cuda_source import render as render
from ._cuda_source import source as source

#: threads per block, and the most blocks one launch uses (the kernels stride over the rest)
THREADS = 256
MAX_BLOCKS = 4096
#: NVRTC options: no fused multiply-add. (cupy adds ``-ftz=true``, which is why float32 operations
#: are written in PTX: ``PREAMBLE``.)
OPTIONS = ("--fmad=false",)


def geometry(work: int, threads: int = THREADS) -> tuple[tuple[int], tuple[int]]:
    """``(grid, block)`` for ``work`` items (at least one block; at most ``MAX_BLOCKS``)."""
    return (max(1, min(MAX_BLOCKS, math.ceil(work / threads))),), (threads,)


def onebit_sizes(n: int, block: int) -> tuple[int, int]:
    """(blocks, bit bytes) of a 1-bit payload of ``n`` values: ``8 * blocks + bit bytes`` in all."""
    return math.ceil(n / block), math.ceil(n / 8)


def twobit_bytes(n: int) -> int:
    """2-bit payload bytes: whole 32-bit words of 16 values."""
    return 4 * math.ceil(n / 16)


class Kernels:
    """The kernels of one gradient dtype and the glue around them.

    ``xp`` is the array module of the arrays, ``funcs`` maps each name of ``NAMES`` to a launcher
    ``f(grid, block, args)`` (cupy's ``RawKernel`` calling convention), ``scalar(x)`` turns a device
    0-d or small array into host numbers. Encoders update ``r`` in place and return the payload on
    the device; decoders write into ``out`` (allocated when ``None``) and return it.
    """

    def __init__(
        self, xp: Any, funcs: Mapping[str, Callable[..., Any]], dtype: Any, host: Callable[[Any], Any]
    ):
        self.xp = xp
        self.funcs = funcs
        self.dtype = np.dtype(dtype)
        self.work = np.dtype(np.float64) if self.dtype == np.float64 else np.dtype(np.float32)
        self.key = np.dtype(np.uint64) if self.work == np.float64 else np.dtype(np.uint32)
        self.half = np.int32(self.dtype == np.float16)
        self.host = host

    def launch(self, name: str, work: int, *args: Any, threads: int = THREADS) -> None:
        if work > 0:
            grid, block = geometry(work, threads)
            self.funcs[name](grid, block, args)

    # -- 2-bit ---------------------------------------------------------------------------------
    def twobit_encode(self, g: Any, r: Any, t: float) -> Any:
        n = g.size
        out = self.xp.empty(twobit_bytes(n), dtype=np.uint8)
        tw = self.work.type(t)
        self.launch("twobit_encode", out.size, g, r, tw, -tw, out, np.int64(n), np.int64(out.size))
        return out

    def twobit_decode(self, buf: Any, t: float, n: int, out: Any) -> Any:
        out = self._out(out, n)
        self.launch("twobit_decode", n, buf, np.float64(t), out, np.int64(n))
        return out

    # -- 1-bit ---------------------------------------------------------------------------------
    def onebit_encode(self, g: Any, r: Any, block: int) -> Any:
        xp, n = self.xp, g.size
        nblocks, nbytes = onebit_sizes(n, block)
        out = xp.empty(8 * nblocks + nbytes, dtype=np.uint8)
        sums = xp.empty(8 * nblocks, dtype=np.float64)
        counts = xp.empty(8 * nblocks, dtype=np.int64)  # per lane: non-negative, non-finite
        # few threads, each a long sequential loop: small blocks spread them over the multiprocessors
        b, nb = np.int64(block), np.int64(nblocks)
        self.launch("onebit_lanes", 4 * nblocks, g, r, np.int64(n), b, nb, sums, counts, threads=64)
        vals, bits = out[: 8 * nblocks].view(np.float32), out[8 * nblocks :]
        self.launch(
            "onebit_pack", nbytes, r, np.int64(n), b, sums, counts, vals, bits, np.int64(nbytes), self.half
        )
        return out

    def onebit_decode(self, buf: Any, block: int, n: int, out: Any) -> Any:
        out = self._out(out, n)
        nblocks, _ = onebit_sizes(n, block)
        vals, bits = buf[: 8 * nblocks].view(np.float32), buf[8 * nblocks :]
        self.launch("onebit_decode", n, vals, bits, np.int64(block), out, np.int64(n))
        return out

    # -- top-k ---------------------------------------------------------------------------------
    def topk_encode(self, g: Any, r: Any, k: int) -> Any:
        """r += g, then the k entries of largest magnitude: all above the k-th largest, then the
        lowest-index ones equal to it (the host kernels' rule)."""
        xp, n = self.xp, g.size
        keys = xp.empty(n, dtype=self.key)
        hist = xp.zeros(NBINS, dtype=np.uint64)
        self.launch("topk_keys", n, g, r, keys, np.int64(n), hist)
        counts = self.host(hist)
        idx = xp.arange(n, dtype=np.int64) if k == n else self.select(keys, counts, k)
        # keys of NaN and +-inf fill the top bins (exponent all ones): every non-finite element's
        # residual becomes 0 (they rank first, so the payload holds at least one of them)
        shift = 8 * self.key.itemsize - 12
        first = int(np.array(np.inf, self.work).view(self.key)) >> shift
        bad = ~xp.isfinite(r) if k and int(counts[first:].sum()) else None
        out = xp.empty(8 * k, dtype=np.uint8)
        out_idx, out_val = out[: 4 * k].view(np.uint32), out[4 * k :].view(np.float32)
        self.launch("topk_gather", k, idx, r, np.int64(k), out_idx, out_val, self.half)
        if bad is not None:
            r[bad] = 0
        return out

    def select(self, keys: Any, hist: np.ndarray, k: int) -> Any:
        """Ascending indices of the k largest keys, ties at the k-th by lowest index."""
        xp, key = self.xp, self.key.type
        shift = 8 * self.key.itemsize - 12
        above = np.cumsum(hist[::-1].astype(np.int64))  # keys in the top i + 1 bins
        top = int(np.searchsorted(above, k))  # the k-th largest key is in bin NBINS - 1 - top
        b = NBINS - 1 - top
        before = int(above[top]) - int(hist[b])  # keys in higher bins: all sent
        cand = xp.sort(keys[(keys >> key(shift)) == key(b)])
        t = cand[cand.size - (k - before)]  # the k-th largest key
        t_host, gt, eq = (
            int(x) for x in self.host(xp.stack([t.astype(np.int64), (cand > t).sum(), (cand == t).sum()]))
        )
        ties = k - before - gt  # how many keys equal to t are sent, the lowest-index ones
        tk = key(t_host)
        if ties == eq:
            sel = keys >= tk
        else:
            same = keys == tk
            sel = (keys > tk) | (same & (xp.cumsum(same, dtype=np.int64) <= ties))
        return xp.flatnonzero(sel).astype(np.int64, copy=False)

    def topk_decode(self, buf: Any, k: int, n: int, out: Any) -> Any:
        out = self._out(out, n)
        out.fill(0)
        idx = buf[: 4 * k].view(np.uint32)
        if k and int(self.host(idx.max())) >= n:
            raise ValueError(f"topk payload has an index beyond {n} values")
        self.launch("topk_decode", k, idx, buf[4 * k :].view(np.float32), np.int64(k), out)
        return out

    def _out(self, out: Any, n: int) -> Any:
        return self.xp.empty(n, dtype=self.dtype) if out is None else out


def compile_cupy(dtype: Any) -> Kernels:
    """The kernels for cupy arrays of ``dtype``, compiled now (cupy caches them on disk);
    raises whatever cupy raises when they cannot be compiled or loaded."""
    import cupy

    module = cupy.RawModule(code=source(dtype), options=OPTIONS)
    funcs = {name: module.get_function(name) for name in NAMES}  # compiles and loads
    return Kernels(cupy, funcs, dtype, cupy.asnumpy)
