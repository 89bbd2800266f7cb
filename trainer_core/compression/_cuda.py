"""CUDA kernels for cupy arrays: the 1-bit, 2-bit and top-k encoders and decoders, byte-identical
to the host kernels (``_fast.py`` and the numpy twins in each compressor module).

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
import string
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: threads per block, and the most blocks one launch uses (the kernels stride over the rest)
THREADS = 256
MAX_BLOCKS = 4096
#: first top-k histogram: the top 11 bits of the magnitude (sign bit cleared)
NBINS = 2048
#: NVRTC options: no fused multiply-add. (cupy adds ``-ftz=true``, which is why float32 operations
#: are written in PTX: ``PREAMBLE``.)
OPTIONS = ("--fmad=false",)
NAMES = (
    "twobit_encode",
    "twobit_decode",
    "onebit_lanes",
    "onebit_pack",
    "onebit_decode",
    "topk_keys",
    "topk_gather",
    "topk_decode",
)
#: gradient dtype -> (G, W, K) of the template
TYPES = {
    "float16": ("unsigned short", "float", "unsigned int"),
    "float32": ("float", "float", "unsigned int"),
    "float64": ("double", "double", "unsigned long long"),
}

PREAMBLE = r"""
#define DEV __device__ __forceinline__
DEV float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
DEV unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
DEV unsigned int bits_of(float x) { return __float_as_uint(x); }
DEV unsigned long long bits_of(double x) { return (unsigned long long)__double_as_longlong(x); }
/* float32 operations in PTX without .ftz: cupy compiles with -ftz=true, which would flush
   subnormals (a tiny negative value would compare >= 0) */
DEV float add(float a, float b) { float c; asm("add.rn.f32 %0, %1, %2;" : "=f"(c) : "f"(a), "f"(b)); return c; }
DEV float sub(float a, float b) { float c; asm("sub.rn.f32 %0, %1, %2;" : "=f"(c) : "f"(a), "f"(b)); return c; }
DEV bool ge(float a, float b) {
    unsigned int p;
    asm("{ .reg .pred q; setp.ge.f32 q, %1, %2; selp.u32 %0, 1, 0, q; }" : "=r"(p) : "f"(a), "f"(b));
    return p != 0u;
}
DEV bool le(float a, float b) {
    unsigned int p;
    asm("{ .reg .pred q; setp.le.f32 q, %1, %2; selp.u32 %0, 1, 0, q; }" : "=r"(p) : "f"(a), "f"(b));
    return p != 0u;
}
DEV double widen(float x) { double d; asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(x)); return d; }
DEV float narrow(double x) { float f; asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(x)); return f; }
"""

BODY = string.Template(r"""
typedef $G G;
typedef $W W;
typedef $K K;
#define NBINS $NBINS
#define GRID_LOOP(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

/* every floating-point operation goes through these (float32 ones in PREAMBLE) */
DEV double add(double a, double b) { return a + b; }
DEV double sub(double a, double b) { return a - b; }
DEV bool ge(double a, double b) { return a >= b; }
DEV bool le(double a, double b) { return a <= b; }
DEV double widen(double x) { return x; }
DEV float to_f(float x) { return x; }
DEV float to_f(double x) { return narrow(x); }
DEV float from_f(float x, float) { return x; }
DEV double from_f(float x, double) { return widen(x); }
DEV float load(unsigned short h) { return h2f(h); }
DEV float load(float x) { return x; }
DEV double load(double x) { return x; }
DEV void put(unsigned short* p, long long i, float x) { p[i] = f2h(x); }
DEV void put(unsigned short* p, long long i, double x) { p[i] = f2h(narrow(x)); }
DEV void put(float* p, long long i, float x) { p[i] = x; }
DEV void put(float* p, long long i, double x) { p[i] = narrow(x); }
DEV void put(double* p, long long i, float x) { p[i] = widen(x); }
DEV void put(double* p, long long i, double x) { p[i] = x; }
DEV long long lmin(long long a, long long b) { return a < b ? a : b; }

/* four consecutive values in one load or store (16 bytes of float32) where the pointer is aligned
   for it: the kernels below read and write whole runs of 4 this way, the same values in the same
   order as one at a time */
