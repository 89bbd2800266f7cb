"""Compiled kernels (numba) for host arrays; the numpy kernels are the fallback.

numba is a regular dependency where it has a wheel. Each kernel here produces exactly the same
bytes and residual as its numpy twin in the compressor module (tested), in one pass over memory
instead of several. Kernels compile on first call and are cached on disk (next to this file, or
in the user's cache directory on a read-only install; with no writable place at all they compile
in every process); ``kernels.warm`` does that ahead of time. The bit layouts are those of
``docs/wire.md`` (section "Compressed payloads").
"""

from __future__ import annotations

from typing import Any

import numpy as np

numba: Any
#: why numba could not be imported (``None``: it was)
IMPORT_ERROR: str | None = None
#: why the compiled code is not cached on disk (``None``: it is)
CACHE_ERROR: str | None = None
try:  # no wheel on some platforms: then the numpy kernels run
    import numba
    import numba.extending
except ImportError as exc:  # pragma: no cover - depends on the environment
    numba = None
    IMPORT_ERROR = str(exc)

_KERNELS: list[Any] = []


def available() -> bool:
    """True when numba imported."""
    return numba is not None


def kernels() -> list[Any]:
    """The numba dispatchers of this module (empty without numba)."""
    return list(_KERNELS)


def _jit(fn: Any, register: bool = True) -> Any:
    global CACHE_ERROR
    if numba is None:  # pragma: no cover - depends on the environment
        return fn
    try:
        kernel = numba.njit(cache=True, nogil=True, boundscheck=False)(fn)
    except RuntimeError as exc:  # no writable cache directory anywhere ("no locator available")
        CACHE_ERROR = str(exc)
        kernel = numba.njit(nogil=True, boundscheck=False)(fn)
    if register:
        _KERNELS.append(kernel)
    return kernel


def _helper(fn: Any) -> Any:
    """A function the kernels call (compiled into them; not a kernel of its own)."""
    return _jit(fn, register=False)


def _add_lane_sums4_ir(context: Any, builder: Any, sig: Any, args: Any) -> Any:
    """LLVM IR of ``_add_lane_sums4``: numba does not vectorize the four in-order lane sums
    (its loop vectorizer leaves ordered float reductions alone, its SLP vectorizer is off), so the
    row loop is written with 4-wide vector values: one row (elements 4 i .. 4 i + 3) is one vector,
    and each block's non-negative and negative sums are one vector of its four lanes each."""
    from llvmlite import ir
    from numba.core import cgutils

    ga, ra, start, block, oa = args
    elem = context.get_value_type(sig.args[0].dtype)
    row_t = ir.VectorType(elem, 4)
    acc_t = ir.VectorType(ir.DoubleType(), 4)
    zero = ir.Constant(acc_t, [0.0] * 4)
    data = [context.make_array(sig.args[i])(context, builder, a).data for i, a in ((0, ga), (1, ra), (4, oa))]
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(8)]
    firsts = [builder.add(start, builder.mul(block, ir.Constant(block.type, j))) for j in range(4)]
    rows = builder.udiv(block, ir.Constant(block.type, 4))
    with cgutils.for_range(builder, rows) as loop:
        off = builder.mul(loop.index, ir.Constant(block.type, 4))
        for j in range(4):
            at = builder.add(firsts[j], off)
            gp = builder.bitcast(builder.gep(data[0], [at]), row_t.as_pointer())
            rp = builder.bitcast(builder.gep(data[1], [at]), row_t.as_pointer())
            v = builder.fadd(builder.load(rp, align=4), builder.load(gp, align=4))
            builder.store(v, rp, align=4)
            x = builder.fpext(v, acc_t) if elem != ir.DoubleType() else v
            nonneg = builder.fcmp_ordered(">=", x, zero)  # false for NaN, as in the scalar code
            for acc, add in (
                (accs[2 * j], builder.select(nonneg, x, zero)),
                (accs[2 * j + 1], builder.select(nonneg, zero, x)),
            ):
                builder.store(builder.fadd(builder.load(acc), add), acc)
    for i, acc in enumerate(accs):
        dst = builder.bitcast(builder.gep(data[2], [ir.Constant(block.type, 4 * i)]), acc_t.as_pointer())
        builder.store(builder.load(acc), dst, align=8)
    return context.get_dummy_value()


