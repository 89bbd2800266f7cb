"""PowerSGD's own allreduce: the low-rank factors are allreduced, not the compressed gradients
(Vogels et al. 2019, Algorithm 1; torch's ``powerSGD_hook``).

For a gradient viewed as a matrix (``powersgd.matrix_shape``: ``rows = shape[0]``), with
``M = grad + residual`` on each rank and the warm start ``Q`` (``cols x r``, the same on every
rank: drawn from the compressor's ``seed``, then the previous step's allreduced ``Q``):

1. ``P = M Q``, summed over the ranks (an allreduce of ``rows x r`` values);
2. ``P`` orthonormalized (QR of identical input: identical everywhere);
3. ``Q = M^T P``, averaged over the ranks (``cols x r`` values);
4. the result is ``P Q^T`` (times ``size`` for a sum); the residual keeps ``M - P Q^T``.

A rank sends the ring's ``2 (size-1)/size`` of ``r (rows + cols)`` float32 values instead of
``rows cols``: the compressor's ratio. Arrays the compressor would send raw (fewer than two
dimensions, or too small for the rank to save anything) are plainly allreduced. The state (the
residual and ``Q``) lives in a ``PowerSGD`` compressor object, one per key. Every rank computes the
final product from identical ``P`` and ``Q``, so the results are bit-identical given one numpy
build (the QR and the products run locally).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainer_core.compression.base import work_dtype
from trainer_core.compression.powersgd import PowerSGD, matrix_shape

from ..primitives.links import Ctx
from ..primitives.reduce import ReduceSpec, spec_for

Allreduce = Callable[[Ctx, np.ndarray, ReduceSpec], None]
_SUM32 = spec_for(np.float32, "sum")


def plan(comp: PowerSGD, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(rows, cols)`` when ``comp`` compresses an array of ``shape``, else None (sent raw)."""
    rc = matrix_shape(shape, int(np.prod(shape, dtype=np.int64)))
    if rc is None or comp.rank * (rc[0] + rc[1]) >= rc[0] * rc[1]:
        return None
    return rc


def allreduce(ctx: Ctx, grad: np.ndarray, spec: ReduceSpec, comp: PowerSGD, reduce: Allreduce) -> np.ndarray:
    """The low-rank reduction of every rank's ``grad`` (op sum or mean): a fresh array of its shape."""
    size = ctx.size
    rc = plan(comp, grad.shape)
    if rc is None:
        flat = np.array(grad, copy=True, order="C").reshape(-1)
        reduce(ctx.phase(2), flat, spec)
        spec.finish(flat, size)
        return flat.reshape(grad.shape)
    rows, cols = rc
    wdt = work_dtype(grad.dtype)
    flat = grad.reshape(-1)
    if comp.residual is None or comp.residual.size != flat.size or comp.residual.dtype != wdt:
        comp.residual = np.zeros(flat.size, dtype=wdt)
    comp.residual += flat.astype(wdt)
    m = comp.residual.reshape(rows, cols)
    if comp.q is None or comp.q.shape != (cols, comp.rank):
        comp.q = np.random.default_rng(comp.seed).standard_normal((cols, comp.rank)).astype(np.float32)
    p = np.ascontiguousarray((m @ comp.q.astype(wdt)).astype(np.float32))
    reduce(ctx.phase(0), p.reshape(-1), _SUM32)
    p, _ = np.linalg.qr(p)
    p = np.ascontiguousarray(p, dtype=np.float32)
    q = np.ascontiguousarray((m.T @ p.astype(wdt)).astype(np.float32))
    reduce(ctx.phase(1), q.reshape(-1), _SUM32)
    q /= np.float32(size)
    comp.q = q
    mean = p @ q.T
    m -= mean.astype(wdt)  # the residual: what this rank's share did not carry
    result = mean * np.float32(size) if spec.op == "sum" else mean
    return result.astype(grad.dtype).reshape(grad.shape)
