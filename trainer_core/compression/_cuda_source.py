"""The CUDA C source of the compression kernels (``_cuda.py`` compiles and drives them): one
template, ``BODY``, filled in per gradient dtype by ``render``, after ``PREAMBLE``'s CUDA-only
lines. See ``_cuda.py`` for the rules the kernels keep (byte-identical to the host kernels)."""

from __future__ import annotations

import string
from typing import Any

import numpy as np

#: first top-k histogram: the top 11 bits of the magnitude (sign bit cleared)
NBINS = 2048
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
/* the quiet NaN numpy writes (sign clear): what a non-finite value is sent as */
DEV float qnan() { return __uint_as_float(0x7fc00000u); }
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
/* false for NaN and +-inf, whose v - v is NaN (never equal to itself) */
DEV bool finite(W v) { W d = sub(v, v); return d == d; }

/* four consecutive values in one load or store (16 bytes of float32) where the pointer is aligned
   for it: the kernels below read and write whole runs of 4 this way, the same values in the same
   order as one at a time */
template <typename T> struct alignas(4 * sizeof(T)) Four { T v[4]; };
template <typename T> DEV bool fours(const T* p) {
    return ((unsigned long long)p & (unsigned long long)(4 * sizeof(T) - 1)) == 0;
}

/* one value of 2-bit: its bits (the j-th of a byte) into b; returns the new residual (a NaN or
   +-inf sends 01, read as NaN, and leaves 0) */
DEV W twobit_one(W v, W t, W nt, int j, unsigned int* b) {
    if (!finite(v)) { *b |= 1u << (6 - 2 * j); return (W)0; }
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
        put(out, k, c == 3u ? t : (c == 2u ? -t : (c == 1u ? widen(qnan()) : 0.0)));
    }
}

/* 1-bit, pass 1: one thread per (block, lane): v = r + g for the lane's elements 4 i + lane of
   the block, in order; float64 sums of the non-negative and of the negative ones, their count
   and the count of non-finite ones */
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
        long long nf = 0; /* non-finite elements: looked for only when a sum is not finite */
        if (!(ps - ps == 0.0 && ns - ns == 0.0))
            for (long long k = s + (q & 3); k < e; k += 4) nf += !finite(r[k]);
        sums[2 * q] = ps;
        sums[2 * q + 1] = ns;
        counts[2 * q] = cp;
        counts[2 * q + 1] = nf;
    }
}

DEV float onebit_mean(double total, long long count, int half) {
    float m = count > 0 ? narrow(total / (double)count) : 0.0f;
    return half ? h2f(f2h(m)) : m;
}

/* the residual of an element of a block that sends NaN: v, or 0 where v is not finite */
DEV W keep(W v) { return finite(v) ? v : (W)0; }

/* 1-bit, pass 2: one thread per bit byte (8 values of one block, block_size being a multiple of
   8): the block's means from its lanes, the bits (MSB first), r -= the value sent; the thread of
   a block's first byte writes the block's (value of bit 0, value of bit 1), both NaN when the
   block holds a non-finite value */
extern "C" __global__ void onebit_pack(W* r, long long n, long long block, const double* sums,
                                       const long long* counts, float* vals, unsigned char* bits,
                                       long long nbytes, int half) {
    GRID_LOOP(i, nbytes) {
        long long k0 = 8 * i;
        long long blk = k0 / block;
        long long s = blk * block;
        long long e = lmin(s + block, n);
        const double* q = sums + 8 * blk;
        const long long* c = counts + 8 * blk;
        long long cp = (c[0] + c[2]) + (c[4] + c[6]);
        bool bad = (c[1] + c[3]) + (c[5] + c[7]) > 0;
        float hi = bad ? qnan() : onebit_mean((q[0] + q[2]) + (q[4] + q[6]), cp, half);
        float lo = bad ? qnan() : onebit_mean((q[1] + q[3]) + (q[5] + q[7]), (e - s) - cp, half);
        unsigned int acc = 0;
        if (fours(r) && k0 + 8 <= e) {
            for (int h = 0; h < 2; ++h) {
                Four<W> rv = *(const Four<W>*)(r + k0 + 4 * h);
                for (int j = 0; j < 4; ++j) {
                    bool p = ge(rv.v[j], (W)0);
                    rv.v[j] = bad ? keep(rv.v[j]) : sub(rv.v[j], from_f(p ? hi : lo, (W)0));
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
                    r[k] = bad ? keep(v) : sub(v, from_f(p ? hi : lo, (W)0));
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
