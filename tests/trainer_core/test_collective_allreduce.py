"""Allreduce by every algorithm (ring, recursive doubling, hierarchical) on in-process synchronous
links: W = 1..5, sizes 0 to 1e6, every dtype and op; bit-identical on every rank and equal to a
reference (exactly for integers, max and min)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from trainer_core.collective import BFLOAT16, Group, Thresholds, bf16_to_f32, f32_to_bf16
from trainer_core.collective.exchange import control_bytes
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.primitives.reduce import FLOAT_DTYPES, INT_DTYPES

HOSTS = ["h0", "h0", "h1", "h1", "h2", "h2"]  # 3 hosts x 2 ranks
ALGOS = ["ring", "recursive_doubling", "hierarchical"]


def make(dtype: Any, n: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + n)
    if dtype == BFLOAT16:
        return f32_to_bf16(np, rng.standard_normal(n).astype(np.float32))
    dt = np.dtype(dtype)
    if dt in INT_DTYPES:
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return rng.standard_normal(n).astype(dt)


def run_allreduce(
    w: int, inputs: list[np.ndarray], op: str, algo: str, kind: str | None = None, seg: int = 4096
) -> list[np.ndarray]:
    fabric = Fabric(w, timeout=10, eager=False)  # synchronous links: nothing relies on buffering
    th = Thresholds(force=algo, segment_bytes=seg)
    hosts = HOSTS[:w] if algo == "hierarchical" else None

    def body(r: int) -> np.ndarray:
        with Group(fabric.endpoint(r), hosts=hosts, thresholds=th) as g:
            out = g.allreduce(inputs[r], op=op, kind=kind)
            assert g.last_algorithm == algo
            return out

    return run_ranks(w, body)


def check(results: list[np.ndarray], inputs: list[np.ndarray], op: str, kind: str | None = None) -> None:
    first = results[0]
    for r in results:  # bit-identical on every rank
        assert r.dtype == inputs[0].dtype and r.shape == inputs[0].shape
        assert r.tobytes() == first.tobytes()
    w = len(inputs)
    if kind == BFLOAT16:
        xs = [bf16_to_f32(np, x).astype(np.float64) for x in inputs]
        got, eps = bf16_to_f32(np, first).astype(np.float64), 2.0**-7
    elif inputs[0].dtype in INT_DTYPES:
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        assert np.array_equal(first, functools.reduce(fn, inputs))  # exact (sums wrap alike)
        return
    else:
        xs = [x.astype(np.float64) for x in inputs]
        got, eps = first.astype(np.float64), float(np.finfo(inputs[0].dtype).eps)
    if op in ("max", "min"):
        assert np.array_equal(got, functools.reduce(np.maximum if op == "max" else np.minimum, xs))
        return
    want = functools.reduce(np.add, xs) / (w if op == "mean" else 1)
    bound = 2 * w * eps * functools.reduce(np.add, [np.abs(x) for x in xs]) + 1e-12
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1001, 65537])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
def test_float32_sizes_and_group_sizes(w: int, n: int, algo: str) -> None:
    inputs = [make(np.float32, n, r) for r in range(w)]
    check(run_allreduce(w, inputs, "sum", algo), inputs, "sum")


KINDS = [*(d.name for d in INT_DTYPES), *(d.name for d in FLOAT_DTYPES), BFLOAT16]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_dtype_and_op(kind: str, op: str, algo: str) -> None:
    if op == "mean" and kind in [d.name for d in INT_DTYPES]:
        pytest.skip("mean of integers is refused (test_reduce)")
    w, n = (5, 1003) if algo != "hierarchical" else (6, 1003)
    inputs = [make(kind, n, r) for r in range(w)]
    bf = BFLOAT16 if kind == BFLOAT16 else None
    check(run_allreduce(w, inputs, op, algo, kind=bf), inputs, op, kind=bf)


@pytest.mark.parametrize(("w", "n"), [(4, 1_000_000), (5, 999_999)])
def test_large_ring(w: int, n: int) -> None:
    inputs = [make(np.float32, n, r) for r in range(w)]
    check(run_allreduce(w, inputs, "sum", "ring", seg=1 << 18), inputs, "sum")


def test_hierarchical_three_hosts_by_two_is_chosen_and_exact() -> None:
    w = 6
    inputs = [make(np.int64, 100_003, r) for r in range(w)]
    fabric = Fabric(w, timeout=10, eager=False)

    def body(r: int) -> tuple[np.ndarray, str]:
        with Group(fabric.endpoint(r), hosts=HOSTS) as g:
            return g.allreduce(inputs[r]), g.last_algorithm

    res = run_ranks(w, body)
    assert {algo for _, algo in res} == {"hierarchical"}
    check([out for out, _ in res], inputs, "sum")


def test_hierarchical_sends_one_buffer_per_host_across_hosts() -> None:
    """Only the leaders (ranks 0, 2, 4) talk across hosts, and a non-leader sends its buffer once."""
    w, n = 6, 40_000
    inputs = [make(np.float32, n, r) for r in range(w)]
    fabric = Fabric(w, timeout=10)
    th = Thresholds(force="hierarchical", ring_min_bytes=0)
    run_ranks(w, lambda r: Group(fabric.endpoint(r), hosts=HOSTS, thresholds=th).allreduce(inputs[r]))
    sent = [fabric.endpoint(r).sent_bytes - control_bytes(r, w) for r in range(w)]
    assert all(sent[r] == 4 * n for r in (1, 3, 5))
    ring_share = 2 * 2 / 3 * 4 * n
    for leader in (0, 2, 4):  # the leaders' ring, then the broadcast to the other rank of its host
        assert sent[leader] == pytest.approx(ring_share + 4 * n, rel=0.01)