def _add_lane_sums4_typer(typingctx: Any, g: Any, r: Any, start: Any, block: Any, sums: Any) -> Any:
    """For the four blocks of ``block`` values from ``start`` (C-contiguous float32 or float64
    ``g`` and ``r`` of one dtype, ``block`` a multiple of 4): r += g, and into ``sums[8 j :
    8 j + 8]`` block j's four lane sums (lane l: elements 4 i + l, left to right from +0.0, in
    float64) of its non-negative values, then of the others (NaN included)."""
    arrays = (g, r, sums)
    if not all(isinstance(a, numba.types.Array) and a.ndim == 1 and a.layout == "C" for a in arrays):
        return None
    if g.dtype != r.dtype or g.dtype not in (numba.float32, numba.float64) or sums.dtype != numba.float64:
        return None
    return numba.types.void(g, r, numba.intp, numba.intp, sums), _add_lane_sums4_ir


#: called from the kernels as ``_add_lane_sums4(g, r, start, block, sums)``
_add_lane_sums4: Any = None if numba is None else numba.extending.intrinsic(_add_lane_sums4_typer)


@_jit
def twobit_encode(g, r, t, out):
    """2-bit: v = r + g; code 11 (+t, r = v - t) / 10 (-t, r = v + t) / 00 (0, r = v); a NaN or
    +-inf ``v`` (``v - v`` is then NaN) sends 01 (NaN) and leaves r = 0.

    Four codes per byte, the first element in the two high bits; ``out`` is zero-padded.
    ``t`` must be a scalar of the residual's dtype so comparisons match numpy's.
    """
    n = g.shape[0]
    nfull = n // 4
    for i in range(nfull):
        b = 0
        for j in range(4):
            k = 4 * i + j
            v = r[k] + g[k]
            c = 0
            if v >= t:
                c = 3
                v -= t
            elif v <= -t:
                c = 2
                v += t
            if v - v != 0:  # NaN or +-inf (the steps above keep them so): 01 (NaN), residual 0
                c = 1
                v = t - t
            b |= c << (6 - 2 * j)
            r[k] = v
        out[i] = b
    for i in range(nfull, out.shape[0]):
        b = 0
        for j in range(4):
            k = 4 * i + j
            if k < n:
                v = r[k] + g[k]
                c = 0
                if v >= t:
                    c = 3
                    v -= t
                elif v <= -t:
                    c = 2
                    v += t
                if v - v != 0:  # NaN or +-inf (the steps above keep them so): 01 (NaN), residual 0
                    c = 1
                    v = t - t
                b |= c << (6 - 2 * j)
                r[k] = v
        out[i] = b
    return out


@_jit
def twobit_decode(p, t, out):
    """Inverse of ``twobit_encode`` into ``out`` (n values); code 01 reads as NaN."""
    n = out.shape[0]
    vals = np.empty(4, out.dtype)  # by code: 0, NaN, -t, +t
    vals[0] = t - t
    vals[1] = np.nan
    vals[2] = -t
    vals[3] = t
    nfull = n // 4
    for i in range(nfull):
        b = p[i]
        for j in range(4):
            out[4 * i + j] = vals[(b >> (6 - 2 * j)) & 3]
    for k in range(4 * nfull, n):
        out[k] = vals[(p[k >> 2] >> (6 - 2 * (k & 3))) & 3]
    return out


