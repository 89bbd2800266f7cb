"""Compiled (numba) 1-bit kernels for host arrays; ``onebit.encode_xp`` and ``onebit.decode_xp``
are the numpy twins, with the same bytes and residuals (tested). The encoder's four-block pass is
LLVM IR of its own (``_lane_sums4_ir``), the one part numba does not vectorize by itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._fast import _helper, _jit, numba
from ._fast_stream import _stream_bytes


def _lane_sums4_ir(inputs: int) -> Any:
    """LLVM IR of ``_add_lane_sums4`` (``inputs`` 1) and ``_add2_lane_sums4`` (2): numba does not
    vectorize the four in-order lane sums (its loop vectorizer leaves ordered float reductions
    alone, its SLP vectorizer is off), so the row loop is written with 4-wide vector values: one
    row (elements 4 i .. 4 i + 3) is one vector, and each block's non-negative and negative sums
    are one vector of its four lanes each."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        from llvmlite import ir
        from numba.core import cgutils

        start, block = args[inputs + 1], args[inputs + 2]
        elem = context.get_value_type(sig.args[0].dtype)
        row_t = ir.VectorType(elem, 4)
        acc_t = ir.VectorType(ir.DoubleType(), 4)
        zero = ir.Constant(acc_t, [0.0] * 4)
        arrays = [*range(inputs), inputs, inputs + 3]  # the inputs, r, sums
        data = [context.make_array(sig.args[i])(context, builder, args[i]).data for i in arrays]
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(8)]
        firsts = [builder.add(start, builder.mul(block, ir.Constant(block.type, j))) for j in range(4)]
        rows = builder.udiv(block, ir.Constant(block.type, 4))
        with cgutils.for_range(builder, rows) as loop:
            off = builder.mul(loop.index, ir.Constant(block.type, 4))
            for j in range(4):
                at = builder.add(firsts[j], off)
                ptrs = [builder.bitcast(builder.gep(d, [at]), row_t.as_pointer()) for d in data[: inputs + 1]]
                g = builder.load(ptrs[0], align=4)
                for gp in ptrs[1:inputs]:  # (g0 + g1) first, as numpy's sum of the two would be
                    g = builder.fadd(g, builder.load(gp, align=4))
                v = builder.fadd(builder.load(ptrs[inputs], align=4), g)
                builder.store(v, ptrs[inputs], align=4)
                x = builder.fpext(v, acc_t) if elem != ir.DoubleType() else v
                nonneg = builder.fcmp_ordered(">=", x, zero)  # false for NaN, as in the scalar code
                for acc, add in (
                    (accs[2 * j], builder.select(nonneg, x, zero)),
                    (accs[2 * j + 1], builder.select(nonneg, zero, x)),
                ):
                    builder.store(builder.fadd(builder.load(acc), add), acc)
        for i, acc in enumerate(accs):
            dst = builder.bitcast(builder.gep(data[-1], [ir.Constant(block.type, 4 * i)]), acc_t.as_pointer())
            builder.store(builder.load(acc), dst, align=8)
        return context.get_dummy_value()

    return codegen


def _lane_sums4_signature(arrays: tuple[Any, ...], sums: Any) -> Any:
    """The signature of a lane-sums intrinsic over ``arrays`` (the inputs, then r), or None."""
    if not all(isinstance(a, numba.types.Array) and a.ndim == 1 and a.layout == "C" for a in (*arrays, sums)):
        return None
    if any(a.dtype != arrays[0].dtype for a in arrays) or arrays[0].dtype not in (
        numba.float32,
        numba.float64,
    ):
        return None
    if sums.dtype != numba.float64:
        return None
    return numba.types.void(*arrays, numba.intp, numba.intp, sums)


def _add_lane_sums4_typer(typingctx: Any, g: Any, r: Any, start: Any, block: Any, sums: Any) -> Any:
    """For the four blocks of ``block`` values from ``start`` (C-contiguous float32 or float64
    ``g`` and ``r`` of one dtype, ``block`` a multiple of 4): r += g, and into ``sums[8 j :
    8 j + 8]`` block j's four lane sums (lane l: elements 4 i + l, left to right from +0.0, in
    float64) of its non-negative values, then of the others (NaN included)."""
    sig = _lane_sums4_signature((g, r), sums)
    return None if sig is None else (sig, _lane_sums4_ir(1))


