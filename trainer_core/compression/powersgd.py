"""``powersgd``: low-rank compression with error feedback (PowerSGD; Vogels et al. 2019).

The gradient plus residual is viewed as a matrix ``M`` of ``rows = shape[0]`` by
``cols = size // rows``. One step of subspace iteration, warm-started from the previous step's
``Q`` (``cols x r``, first drawn from a normal distribution seeded by ``seed``):
``P = orthonormalize(M Q)``, ``Q = M^T P``; the receiver rebuilds ``P Q^T`` and the residual keeps
``M - P Q^T``. That sends ``r (rows + cols)`` values instead of ``rows * cols``: 192x for a
1024 x 3072 matrix at rank 4. Arrays with fewer than two dimensions, or too small for the rank
to save anything (``r (rows + cols) >= rows * cols``), are sent raw in their own dtype.

In the paper ``P`` and ``Q`` are all-reduced (so the sum stays rank r); through a parameter server
each worker's ``P Q^T`` is decoded and summed, which is correct but only rank ``W r``.

A non-finite value (NaN, +-inf) in ``M`` sends ``P`` and ``Q`` as NaN (everything decodes as NaN;
a raw array sends it as itself), leaves its element's residual at 0, the other elements' at their
value, and the warm start as it was.

Payload: ``P`` (``rows x r``, C order) then ``Q`` (``cols x r``), little-endian float32;
``meta = {'type': 'powersgd', 'rank': r, 'rows': rows, 'cols': cols}``. Raw: the values in the
gradient's dtype, ``meta = {'type': 'powersgd', 'rank': r, 'raw': 1}``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Compressor, param_error


def matrix_shape(shape: tuple[int, ...] | None, size: int) -> tuple[int, int] | None:
    """``(rows, cols)`` of the matrix view, or None when the array is sent raw."""
    if shape is None or len(shape) < 2 or size == 0:
        return None
    return shape[0], size // shape[0]


class PowerSGD(Compressor):
    """Rank-``rank`` approximation by one warm-started power iteration per step."""

    name: ClassVar[str] = "powersgd"
    param_names: ClassVar[tuple[str, ...]] = ("rank", "seed")

    def __init__(self, rank: int = 4, seed: int = 0, kernel: str = "auto") -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise param_error(self.name, "rank", rank, "a positive integer")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise param_error(self.name, "seed", seed, "an integer")
        super().__init__(kernel)
        self.rank, self.seed = rank, seed
        self.q: Any = None  # the warm start, cols x rank
        self._shape: tuple[int, ...] | None = None

    def reset(self) -> None:
        super().reset()
        self.q = None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.q is not None:
            state["q"] = self.q.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "q" in state:
            self.q = state["q"].copy()

    def _plan(self, shape: tuple[int, ...] | None, size: int) -> tuple[int, int] | None:
        rc = matrix_shape(shape, size)
        if rc is None or self.rank * (rc[0] + rc[1]) >= rc[0] * rc[1]:
            return None
        return rc

    def wire_bytes(self, size: int, dtype: Any = np.float32, shape: Any = None) -> int:
        """Payload bytes; the size depends on the shape (without one, the array is sent raw)."""
        rc = self._plan(None if shape is None else tuple(shape), size)
        if rc is None:
            return size * np.dtype(dtype).itemsize
        return 4 * self.rank * (rc[0] + rc[1])

    def encode(self, grad: Any, plus: Any = None, into: Any = None) -> tuple[Any, dict[str, Any]]:
        self._shape = tuple(grad.shape)
        return super().encode(grad, plus, into)

    def _encode(self, xp: Any, g: Any, r: Any, dtype: np.dtype) -> tuple[Any, dict[str, Any]]:
        xp.add(r, g, out=r)
        bad = None if bool(xp.isfinite(r).all()) else ~xp.isfinite(r)
        rc = self._plan(self._shape, g.size)
        if rc is None:
            sent = r.astype(dtype)
            with np.errstate(invalid="ignore"):  # inf - inf
                r -= sent.astype(r.dtype)
            if bad is not None:
                r[bad] = 0
            return sent.astype(dtype.newbyteorder("<")).view(np.uint8), {"rank": self.rank, "raw": 1}
        rows, cols = rc
        meta = {"rank": self.rank, "rows": rows, "cols": cols}
        if bad is not None:  # NaN throughout; the residual 0 where v was not finite
            r[bad] = 0
            return xp.full(self.rank * (rows + cols), np.nan, dtype=np.float32).view(np.uint8), meta
        m = r.reshape(rows, cols)
        if self.q is None or self.q.shape != (cols, self.rank):
            init = np.random.default_rng(self.seed).standard_normal((cols, self.rank))
            self.q = xp.asarray(init.astype(r.dtype))
        p, _ = xp.linalg.qr(m @ self.q)  # orthonormal columns, rows x rank
        q = m.T @ p
        self.q = q
        p32, q32 = p.astype(np.float32), q.astype(np.float32)
        r -= _rebuild(xp, p32, q32, dtype).reshape(-1).astype(r.dtype)
        payload = xp.concatenate([p32.reshape(-1).view(np.uint8), q32.reshape(-1).view(np.uint8)])
        return payload, meta

    def _decode(self, xp: Any, buf: Any, meta: dict[str, Any], n: int, dtype: np.dtype, out: Any) -> Any:
        if meta.get("raw"):
            if buf.size != n * dtype.itemsize:
                raise ValueError(f"powersgd raw payload of {buf.size} bytes does not hold {n} x {dtype}")
            return buf.view(dtype.newbyteorder("<")).astype(dtype)
        rank, rows, cols = int(meta["rank"]), int(meta["rows"]), int(meta["cols"])
        if rows * cols != n or buf.size != 4 * rank * (rows + cols):
            raise ValueError(
                f"powersgd payload of {buf.size} bytes does not hold {rows} x {cols} at rank {rank}"
            )
        f = buf.view("<f4")
        p = f[: rows * rank].reshape(rows, rank)
        q = f[rows * rank :].reshape(cols, rank)
        return _rebuild(xp, p, q, dtype).reshape(-1)


def _rebuild(xp: Any, p: Any, q: Any, dtype: np.dtype) -> Any:
    """``P Q^T`` in float32, then in the gradient's dtype: the same on both ends."""
    return (p @ q.T).astype(dtype)


def ratio(rows: int, cols: int, rank: int) -> float:
    """Size of ``rows x cols`` float32 over the payload at ``rank``."""
    return rows * cols / max(1, rank * (rows + cols)) if rank * (rows + cols) < rows * cols else 1.0
