"""``Group.allreduce_async(array, out=array)``: a lent array is reduced in place, without the
private copy (and the copy back) that an array not lent gets (trainer_core.torch lends each
gradient bucket so; bench/torch_step.py: the 16.8 MB bucket of its MLP took 11.6 ms through the
copy against 7.5 in place, 4 ranks on 2 cores)."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer_core.collective import Group, Thresholds
from trainer_core.collective.fabric import Fabric, run_ranks


def reduced_arrays(w: int, lend: bool) -> list[tuple[bool, np.ndarray, np.ndarray]]:
    """On each rank: whether the algorithm ran on the input's memory, the input, the result."""
    fabric = Fabric(w, timeout=10, eager=False)

    def body(r: int) -> tuple[bool, np.ndarray, np.ndarray]:
        g = Group(fabric.endpoint(r), thresholds=Thresholds(segment_bytes=4096))
        x = np.arange(10_000, dtype=np.float32) + r
        seen: list[np.ndarray] = []
        inner = g._allreduce_into

        def recording(ctx: Any, a: np.ndarray, out: np.ndarray, spec: Any) -> None:
            seen.append(a)
            inner(ctx, a, out, spec)

        g._allreduce_into = recording  # type: ignore[method-assign]
        try:
            got = g.allreduce_async(x, "sum", out=x if lend else None).wait()
        finally:
            g.close()
        return np.shares_memory(seen[0], x), x, got

    return run_ranks(w, body)


def test_a_lent_array_is_reduced_in_place() -> None:
    want = sum(np.arange(10_000, dtype=np.float32) + r for r in range(3))
    for in_place, x, got in reduced_arrays(3, lend=True):
        assert in_place  # no private copy
        assert got is x
        np.testing.assert_array_equal(x, want)


def test_an_array_not_lent_is_copied_and_left_as_it_was() -> None:
    want = sum(np.arange(10_000, dtype=np.float32) + r for r in range(3))
    for r, (in_place, x, got) in enumerate(reduced_arrays(3, lend=False)):
        assert not in_place
        np.testing.assert_array_equal(x, np.arange(10_000, dtype=np.float32) + r)
        np.testing.assert_array_equal(got, want)
