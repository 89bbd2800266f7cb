"""Reduction operators over flat arrays, written against the array module (numpy or cupy).

``spec_for(dtype, op, kind)`` checks an operation once and returns a ``ReduceSpec``; its
``combine(first, second, out)`` writes ``first (op) second`` into ``out``, always in that order,
so an algorithm that fixes which operand comes first fixes every element's order of reduction
(and so its bits). ``finish`` turns a sum into a mean.

Dtypes: int8..int64 and uint8..uint64 (sums wrap around as numpy's do, so they are exact modulo
2**bits and identical everywhere; ``mean`` is refused for them), float16, float32, float64, and
bfloat16 carried as raw ``uint16`` bits (``kind="bfloat16"``): each combine widens both operands
to float32, adds there and rounds back to bfloat16 to nearest, ties to even. float16 adds are
numpy's (computed wider, rounded to float16). Partial results travel in the array's own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer_core.xp import array_module

OPS = ("sum", "mean", "max", "min")
BFLOAT16 = "bfloat16"
INT_DTYPES = tuple(
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
FLOAT_DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))
KINDS = (*(d.name for d in INT_DTYPES + FLOAT_DTYPES), BFLOAT16)


def bf16_to_f32(xp: Any, bits: Any) -> Any:
    """bfloat16 bits (uint16) as float32 values (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(xp: Any, values: Any) -> Any:
    """float32 values rounded to bfloat16 bits (uint16): to nearest, ties to even; a NaN stays a
    (quiet) NaN with its sign."""
    u = xp.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (u >> np.uint32(16)) | np.uint32(0x0040)
    return xp.where(nan, quiet, rounded).astype(np.uint16)


_UFUNC = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


@dataclass(frozen=True)
class ReduceSpec:
    """One checked reduction: the operator and what the array's elements are."""

    op: str
    kind: str  # a numpy dtype name, or "bfloat16"

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the buffers (bfloat16 travels as uint16)."""
        return np.dtype(np.uint16) if self.kind == BFLOAT16 else np.dtype(self.kind)

    def combine(self, first: Any, second: Any, out: Any) -> None:
        """``out[...] = first (op) second``; ``out`` may be either operand."""
        xp = array_module(out)
        fn = getattr(xp, _UFUNC[self.op].__name__)
        if self.kind == BFLOAT16:
            out[...] = f32_to_bf16(xp, fn(bf16_to_f32(xp, first), bf16_to_f32(xp, second)))
        else:
            fn(first, second, out=out)

    def finish(self, buf: Any, size: int) -> None:
        """After the reduction: a sum over ``size`` ranks becomes their mean (in place)."""
        if self.op != "mean" or size == 1:
            return
        xp = array_module(buf)
        if self.kind == BFLOAT16:
            buf[...] = f32_to_bf16(xp, bf16_to_f32(xp, buf) / np.float32(size))
        elif self.dtype == np.float16:
            buf[...] = (buf.astype(np.float32) / np.float32(size)).astype(np.float16)
        else:
            xp.divide(buf, self.dtype.type(size), out=buf)


def spec_for(dtype: Any, op: str, kind: str | None = None) -> ReduceSpec:
    """The ``ReduceSpec`` for arrays of ``dtype``; ``kind="bfloat16"`` reads uint16 arrays as
    bfloat16 bits. ``ValueError``/``TypeError`` with what was expected otherwise."""
    if op not in OPS:
        raise ValueError(f"collective op must be one of {OPS}, not {op!r}")
    dt = np.dtype(dtype)
    if kind == BFLOAT16:
        if dt != np.uint16:
            raise TypeError(f"bfloat16 arrays travel as their raw uint16 bits; got a {dt} array")
        return ReduceSpec(op, BFLOAT16)
    if kind is not None and np.dtype(kind) != dt:
        raise TypeError(f"kind {kind!r} does not match the array's dtype {dt}")
    if dt not in INT_DTYPES + FLOAT_DTYPES:
        raise TypeError(f"collectives reduce {', '.join(KINDS)} arrays, not {dt}")
    if op == "mean" and dt in INT_DTYPES:
        raise ValueError(f"op 'mean' of {dt} arrays would not be exact; reduce with 'sum' and divide")
    return ReduceSpec(op, dt.name)