template <typename T> struct alignas(4 * sizeof(T)) Four { T v[4]; };
template <typename T> DEV bool fours(const T* p) {
    return ((unsigned long long)p & (unsigned long long)(4 * sizeof(T) - 1)) == 0;
}

/* one value of 2-bit: its bits (the j-th of a byte) into b; returns the new residual */
DEV W twobit_one(W v, W t, W nt, int j, unsigned int* b) {
    if (ge(v, t)) { *b |= 3u << (6 - 2 * j); return sub(v, t); }
    if (le(v, nt)) { *b |= 2u << (6 - 2 * j); return add(v, t); }
    return v;
}

/* 2-bit: one thread per payload byte (4 values, the first in the high bits); bytes past the
   values (the padding to whole 32-bit words) are written as 0 */
extern "C" __global__ void twobit_encode(const G* g, W* r, W t, W nt, unsigned char* out, long long n,
                                         long long nbytes) {
    const bool vec = fours(g) && fours(r);
    GRID_LOOP(i, nbytes) {
        unsigned int b = 0;
        long long k0 = 4 * i;
        if (vec && k0 + 4 <= n) {
            Four<G> gv = *(const Four<G>*)(g + k0);
            Four<W> rv = *(const Four<W>*)(r + k0);
            for (int j = 0; j < 4; ++j) rv.v[j] = twobit_one(add(rv.v[j], load(gv.v[j])), t, nt, j, &b);
            *(Four<W>*)(r + k0) = rv;
        } else {
            for (int j = 0; j < 4; ++j) {
                long long k = k0 + j;
                if (k < n) r[k] = twobit_one(add(r[k], load(g[k])), t, nt, j, &b);
            }
        }
        out[i] = (unsigned char)b;
    }
}

extern "C" __global__ void twobit_decode(const unsigned char* p, double t, G* out, long long n) {
    GRID_LOOP(k, n) {
        unsigned int c = (p[k >> 2] >> (6 - 2 * (k & 3))) & 3u;
        put(out, k, c == 3u ? t : (c == 2u ? -t : 0.0));
    }
}

/* 1-bit, pass 1: one thread per (block, lane): v = r + g for the lane's elements 4 i + lane of
   the block, in order; float64 sums of the non-negative and of the negative ones, and a count */
extern "C" __global__ void onebit_lanes(const G* g, W* r, long long n, long long block,
                                        long long nblocks, double* sums, long long* counts) {
    GRID_LOOP(q, 4 * nblocks) {
        long long s = (q >> 2) * block;
        long long e = lmin(s + block, n);
        double ps = 0.0, ns = 0.0;
        long long cp = 0;
        for (long long k = s + (q & 3); k < e; k += 4) {
            W v = add(r[k], load(g[k]));
            r[k] = v;
            if (ge(v, (W)0)) { ps += widen(v); cp += 1; } else { ns += widen(v); }
        }
        sums[2 * q] = ps;
        sums[2 * q + 1] = ns;
        counts[q] = cp;
    }
}

DEV float onebit_mean(double total, long long count, int half) {
    float m = count > 0 ? narrow(total / (double)count) : 0.0f;
    return half ? h2f(f2h(m)) : m;
}

/* 1-bit, pass 2: one thread per bit byte (8 values of one block, block_size being a multiple of
   8): the block's means from its lanes, the bits (MSB first), r -= the value sent; the thread of
   a block's first byte writes the block's (value of bit 0, value of bit 1) */
