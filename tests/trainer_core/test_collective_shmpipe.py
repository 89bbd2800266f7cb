"""The hierarchical allreduce through shared memory pipelined by pieces (algorithms/shmpipe.py),
in one process: hosts as threads sharing a segment. The host's reduce of later pieces runs while
the leaders' allreduce of the first is still in flight; results exact (integers), within float
tolerance, and bit-identical on every rank, on 3 x 2 and 2-2-1 hosts, in place or not."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.trainer_core.test_collective_allreduce import HOSTS, check, make
from tests.trainer_core.test_collective_shm import locals_for
from trainer_core.collective import Group, Thresholds
from trainer_core.collective.algorithms import shmpipe
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.primitives.reduce import spec_for

PIPED = Thresholds(shm_split_min_bytes=0, shm_split_min_bytes_2=0, pipeline_piece_bytes=8192)


def test_later_pieces_are_reduced_while_the_first_is_across() -> None:
    """The leaders' allreduce of piece 0 waits until the other local rank has reduced its block of
    the last piece: only a pipeline gets there (the phases one after the other would hang)."""
    hosts, n, pieces = ["a", "a"], 10_001, 5
    locs = locals_for(hosts)
    xs = [make("int64", n, r) for r in range(2)]
    last = 2 + 2 * (pieces - 1)  # the first operation's step: "reduced its block of the last piece"
    seen: list[int] = []
    lock = threading.Lock()

    def cross(j: int, buf: np.ndarray) -> None:  # the leader's helper: the "other hosts" triple it
        if j == 0:
            assert locs[0] is not None
            locs[0].wait_for(1, last, "reduce the last piece")
        with lock:
            seen.append(j)
        buf *= 3

    def body(r: int) -> np.ndarray:
        loc = locs[r]
        assert loc is not None
        out = np.empty_like(xs[r])
        shmpipe.allreduce(loc, xs[r], out, spec_for(np.int64, "sum"), pieces, cross)
        return out

    try:
        res = run_ranks(2, body)
    finally:
        for loc in locs:
            assert loc is not None
            loc.close()
    assert seen == list(range(pieces))
    for out in res:
        assert np.array_equal(out, (xs[0] + xs[1]) * 3)


@pytest.mark.parametrize("w", [5, 6])
@pytest.mark.parametrize("kind", ["float32", "int64"])
def test_pipelined_hierarchical_group(w: int, kind: str) -> None:
    inputs = [make(kind, 70_001, r) for r in range(w)]
    hosts = HOSTS[:w]
    locs = locals_for(hosts)
    fabric = Fabric(w, timeout=10, eager=False)

    def body(r: int) -> list[np.ndarray]:
        with Group(fabric.endpoint(r), hosts=hosts, thresholds=PIPED, local=locs[r]) as g:
            into = np.empty_like(inputs[r])
            g.allreduce(inputs[r], out=into)  # on the calling thread, out apart from the input
            inplace = inputs[r].copy()
            g.allreduce(inplace, out=inplace)
            work = g.allreduce_async(inputs[r])  # on the group's thread
            small = g.allreduce(inputs[r][:100])  # one piece: not pipelined
            return [into, inplace, work.wait(), small]

    try:
        res = run_ranks(w, body)
    finally:
        for loc in locs:
            if loc is not None:
                loc.close()
    for i in range(3):
        check([res[r][i] for r in range(w)], inputs, "sum")
        assert all(res[r][i].tobytes() == res[0][0].tobytes() for r in range(w))
    check([res[r][3] for r in range(w)], [x[:100] for x in inputs], "sum")


def test_piece_count_is_refused_out_of_range() -> None:
    locs = locals_for(["a", "a"])
    try:
        loc = locs[0]
        assert loc is not None
        x = np.ones(10, np.float32)
        with pytest.raises(ValueError, match=r"1\.\.14 pieces, not 15"):
            shmpipe.allreduce(loc, x, x, spec_for(np.float32, "sum"), 15, lambda j, b: None)
    finally:
        for loc in locs:
            assert loc is not None
            loc.close()