@_helper
def _onebit_blocks(g, r, block, vals, bits, first):
    """1-bit, block by block from block ``first``: per block, v = r + g; bit = v >= 0 (MSB first);
    ``vals[2b]``/``vals[2b+1]`` = float32 means of the negative / non-negative entries (0 if none),
    summed in float64 over four lanes as in ``onebit.lane_sums``; r = v - reconstruction. A block
    holding a NaN or +-inf sends NaN for both values and keeps r = v (0 for the non-finite
    elements). ``onebit_encode`` runs the same steps four blocks at a time."""
    n = g.shape[0]
    for blk in range(first, vals.shape[0] // 2):
        s = blk * block
        e = min(s + block, n)
        gg = g[s:e]
        rr = r[s:e]
        bb = bits[s >> 3 : (e + 7) >> 3]
        m = e - s
        # four interleaved running sums (lane j holds elements 4 i + j) joined as
        # (l0 + l1) + (l2 + l3); branchless, since adding 0.0 leaves a sum unchanged
        p0 = p1 = p2 = p3 = 0.0
        n0 = n1 = n2 = n3 = 0.0
        cp = 0
        for i in range(m >> 2):
            k = 4 * i
            v0 = rr[k] + gg[k]
            v1 = rr[k + 1] + gg[k + 1]
            v2 = rr[k + 2] + gg[k + 2]
            v3 = rr[k + 3] + gg[k + 3]
            rr[k] = v0
            rr[k + 1] = v1
            rr[k + 2] = v2
            rr[k + 3] = v3
            b0 = v0 >= 0
            b1 = v1 >= 0
            b2 = v2 >= 0
            b3 = v3 >= 0
            p0 += np.float64(v0) if b0 else 0.0
            p1 += np.float64(v1) if b1 else 0.0
            p2 += np.float64(v2) if b2 else 0.0
            p3 += np.float64(v3) if b3 else 0.0
            n0 += 0.0 if b0 else np.float64(v0)
            n1 += 0.0 if b1 else np.float64(v1)
            n2 += 0.0 if b2 else np.float64(v2)
            n3 += 0.0 if b3 else np.float64(v3)
            cp += b0 + b1 + b2 + b3
        for k in range(m & ~3, m):  # the tail: lanes 0, 1, 2 in order
            v = rr[k] + gg[k]
            rr[k] = v
            x = np.float64(v)
            bk = v >= 0
            cp += bk
            lane = k & 3
            if lane == 0:
                p0 += x if bk else 0.0
                n0 += 0.0 if bk else x
            elif lane == 1:
                p1 += x if bk else 0.0
                n1 += 0.0 if bk else x
            else:
                p2 += x if bk else 0.0
                n2 += 0.0 if bk else x
        sp = (p0 + p1) + (p2 + p3)
        sn = (n0 + n1) + (n2 + n3)
        # a sum that is not finite: is there a NaN or +-inf in the block (or did a sum overflow)?
        bad = False
        if sp - sp != 0 or sn - sn != 0:
            for k in range(m):
                bad |= rr[k] - rr[k] != 0
        cn = m - cp
        hi = np.float32(sp / cp) if cp > 0 else np.float32(0.0)
        lo = np.float32(sn / cn) if cn > 0 else np.float32(0.0)
        if bad:  # nothing subtracted below (v - 0.0 is v), NaN sent (after the bits)
            hi = lo = np.float32(0.0)
        vals[2 * blk] = lo
        vals[2 * blk + 1] = hi
        for i in range(m >> 3):
            acc = 0
            for j in range(8):
                k = 8 * i + j
                v = rr[k]
                p = v >= 0
                rr[k] = v - (hi if p else lo)
                acc |= p << (7 - j)
            bb[i] = acc
        if m & 7:
            acc = 0
            for k in range(m & ~7, m):
                v = rr[k]
                p = v >= 0
                rr[k] = v - (hi if p else lo)
                acc |= p << (7 - (k & 7))
            bb[m >> 3] = acc
        if bad:
            vals[2 * blk] = np.float32(np.nan)
            vals[2 * blk + 1] = np.float32(np.nan)
            for k in range(m):
                if rr[k] - rr[k] != 0:
                    rr[k] = 0


@_jit
def onebit_encode(g, r, block, vals, bits):
    """1-bit (see ``_onebit_blocks``, whose results these are, bit for bit): groups of four full
    blocks take one pass over ``g`` and ``r`` (``_add_lane_sums4``: the add and the four lane sums
    of each block as vector operations, the four blocks' sums interleaved), then pack the signs
    eight to a byte, count them and update the residual, in cache; the rest block by block."""
    nquads = g.shape[0] // block // 4
    if nquads:
        signs = np.empty(block // 8, np.uint64)  # one byte per element, eight to a word
        sums = np.empty(32)
        for c in range(nquads):
            s = 4 * c * block
            _add_lane_sums4(g, r, s, block, sums)
            for j in range(4):
                e = s + j * block
                rr = r[e : e + block]
                cp = _sign_bytes(rr, signs.view(np.uint8))
                _pack_bytes(signs, bits[e >> 3 : (e + block) >> 3])
                q = 8 * j
                sp = (sums[q] + sums[q + 1]) + (sums[q + 2] + sums[q + 3])
                sn = (sums[q + 4] + sums[q + 5]) + (sums[q + 6] + sums[q + 7])
                cn = block - cp
                hi = np.float32(sp / cp) if cp > 0 else np.float32(0.0)
                lo = np.float32(sn / cn) if cn > 0 else np.float32(0.0)
                bad = False
                if sp - sp != 0 or sn - sn != 0:  # a NaN or +-inf in the block?
                    for k in range(block):
                        bad |= rr[k] - rr[k] != 0
                if bad:  # NaN sent, r = v with its non-finite elements set to 0
                    hi = lo = np.float32(np.nan)
                    for k in range(block):
                        if rr[k] - rr[k] != 0:
                            rr[k] = 0
                else:
                    for k in range(block):
                        v = rr[k]
                        rr[k] = v - (hi if v >= 0 else lo)
                vals[2 * (4 * c + j)] = lo
                vals[2 * (4 * c + j) + 1] = hi
    _onebit_blocks(g, r, block, vals, bits, 4 * nquads)
    return vals


#: (x * PACK) >> 56 of eight 0/1 bytes x gathers them MSB first: byte j lands in bit 7 - j
PACK = np.uint64(0x8040201008040201)


@_helper
def _sign_bytes(rr, out):
    """out[k] = rr[k] >= 0 (0 or 1); returns how many are 1."""
    count = 0
    for k in range(rr.shape[0]):
        p = rr[k] >= 0
        out[k] = p
        count += p
    return count


@_helper
def _pack_bytes(words, out):
    """Eight 0/1 bytes per word into one byte each, the first byte in the high bit."""
    for i in range(out.shape[0]):
        out[i] = (words[i] * PACK) >> np.uint64(56)


@_jit
def onebit_decode(vals, bits, block, out):
    """Inverse of ``onebit_encode`` into ``out`` (n values)."""
    n = out.shape[0]
    for blk in range(vals.shape[0] // 2):
        s = blk * block
        e = min(s + block, n)
        oo = out[s:e]
        bb = bits[s >> 3 : (e + 7) >> 3]
        m = e - s
        lo = vals[2 * blk]
        hi = vals[2 * blk + 1]
        for i in range(m >> 3):
            b = bb[i]
            for j in range(8):
                oo[8 * i + j] = hi if (b >> (7 - j)) & 1 else lo
        for k in range(m & ~7, m):
            oo[k] = hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo
    return out


@_jit
def onebit_decode_sum(vals, bits, block, out):
    """``out`` = the sum of ``k`` payloads decoded, added in order in ``out``'s dtype: ``((d0 + d1)
    + d2) ...``, the same bits as ``onebit_decode`` of each and numpy's adds. Payload ``j`` is
    ``vals[j]`` and ``bits[j]`` (rows of one shape, ``onebit_decode``'s two arguments). Block by
    block: a block of ``out`` is written from the first payload and added to from the others while
    it is in cache, one pass over ``out`` instead of a decode and an add per payload."""
    n = out.shape[0]
    for blk in range(vals.shape[1] // 2):
        s = blk * block
        e = min(s + block, n)
        oo = out[s:e]
        m = e - s
        for j in range(vals.shape[0]):
            bb = bits[j, s >> 3 : (e + 7) >> 3]
            lo = vals[j, 2 * blk]
            hi = vals[j, 2 * blk + 1]
            if j == 0:
                for i in range(m >> 3):
                    b = bb[i]
                    for q in range(8):
                        oo[8 * i + q] = hi if (b >> (7 - q)) & 1 else lo
                for k in range(m & ~7, m):
                    oo[k] = hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo
            else:
                for i in range(m >> 3):
                    b = bb[i]
                    for q in range(8):
                        oo[8 * i + q] += hi if (b >> (7 - q)) & 1 else lo
                for k in range(m & ~7, m):
                    oo[k] += hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo
    return out
