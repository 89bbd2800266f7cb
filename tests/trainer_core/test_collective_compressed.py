"""Compressed allreduce with error feedback (trainer_core.collective.compressed.twostage): against a
reference built from the compressors alone in one process, bit-identical on every rank, and the
bytes that cross the links divided by the compressor's ratio."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core import compression
from trainer_core.collective import ErrorFeedback, Group, Thresholds
from trainer_core.collective.algorithms.ring import blocks
from trainer_core.collective.exchange import control_bytes
from trainer_core.collective.fabric import Fabric, run_ranks

PARAMS: list[dict[str, Any]] = [
    {"type": "1bit", "block_size": 64},
    {"type": "2bit", "threshold": 0.5},
    {"type": "topk", "ratio": 0.05},
    {"type": "none"},
]


def reference(params: dict[str, Any], steps: list[list[np.ndarray]], op: str) -> list[np.ndarray]:
    """The two-stage scheme from the compressors alone: each rank's compressor per chunk encodes
    and decodes, the decoded chunks are summed in rank order, and one more compressor per chunk
    (its owner's) encodes and decodes the reduced chunk."""
    w, n = len(steps[0]), steps[0][0].size
    bounds = blocks(n, w)
    workers = [[compression.get_compressor(params) for _ in range(w)] for _ in range(w)]
    servers = [compression.get_compressor(params) for _ in range(w)]
    results = []
    for xs in steps:
        out = np.empty(n, xs[0].dtype)
        for c, (a, b) in enumerate(bounds):
            total = None
            for r in range(w):
                payload, meta = workers[r][c].encode(xs[r][a:b])
                dec = compression.decode(payload, meta, (b - a,), xs[r].dtype)
                total = dec.copy() if total is None else total + dec
            assert total is not None
            if op == "mean":
                total = total / xs[0].dtype.type(w)
            payload, meta = servers[c].encode(total.astype(xs[0].dtype))
            out[a:b] = compression.decode(payload, meta, (b - a,), xs[0].dtype)
        results.append(out)
    return results


def run(params: dict[str, Any], steps: list[list[np.ndarray]], op: str) -> tuple[list[list[np.ndarray]], int]:
    w = len(steps[0])
    fabric = Fabric(w, timeout=10, eager=False)

    def body(r: int) -> list[np.ndarray]:
        state = ErrorFeedback(params)
        with Group(fabric.endpoint(r)) as g:
            return [g.compressed_allreduce(xs[r], state, key="w", op=op) for xs in steps]

    out = run_ranks(w, body)
    return out, sum(fabric.endpoint(r).sent_bytes - len(steps) * control_bytes(r, w) for r in range(w))


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: p["type"])
@pytest.mark.parametrize(("w", "n"), [(1, 100), (2, 1), (3, 1001), (5, 4099)])
def test_matches_the_compressors_reference(params: dict[str, Any], w: int, n: int) -> None:
    rng = np.random.default_rng(n)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(w)] for _ in range(3)]
    out, _ = run(params, steps, "mean")
    want = reference(params, steps, "mean")
    for s in range(3):  # three steps: the residuals carry over
        for r in range(w):
            assert out[r][s].tobytes() == out[0][s].tobytes()  # bit-identical on every rank
        np.testing.assert_allclose(out[0][s], want[s], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_dtypes(dtype: type) -> None:
    rng = np.random.default_rng(0)
    steps: list[list[np.ndarray]] = [
        [rng.standard_normal(777).astype(dtype) for _ in range(3)] for _ in range(2)
    ]
    out, _ = run(PARAMS[0], steps, "sum")
    want = reference(PARAMS[0], steps, "sum")
    for s in range(2):
        assert out[0][s].dtype == dtype and out[1][s].tobytes() == out[0][s].tobytes()
        np.testing.assert_allclose(out[0][s], want[s], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("params", PARAMS[:3], ids=lambda p: p["type"])
def test_bytes_fall_by_the_compressors_ratio(params: dict[str, Any]) -> None:
    w, n = 4, 400_000
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(w)]
    _, compressed_bytes = run(params, [xs], "mean")
    fabric = Fabric(w, timeout=10)
    th = Thresholds(force="ring")
    run_ranks(w, lambda r: Group(fabric.endpoint(r), thresholds=th).allreduce(xs[r]))
    raw_bytes = sum(fabric.endpoint(r).sent_bytes - control_bytes(r, w) for r in range(w))
    assert raw_bytes == 2 * (w - 1) * n * 4  # the ring's bound: 2 (w-1)/w of the buffer per rank
    want = compression.ratio(params, n // w)
    assert raw_bytes / compressed_bytes == pytest.approx(want, rel=0.02)


def test_error_feedback_makes_the_running_sum_converge() -> None:
    """With a constant gradient, the mean of the compressed results approaches the true mean (the
    residuals carry what each step lost)."""
    w, n, steps = 2, 512, 40
    xs = [np.linspace(-1, 1, n).astype(np.float32) * (r + 1) for r in range(w)]
    out, _ = run({"type": "1bit", "block_size": 64}, [xs] * steps, "mean")
    running = np.mean(out[0], axis=0)
    true = (xs[0] + xs[1]) / 2
    first_err = np.abs(out[0][0] - true).mean()
    assert np.abs(running - true).mean() < first_err / 5


def test_refusals() -> None:
    with pytest.raises(ValueError, match="unknown compression type 'zip'"):
        ErrorFeedback({"type": "zip"})
    g = Group(Fabric(1).endpoint(0))
    state = ErrorFeedback({"type": "1bit"})
    with pytest.raises(TypeError, match="float16/32/64 arrays, not int32"):
        g.compressed_allreduce(np.ones(3, np.int32), state)
    with pytest.raises(ValueError, match="sums or averages, not 'max'"):
        g.compressed_allreduce(np.ones(3, np.float32), state, op="max")


def test_a_warm_operation_allocates_little_beyond_its_result() -> None:
    """Stage one decodes every rank's payload into the group's working buffers (kept between
    operations), not into fresh arrays: those cost page faults as large as the decoding itself
    (measured across three hosts: docs/performance.md). W = 1, so that one thread allocates."""
    import tracemalloc

    n = 1_000_000
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    g = Group(Fabric(1).endpoint(0))
    state = ErrorFeedback({"type": "1bit"})
    g.compressed_allreduce(x, state, key="w", op="sum")  # residuals and working buffers made
    tracemalloc.start()
    try:
        out = g.compressed_allreduce(x, state, key="w", op="sum")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == x.shape
    assert peak < 1.3 * x.nbytes, f"{peak / x.nbytes:.2f}x the result's bytes"  # was 3.07x


def test_out_receives_the_result_bit_identical_to_a_fresh_one() -> None:
    """``out`` (a separate array, the input itself, or through the asynchronous call) gets the
    same bits as the fresh result of an identical run; a wrong ``out`` is refused."""
    w, n = 3, 1001
    rng = np.random.default_rng(3)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(w)] for _ in range(2)]
    fresh, _ = run({"type": "1bit", "block_size": 64}, steps, "mean")
    fabric = Fabric(w, timeout=10, eager=False)

    def body(r: int) -> list[list[np.ndarray]]:
        got: list[list[np.ndarray]] = [[], [], []]
        for mode in range(3):  # out apart, out = the input, asynchronous
            state = ErrorFeedback({"type": "1bit", "block_size": 64})
            with Group(fabric.endpoint(r)) as g:
                for xs in steps:
                    x = xs[r].copy()
                    y = x if mode == 1 else np.full(n, np.nan, np.float32)
                    if mode == 2:
                        res = g.compressed_allreduce_async(x, state, key="w", op="mean", out=y).wait()
                    else:
                        res = g.compressed_allreduce(x, state, key="w", op="mean", out=y)
                    assert res is y
                    got[mode].append(y)
        return got

    for r, modes in enumerate(run_ranks(w, body)):
        for got in modes:
            assert [y.tobytes() for y in got] == [y.tobytes() for y in fresh[r]]
    g = Group(Fabric(1).endpoint(0))
    with pytest.raises(ValueError, match=r"out must be a float32 array of shape \(4,\)"):
        g.compressed_allreduce(
            np.ones(4, np.float32), ErrorFeedback({"type": "1bit"}), out=np.ones(3, np.float32)
        )


def test_a_warm_operation_into_out_allocates_little() -> None:
    """With ``out``, no result is allocated: what stays is the payloads' few bytes."""
    import tracemalloc

    n = 1_000_000
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    g = Group(Fabric(1).endpoint(0))
    state = ErrorFeedback({"type": "1bit"})
    g.compressed_allreduce(x, state, key="w", op="sum", out=y)
    tracemalloc.start()
    try:
        g.compressed_allreduce(x, state, key="w", op="sum", out=y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.3 * x.nbytes, f"{peak / x.nbytes:.2f}x the result's bytes"
