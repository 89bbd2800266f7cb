"""Compiled kernels (numba) for host arrays; the numpy kernels are the fallback. This module
holds numba's import, the decorators every kernel module uses (``_jit`` registers a kernel in
``kernels()``) and the 2-bit kernels; ``_fast_onebit`` the 1-bit ones, ``_fast_topk`` top-k's.

numba is a regular dependency where it has a wheel. Each kernel produces exactly the same
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
