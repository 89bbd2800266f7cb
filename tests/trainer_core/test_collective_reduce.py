"""Reduction operators (trainer_core.collective.primitives.reduce): dtypes, ops, bfloat16 rounding."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from trainer_core.collective.primitives.reduce import (
    BFLOAT16,
    FLOAT_DTYPES,
    INT_DTYPES,
    bf16_to_f32,
    f32_to_bf16,
    spec_for,
)


def bf16_reference(x: float) -> int:
    """The bfloat16 bits nearest to the finite float32 ``x`` (ties to even), by exact arithmetic."""
    bits = int(np.float32(x).view(np.uint32))
    lo = bits >> 16
    cands = [lo, lo + 1]
    value = Fraction(float(np.float32(x)))

    def val(b: int) -> Fraction:
        return Fraction(float(np.array([b << 16], np.uint32).view(np.float32)[0]))

    best = min(cands, key=lambda b: (abs(val(b) - value), b & 1))
    return best


def test_bf16_round_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    x = raw.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 3e38)]
    # exact ties, both ways, and carries into the exponent
    ties = np.array([0x3F808000, 0x3F818000, 0x3F7FFFFF, 0x3F7F8000, 0x00008000], np.uint32).view(np.float32)
    x = np.concatenate([x, ties, -ties])
    got = f32_to_bf16(np, x)
    want = np.array([bf16_reference(float(v)) for v in x], dtype=np.uint64).astype(np.uint16)
    assert np.array_equal(got, want)
    assert np.array_equal(bf16_to_f32(np, got).view(np.uint32) & 0xFFFF, np.zeros(got.size, np.uint32))


def test_bf16_special_values() -> None:
    x = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4028235e38], np.float32)
    got = f32_to_bf16(np, x)
    assert got[0] == 0x7F80 and got[1] == 0xFF80 and got[4] == 0 and got[5] == 0x8000
    assert np.isnan(bf16_to_f32(np, got[2:4])).all()
    assert got[6] == 0x7F80  # rounds up past the largest bfloat16: infinity


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_sums_wrap_exactly(dtype: np.dtype) -> None:
    info = np.iinfo(dtype)
    xs = [info.max, info.min, 5, info.max]
    ys = [1, info.max, 7, info.max]
    a, b = np.array(xs, dtype), np.array(ys, dtype)
    spec_for(dtype, "sum").combine(a, b, a)
    span = 1 << info.bits
    want = [(x + y - info.min) % span + info.min for x, y in zip(xs, ys, strict=True)]
    assert a.tolist() == want and a.dtype == dtype


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", (*INT_DTYPES, *FLOAT_DTYPES), ids=str)
def test_max_min(dtype: np.dtype, op: str) -> None:
    a, b = np.array([1, 9, 3], dtype), np.array([4, 2, 3], dtype)
    out = np.empty(3, dtype)
    spec_for(dtype, op).combine(a, b, out)
    assert out.tolist() == ([4, 9, 3] if op == "max" else [1, 2, 3])


def test_bf16_combine_and_mean() -> None:
    a = f32_to_bf16(np, np.array([1.0, 2.5, -3.0], np.float32))
    b = f32_to_bf16(np, np.array([0.5, 0.25, 8.0], np.float32))
    spec = spec_for(np.uint16, "mean", BFLOAT16)
    out = np.empty(3, np.uint16)
    spec.combine(a, b, out)
    assert bf16_to_f32(np, out).tolist() == [1.5, 2.75, 5.0]
    spec.finish(out, 2)
    assert bf16_to_f32(np, out).tolist() == [0.75, 1.375, 2.5]
    assert spec.dtype == np.uint16


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_float_mean(dtype: np.dtype) -> None:
    buf = np.array([3.0, -6.0], dtype)
    spec_for(dtype, "mean").finish(buf, 3)
    assert buf.tolist() == [1.0, -2.0] and buf.dtype == dtype


def test_bad_requests_are_explained() -> None:
    with pytest.raises(ValueError, match=r"op must be one of .*'sum'.*not 'prod'"):
        spec_for(np.float32, "prod")
    with pytest.raises(ValueError, match="'mean' of int32 arrays would not be exact"):
        spec_for(np.int32, "mean")
    with pytest.raises(TypeError, match="raw uint16 bits; got a float32"):
        spec_for(np.float32, "sum", BFLOAT16)
    with pytest.raises(TypeError, match="not bool"):
        spec_for(np.bool_, "sum")
    with pytest.raises(TypeError, match="not complex64"):
        spec_for(np.complex64, "sum")
