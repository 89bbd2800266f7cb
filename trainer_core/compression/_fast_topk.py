"""Compiled (numba) top-k selection for host arrays; ``topk.select_xp`` is the numpy twin.

Both give the ascending indices of the ``k`` largest magnitudes, every entry above the k-th
largest magnitude, then the lowest-index entries equal to it, so their payloads are identical
(tested). Magnitudes are compared as the bits of ``r`` with the sign cleared (``rbits & mask``).
"""

from __future__ import annotations

import numpy as np

from ._fast import _helper, _jit

#: the bits of a key that a histogram bucket holds (the top 15 of the magnitude)
BUCKETS = 1 << 15
#: below this many values, or with k above one in SAMPLED_MAX_SHARE of them, one radix select
SAMPLED_MIN = 1 << 16
SAMPLED_MAX_SHARE = 8
#: values looked at to estimate a magnitude that somewhat more than k values reach
SAMPLE = 1 << 14
#: the values r += g is done on at a time before they are scanned (in cache)
CHUNK = 1 << 12


@_jit
def topk_encode(g, r, rbits, mask, k, shift, out):
    """Top-k: r += g, then the ascending indices of the ``k`` largest ``|r|`` into ``out`` (room
    for k + 1): every entry above the k-th largest magnitude, then the lowest-index entries equal
    to it.

    A sample of the values gives a bucket ``low`` that a little more than k of them should reach;
    one pass adds ``g`` and flags the values that reach it (vector code, a chunk at a time), then
    lists the flagged indices and their keys from cache; the exact selection then runs on that
    list alone (``_select_listed``). When fewer than k, or too many, reach ``low``, or the array
    is small, ``_radix_select`` looks at every value."""
    n = g.shape[0]
    if k == 0 or n < SAMPLED_MIN or SAMPLED_MAX_SHARE * k > n:
        return _radix_select(g, r, rbits, mask, k, shift, out, True)
    low = _sample_bound(g, r, rbits, mask, k, shift)
    edge = np.empty(1, rbits.dtype)
    edge[0] = low << shift  # the least key of bucket low, as a magnitude:
    least = edge.view(r.dtype)[0]  # key >= edge  <=>  not |v| < least (NaN ranks first)
    if least != least:  # a bucket of NaNs: every value is looked at
        return _radix_select(g, r, rbits, mask, k, shift, out, True)
    cap = 4 * k + 4096
    listed = np.empty(cap + 8, np.int64)  # room for a word's 8 past the cap
    keys = np.empty(cap + 8, rbits.dtype)
    words = np.empty(CHUNK // 8, np.uint64)
    flags = words.view(np.uint8)
    m = 0
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        _add_flag(g[s:e], r[s:e], least, flags)
        for w in range((e - s) >> 3):  # a word at a time; its eight written branch-free
            if words[w] and m <= cap:
                for j in range(s + 8 * w, s + 8 * w + 8):
                    listed[m] = j
                    keys[m] = rbits[j] & mask
                    m += flags[j - s]
        for j in range(s + ((e - s) & ~7), e):  # the last few
            if flags[j - s] and m <= cap:
                listed[m] = j
                keys[m] = rbits[j] & mask
                m += 1
    if m < k or m > cap:
        return _radix_select(g, r, rbits, mask, k, shift, out, False)
    return _select_listed(listed[:m], keys[:m], k, shift, low, out)


@_jit
def take(r, idx, indices, values):
    """The payload of the selected ``idx``: ``indices`` (uint32) and ``values`` (float32, as
    rounded by ``astype``); then, when every value taken is finite, r -= what was sent. False (r
    untouched) when one is not: ``TopK._encode`` applies the non-finite rule then."""
    finite = True
    for j in range(idx.shape[0]):
        i = idx[j]
        x = r[i]
        indices[j] = i
        values[j] = np.float32(x)
        finite &= x - x == 0
    if finite:
        for j in range(idx.shape[0]):
            i = idx[j]
            r[i] -= values[j]
    return finite


@_helper
def _add_flag(g, r, least, flags):
    """r += g; flags[i] = not |r[i]| < least (1 for NaN)."""
    for i in range(g.shape[0]):
        v = r[i] + g[i]
        r[i] = v
        flags[i] = not abs(v) < least


@_helper
def _sample_bound(g, r, rbits, mask, k, shift):
    """A bucket (``key >> shift``) that, judging by SAMPLE evenly spaced values of r + g, a little
    more than k of the n values reach (the expected count plus five standard deviations and 8)."""
    n = g.shape[0]
    step = n // SAMPLE
    v = np.empty(SAMPLE, r.dtype)
    for j in range(SAMPLE):
        v[j] = r[j * step] + g[j * step]
    keys = v.view(rbits.dtype)
    hist = np.zeros(BUCKETS, np.int64)
    for j in range(SAMPLE):
        hist[(keys[j] & mask) >> shift] += 1
    want = k * SAMPLE / n
    want += 5.0 * np.sqrt(want) + 8.0
    b = BUCKETS - 1
    seen = hist[b]
    while seen < want and b > 0:
        b -= 1
        seen += hist[b]
    return b


@_helper
def _select_listed(listed, keys, k, shift, low, out):
    """The top-k among the ascending indices ``listed`` (their ``keys`` all in buckets from
    ``low``), which hold every index whose key is at least the k-th largest, and at least k of
    them: ``_radix_select``'s steps on the list."""
    m = listed.shape[0]
    hist = np.zeros(BUCKETS - low, np.int64)
    for j in range(m):
        hist[np.int64(keys[j] >> shift) - low] += 1
    above = 0
    b = BUCKETS - 1 - low
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    cand = np.empty(hist[b], keys.dtype)
    b += low
    nc = 0
    for j in range(m):
        if np.int64(keys[j] >> shift) == b:
            cand[nc] = keys[j]
            nc += 1
    t = np.sort(cand)[nc - (k - above)]  # the k-th largest key
    eq = k - above  # how many keys equal to t are taken
    for j in range(nc):
        if cand[j] > t:
            eq -= 1
    o = 0
    for j in range(m):
        x = keys[j]
        if x > t or (x == t and eq > 0):
            eq -= x == t
            out[o] = listed[j]
            o += 1
    return out


@_helper
def _radix_select(g, r, rbits, mask, k, shift, out, add):
    """``topk_encode`` over every value (r += g first when ``add``).

    ``rbits`` is ``r`` viewed as unsigned ints; ``rbits & mask`` (the sign bit cleared) orders
    like the magnitudes. A radix select in two passes: a histogram of the top 15 magnitude bits
    (``key >> shift``) finds the bucket of the k-th largest key; the second pass takes every index
    of a higher bucket and collects that bucket's entries, whose sort gives the k-th key; the
    taken ones of the bucket are then merged in index order. ``out`` needs room for k + 1."""
    n = g.shape[0]
    if add:
        for i in range(n):
            r[i] += g[i]
    if k == 0:
        return out
    hist = np.zeros(BUCKETS, np.int64)
    for i in range(n):
        hist[(rbits[i] & mask) >> shift] += 1
    above = 0  # keys in buckets above the k-th key's bucket
    b = BUCKETS - 1
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    # branchless: each list has room for one index past its end
    high = np.empty(above + 1, np.int64)
    cidx = np.empty(hist[b] + 1, np.int64)
    nh = 0
    nc = 0
    for i in range(n):
        bucket = (rbits[i] & mask) >> shift
        high[nh] = i
        nh += bucket > b
        cidx[nc] = i
        nc += bucket == b
    ckeys = np.empty(nc, rbits.dtype)
    for j in range(nc):
        ckeys[j] = rbits[cidx[j]] & mask
    t = np.sort(ckeys)[nc - (k - above)]  # the k-th largest key
    eq = k - above  # how many keys equal to t are taken
    for j in range(nc):
        if ckeys[j] > t:
            eq -= 1
    # merge the high-bucket indices with the taken bucket entries, both ascending
    o = 0
    h = 0
    for j in range(nc):
        x = ckeys[j]
        take = x > t
        if x == t and eq > 0:
            take = True
            eq -= 1
        if take:
            c = cidx[j]
            while h < nh and high[h] < c:
                out[o] = high[h]
                o += 1
                h += 1
            out[o] = c
            o += 1
    while h < nh:
        out[o] = high[h]
        o += 1
        h += 1
    return out