extern "C" __global__ void onebit_pack(W* r, long long n, long long block, const double* sums,
                                       const long long* counts, float* vals, unsigned char* bits,
                                       long long nbytes, int half) {
    GRID_LOOP(i, nbytes) {
        long long k0 = 8 * i;
        long long blk = k0 / block;
        long long s = blk * block;
        long long e = lmin(s + block, n);
        const double* q = sums + 8 * blk;
        const long long* c = counts + 4 * blk;
        long long cp = (c[0] + c[1]) + (c[2] + c[3]);
        float hi = onebit_mean((q[0] + q[2]) + (q[4] + q[6]), cp, half);
        float lo = onebit_mean((q[1] + q[3]) + (q[5] + q[7]), (e - s) - cp, half);
        unsigned int acc = 0;
        if (fours(r) && k0 + 8 <= e) {
            for (int h = 0; h < 2; ++h) {
                Four<W> rv = *(const Four<W>*)(r + k0 + 4 * h);
                for (int j = 0; j < 4; ++j) {
                    bool p = ge(rv.v[j], (W)0);
                    rv.v[j] = sub(rv.v[j], from_f(p ? hi : lo, (W)0));
                    acc |= (unsigned int)p << (7 - 4 * h - j);
                }
                *(Four<W>*)(r + k0 + 4 * h) = rv;
            }
        } else {
            for (int j = 0; j < 8; ++j) {
                long long k = k0 + j;
                if (k < e) {
                    W v = r[k];
                    bool p = ge(v, (W)0);
                    r[k] = sub(v, from_f(p ? hi : lo, (W)0));
                    acc |= (unsigned int)p << (7 - j);
                }
            }
        }
        bits[i] = (unsigned char)acc;
        if (k0 == s) { vals[2 * blk] = lo; vals[2 * blk + 1] = hi; }
    }
}

extern "C" __global__ void onebit_decode(const float* vals, const unsigned char* bits, long long block,
                                         G* out, long long n) {
    GRID_LOOP(k, n) {
        long long blk = k / block;
        unsigned int b = (bits[k >> 3] >> (7 - (k & 7))) & 1u;
        put(out, k, b ? vals[2 * blk + 1] : vals[2 * blk]);
    }
}

/* top-k, pass 1: r += g; keys = the bits of |r| (ordered like the magnitudes); a histogram of
   the keys' top 11 bits (per block in shared memory, then added to ``hist``) */
extern "C" __global__ void topk_keys(const G* g, W* r, K* keys, long long n, unsigned long long* hist) {
    __shared__ unsigned int local[NBINS];
    const int shift = (int)(8 * sizeof(K)) - 12;
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x) local[b] = 0u;
    __syncthreads();
    GRID_LOOP(i, n) {
        W v = add(r[i], load(g[i]));
        r[i] = v;
        K key = bits_of(v) & (~(K)0 >> 1);
        keys[i] = key;
        atomicAdd(&local[(unsigned int)(key >> shift)], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x)
        if (local[b]) atomicAdd(&hist[b], (unsigned long long)local[b]);
}

/* top-k, last pass: one thread per sent entry: its index and float32 value into the payload,
   r -= what the receiver will hold (float32, then the gradient's dtype) */
extern "C" __global__ void topk_gather(const long long* idx, W* r, long long k, unsigned int* out_idx,
                                       float* out_val, int half) {
    GRID_LOOP(j, k) {
        long long i = idx[j];
        W v = r[i];
        float s = to_f(v);
        out_idx[j] = (unsigned int)i;
        out_val[j] = s;
        r[i] = sub(v, from_f(half ? h2f(f2h(s)) : s, (W)0));
    }
}

/* top-k decode: scatter into ``out`` (zeroed by the caller; indices checked by the caller) */
extern "C" __global__ void topk_decode(const unsigned int* idx, const float* val, long long k, G* out) {
    GRID_LOOP(j, k) { put(out, (long long)idx[j], val[j]); }
}
""")


def render(dtype: Any) -> str:
    """``BODY`` for gradients of ``dtype`` (float16/32/64)."""
    g, w, k = TYPES[np.dtype(dtype).name]
    return BODY.substitute(G=g, W=w, K=k, NBINS=NBINS)


def source(dtype: Any) -> str:
    """The whole CUDA source for ``dtype``."""
    return PREAMBLE + render(dtype)


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
        counts = xp.empty(4 * nblocks, dtype=np.int64)
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
        idx = xp.arange(n, dtype=np.int64) if k == n else self.select(keys, self.host(hist), k)
        out = xp.empty(8 * k, dtype=np.uint8)
        out_idx, out_val = out[: 4 * k].view(np.uint32), out[4 * k :].view(np.float32)
        self.launch("topk_gather", k, idx, r, np.int64(k), out_idx, out_val, self.half)
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