def _add2_lane_sums4_typer(typingctx: Any, g: Any, g2: Any, r: Any, start: Any, block: Any, sums: Any) -> Any:
    """``_add_lane_sums4`` of ``g + g2`` (added first, in their dtype) without writing it."""
    sig = _lane_sums4_signature((g, g2, r), sums)
    return None if sig is None else (sig, _lane_sums4_ir(2))


#: called from the kernels as ``_add_lane_sums4(g, r, start, block, sums)``
_add_lane_sums4: Any = None if numba is None else numba.extending.intrinsic(_add_lane_sums4_typer)
#: called from the kernels as ``_add2_lane_sums4(g, g2, r, start, block, sums)``
_add2_lane_sums4: Any = None if numba is None else numba.extending.intrinsic(_add2_lane_sums4_typer)


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
            _add_lane_sums4(g, r, 4 * c * block, block, sums)
            _onebit_quad(r, c, block, sums, signs, vals, bits)
    _onebit_blocks(g, r, block, vals, bits, 4 * nquads)
    return vals


@_jit
def onebit_encode_sum(g, g2, r, block, vals, bits):
    """``onebit_encode`` of ``g + g2`` (added first in their dtype, as numpy's ``g + g2``; the same
    payload and residual), without writing the sum: the quads read both (``_add2_lane_sums4``),
    the few blocks after them are summed into a small array first."""
    nquads = g.shape[0] // block // 4
    if nquads:
        signs = np.empty(block // 8, np.uint64)
        sums = np.empty(32)
        for c in range(nquads):
            _add2_lane_sums4(g, g2, r, 4 * c * block, block, sums)
            _onebit_quad(r, c, block, sums, signs, vals, bits)
    s = 4 * nquads * block  # a multiple of 8: the bits of the rest start on a byte
    rest = g[s:] + g2[s:]
    _onebit_blocks(rest, r[s:], block, vals[8 * nquads :], bits[s >> 3 :], 0)
    return vals


@_helper
def _onebit_quad(r, c, block, sums, signs, vals, bits):
    """The four blocks of quad ``c`` after their lane sums (``sums``, from ``_add_lane_sums4``):
    the signs packed eight to a byte, counted, the blocks' two values, the residual updated."""
    s = 4 * c * block
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


@_helper
def _decode_block(bb, lo, hi, oo):
    """One block's values into ``oo`` (its length): ``hi`` where its bit in ``bb`` is set (MSB
    first), else ``lo``."""
    m = oo.shape[0]
    for i in range(m >> 3):
        b = bb[i]
        for j in range(8):
            oo[8 * i + j] = hi if (b >> (7 - j)) & 1 else lo
    for k in range(m & ~7, m):
        oo[k] = hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo


@_jit
def onebit_decode(vals, bits, block, out):
    """Inverse of ``onebit_encode`` into ``out`` (n values)."""
    n = out.shape[0]
    for blk in range(vals.shape[0] // 2):
        s = blk * block
        e = min(s + block, n)
        _decode_block(bits[s >> 3 : (e + 7) >> 3], vals[2 * blk], vals[2 * blk + 1], out[s:e])
    return out


@_jit
def onebit_decode_stream(vals, bits, block, out):
    """``onebit_decode`` (the same values) for a large ``out`` that is not read again at once:
    each block is decoded into a small buffer, in cache, then stored to ``out`` with non-temporal
    stores (``_fast_stream``: no read of ``out``'s lines before they are written, half the memory
    traffic of ``onebit_decode``, which counts where the machine's cores share its memory)."""
    n = out.shape[0]
    buf = np.empty(block, out.dtype)
    raw = buf.view(np.uint8)
    dst = out.view(np.uint8)
    size = out.itemsize
    for blk in range(vals.shape[0] // 2):
        s = blk * block
        e = min(s + block, n)
        m = e - s
        _decode_block(bits[s >> 3 : (e + 7) >> 3], vals[2 * blk], vals[2 * blk + 1], buf[:m])
        _stream_bytes(raw[: m * size], dst[s * size : e * size])
    return out


@_jit
def onebit_decode_sum(vals, bits, block, out):
    """``out`` = the sum of ``k`` payloads decoded, added in order in ``out``'s dtype: ``((d0 + d1)
    + d2) ...``, the same bits as ``onebit_decode`` of each and numpy's adds. Payload ``j`` is
    ``vals[j]`` and ``bits[j]`` (rows of one shape, ``onebit_decode``'s two arguments). Block by
    block: a block of ``out`` is written from the first payload and added to from the others while
    it is in cache, one pass over ``out`` instead of a decode and an add per payload."""
    _decode_sum_into(vals, bits, block, 0, vals.shape[1] // 2, out)
    return out


@_helper
def _decode_sum_into(vals, bits, block, first, nblocks, out):
    """Blocks ``first .. first + nblocks - 1`` of the sum of the payloads (``onebit_decode_sum``'s
    rows), into ``out`` from its start (``out``: at least their values; the last block may be
    short, ``n`` = ``8 * bits.shape[1]`` at most)."""
    for q in range(nblocks):
        blk = first + q
        s = blk * block
        m = min(block, out.shape[0] - q * block)
        oo = out[q * block : q * block + m]
        for j in range(vals.shape[0]):
            bb = bits[j, s >> 3 : (s + m + 7) >> 3]
            lo = vals[j, 2 * blk]
            hi = vals[j, 2 * blk + 1]
            if j == 0:
                for i in range(m >> 3):
                    b = bb[i]
                    for t in range(8):
                        oo[8 * i + t] = hi if (b >> (7 - t)) & 1 else lo
                for k in range(m & ~7, m):
                    oo[k] = hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo
            else:
                for i in range(m >> 3):
                    b = bb[i]
                    for t in range(8):
                        oo[8 * i + t] += hi if (b >> (7 - t)) & 1 else lo
                for k in range(m & ~7, m):
                    oo[k] += hi if (bb[k >> 3] >> (7 - (k & 7))) & 1 else lo


@_jit
def onebit_sum_encode(vals, bits, block, divisor, r, out_vals, out_bits):
    """``onebit_encode`` of the sum of the payloads (``onebit_decode_sum``'s rows ``vals`` and
    ``bits``; divided by ``divisor``, a scalar of ``r``'s dtype, unless it is 1) into the residual
    ``r``: the same payload and residual as ``onebit_decode_sum`` into an array, its division
    (``numpy.divide``) and ``onebit_encode`` of it, without writing that array: four blocks at a
    time are summed into a small buffer, in cache, and encoded from it."""
    n = r.shape[0]
    nquads = n // block // 4
    buf = np.empty(4 * block, r.dtype)
    scale = divisor != 1
    if nquads:
        signs = np.empty(block // 8, np.uint64)
        sums = np.empty(32)
        for c in range(nquads):
            s = 4 * c * block
            _decode_sum_into(vals, bits, block, 4 * c, 4, buf)
            if scale:
                for k in range(4 * block):
                    buf[k] = buf[k] / divisor
            rr = r[s : s + 4 * block]
            _add_lane_sums4(buf, rr, 0, block, sums)
            _onebit_quad(
                rr,
                0,
                block,
                sums,
                signs,
                out_vals[8 * c : 8 * c + 8],
                out_bits[s >> 3 : (s + 4 * block) >> 3],
            )
    s = 4 * nquads * block  # a multiple of 8: the bits of the rest start on a byte
    rest = np.empty(n - s, r.dtype)
    left = out_vals.shape[0] // 2 - 4 * nquads
    _decode_sum_into(vals, bits, block, 4 * nquads, left, rest)
    if scale:
        for k in range(n - s):
            rest[k] = rest[k] / divisor
    _onebit_blocks(rest, r[s:], block, out_vals[8 * nquads :], out_bits[s >> 3 :], 0)
    return out_vals
