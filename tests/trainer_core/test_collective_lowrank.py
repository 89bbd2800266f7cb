"""PowerSGD's allreduce of the factors (trainer_core.collective.compressed.lowrank): against a reference
computed in one process, bit-identical on every rank, the bytes cut by the compressor's ratio."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core.collective import ErrorFeedback, Group, Thresholds
from trainer_core.collective.exchange import control_bytes
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.compression.powersgd import ratio

PARAMS: dict[str, Any] = {"type": "powersgd", "rank": 2, "seed": 7}


def reference(steps: list[list[np.ndarray]], rank: int, seed: int, op: str) -> list[np.ndarray]:
    """Algorithm 1 of the paper on all ranks' matrices at once, in float32."""
    w = len(steps[0])
    rows, cols = steps[0][0].shape
    res = [np.zeros((rows, cols), np.float32) for _ in range(w)]
    q = np.random.default_rng(seed).standard_normal((cols, rank)).astype(np.float32)
    out = []
    for xs in steps:
        ms = [x + e for x, e in zip(xs, res, strict=True)]
        p, _ = np.linalg.qr(sum(m @ q for m in ms))
        q = sum(m.T @ p for m in ms) / np.float32(w)
        mean = p @ q.T
        res = [m - mean for m in ms]
        out.append(mean * w if op == "sum" else mean)
    return out


def run(steps: list[list[np.ndarray]], op: str) -> tuple[list[list[np.ndarray]], int]:
    w = len(steps[0])
    fabric = Fabric(w, timeout=10, eager=False)
    th = Thresholds(ring_min_bytes=0)  # the factors go round the ring whatever their size

    def body(r: int) -> list[np.ndarray]:
        state = ErrorFeedback(PARAMS)
        with Group(fabric.endpoint(r), thresholds=th) as g:
            return [g.compressed_allreduce(xs[r], state, key="w", op=op) for xs in steps]

    out = run_ranks(w, body)
    return out, sum(fabric.endpoint(r).sent_bytes - len(steps) * control_bytes(r, w) for r in range(w))


@pytest.mark.parametrize("op", ["mean", "sum"])
@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_matches_the_paper(w: int, op: str) -> None:
    rng = np.random.default_rng(w)
    steps = [[rng.standard_normal((40, 30)).astype(np.float32) for _ in range(w)] for _ in range(3)]
    out, _ = run(steps, op)
    want = reference(steps, 2, 7, op)
    for s in range(3):
        for r in range(w):
            assert out[r][s].tobytes() == out[0][s].tobytes()
        assert out[0][s].shape == (40, 30) and out[0][s].dtype == np.float32
        np.testing.assert_allclose(out[0][s], want[s], rtol=1e-3, atol=1e-3)


def test_bytes_fall_by_the_compressors_ratio() -> None:
    w, rows, cols = 4, 256, 512
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(w)]
    _, sent = run([xs], "mean")
    raw = 2 * (w - 1) * rows * cols * 4  # the ring, uncompressed
    assert raw / sent == pytest.approx(ratio(rows, cols, 2), rel=0.01)


def test_vectors_and_small_matrices_are_reduced_raw() -> None:
    xs = [np.full(10, float(r + 1), np.float32) for r in range(2)]
    small = [np.full((2, 2), float(r + 1), np.float64) for r in range(2)]
    out, _ = run([xs], "sum")
    assert out[0][0].tolist() == [3.0] * 10
    out, _ = run([small], "mean")
    assert out[1][0].tolist() == [[1.5, 1.5], [1.5, 1.5]]
