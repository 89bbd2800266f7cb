"""The shared-memory allreduce (collective/primitives/hostsegment.py, algorithms/shmreduce.py) in one process: each
rank a thread with its own mapping of its host's segment (as a worker process has), over
synchronous in-process links for the hierarchical part. Bit-identical on every rank and equal to
the reference, every dtype and op, split or whole, one host or three; a rank that never comes, or
whose job failed, is named within the bound instead of hanging."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from tests.trainer_core.test_collective_allreduce import HOSTS, check, make
from trainer_core.collective import BFLOAT16, Group, Thresholds
from trainer_core.collective.algorithms.hierarchical import Topology
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.primitives.hostsegment import Local, Segment, _behind
from trainer_core.collective.primitives.links import LinkError, PeerTimeout
from trainer_core.collective.primitives.reduce import FLOAT_DTYPES, INT_DTYPES

T = TypeVar("T")

SINGLE = ["h0"] * 6
SPLIT = {
    True: Thresholds(shm_split_min_bytes=0, shm_split_min_bytes_2=0),
    False: Thresholds(shm_split_min_bytes=1 << 40, shm_split_min_bytes_2=1 << 40),
}


def locals_for(
    hosts: list[str], timeout: float = 10.0, health: Callable[[], None] | None = None
) -> list[Local | None]:
    """Every rank's ``Local`` on its host's segment (None where the host has one rank)."""
    topo = Topology.of(hosts)
    out: list[Local | None] = [None] * len(hosts)
    for leader in topo.leaders():
        members = topo.local(leader)
        if len(members) == 1:
            continue
        first = Segment.create(len(members))
        for i, r in enumerate(members):
            seg = first if i == 0 else Segment(os.dup(first.fd), len(members))
            out[r] = Local(seg, i, members, health=health, timeout=timeout)
    return out


def run_closing(locs: list[Local | None], body: Callable[[int], T]) -> list[T]:
    """``body`` of every rank (one a ``locs`` entry) in threads, then every ``Local`` closed."""
    try:
        return run_ranks(len(locs), body)
    finally:
        for loc in locs:
            if loc is not None:
                loc.close()


def run(
    hosts: list[str], inputs: list[np.ndarray], op: str, split: bool, kind: str | None = None, reps: int = 1
) -> list[np.ndarray]:
    w = len(hosts)
    fabric = Fabric(w, timeout=10, eager=False)
    locs = locals_for(hosts)
    want = "shm" if len(set(hosts)) == 1 else "hierarchical"

    def body(r: int) -> np.ndarray:
        with Group(fabric.endpoint(r), hosts=hosts, thresholds=SPLIT[split], local=locs[r]) as g:
            for _ in range(reps):
                out = g.allreduce(inputs[r], op=op, kind=kind)
                assert g.last_algorithm == want or w == 1
            return out

    return run_closing(locs, body)


KINDS = [*(d.name for d in INT_DTYPES + FLOAT_DTYPES), BFLOAT16]


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_every_dtype_and_op_bit_identical_one_host(kind: str, split: bool) -> None:
    for w in (2, 3, 5):
        inputs = [make(kind, 1001, r) for r in range(w)]
        ops = ["sum", "max", "min"] + (
            ["mean"] if kind in ("float16", "float32", "float64", BFLOAT16) else []
        )
        for op in ops:
            k = BFLOAT16 if kind == BFLOAT16 else None
            check(run(SINGLE[:w], inputs, op, split, k), inputs, op, k)


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 7, 65537, 999_999])
def test_sizes_and_widths_one_host(w: int, n: int) -> None:
    inputs = [make("float32", n, r) for r in range(w)]
    for split in (True, False):
        check(run(SINGLE[:w], inputs, "sum", split, reps=2), inputs, "sum")


@pytest.mark.parametrize("w", [5, 6])
@pytest.mark.parametrize("kind", ["float32", "int64", BFLOAT16])
def test_hierarchical_through_shared_memory_on_three_hosts(w: int, kind: str) -> None:
    """3 hosts x 2 ranks (and 2, 2, 1): each host reduces in its segment, the leaders' ring or
    doubling across, the result back through the segment."""
    inputs = [make(kind, 70_001, r) for r in range(w)]
    k = BFLOAT16 if kind == BFLOAT16 else None
    for split in (True, False):
        check(run(HOSTS[:w], inputs, "sum", split, k), inputs, "sum", k)


def test_segment_grows_between_operations_and_in_place_out() -> None:
    """Sizes up and down on the same segment; ``out`` the input itself; async and sync mixed."""
    w, hosts = 3, SINGLE[:3]
    locs = locals_for(hosts)
    fabric = Fabric(w, timeout=10, eager=False)
    sizes = [10, 300_000, 5, 1_000_001, 64]

    def body(r: int) -> list[np.ndarray]:
        outs = []
        with Group(fabric.endpoint(r), hosts=hosts, local=locs[r]) as g:
            for n in sizes:
                x = np.full(n, r + 1, np.int64)
                g.allreduce(x, out=x)
                works = [g.allreduce_async(np.full(n, 2, np.int32)) for _ in range(2)]
                outs += [x, *(wk.wait() for wk in works)]
        return outs

    res = run_ranks(w, body)
    for r in range(w):
        for i, n in enumerate(sizes):
            assert (res[r][3 * i] == 6).all() and res[r][3 * i].size == n
            assert all((res[r][3 * i + j] == 6).all() for j in (1, 2))
    for loc in locs:
        assert loc is not None
        loc.close()


def test_a_rank_that_never_comes_is_named_within_the_timeout() -> None:
    """Rank 2 of 3 never enters the allreduce: the others fail naming it after the timeout."""
    hosts = SINGLE[:3]
    locs = locals_for(hosts, timeout=0.5)
    fabric = Fabric(3, timeout=10, eager=False)

    def body(r: int) -> Any:
        with Group(fabric.endpoint(r), hosts=hosts, local=locs[r]) as g:
            g.allreduce(np.ones(100, np.float32))
            if r == 2:
                return None
            t = time.monotonic()
            with pytest.raises(PeerTimeout) as info:
                g.allreduce(np.ones(100_000, np.float32))
            return info.value.peer, time.monotonic() - t, str(info.value)

    res = run_ranks(3, body)
    for peer, took, msg in res[:2]:
        assert peer == 2 and "rank 2" in msg and "shared-memory" in msg
        assert 0.5 <= took < 2.0


def test_the_jobs_failure_is_raised_while_waiting() -> None:
    """The health check (the scheduler's word, a dead peer) ends a wait long before the timeout."""
    failed: list[bool] = []

    def health() -> None:
        if failed:
            raise LinkError("collective: rank 1 (worker 1 on h0) closed its connection", 1)

    hosts = SINGLE[:2]
    locs = locals_for(hosts, timeout=30, health=health)
    fabric = Fabric(2, timeout=10, eager=False)

    def body(r: int) -> Any:
        with Group(fabric.endpoint(r), hosts=hosts, local=locs[r]) as g:
            g.allreduce(np.ones(8, np.float32))
            if r == 1:
                failed.append(True)  # "dies" here
                return None
            t = time.monotonic()
            with pytest.raises(LinkError, match="rank 1") as info:
                g.allreduce(np.ones(8, np.float32))
            with pytest.raises(LinkError):  # the group stays broken
                g.allreduce(np.ones(8, np.float32))
            return info.value.peer, time.monotonic() - t

    peer, took = run_ranks(2, body)[0]
    assert peer == 1 and took < 1.0


def test_counters_compare_modulo_2_32() -> None:
    assert _behind(5, 6) and not _behind(6, 6) and not _behind(7, 6)
    assert _behind(0xFFFFFFFF, 2) and not _behind(2, 0xFFFFFFFF)


def test_forcing_shm_without_a_segment_is_a_clear_error() -> None:
    fabric = Fabric(2)

    def body(r: int) -> None:
        g = Group(fabric.endpoint(r), hosts=SINGLE[:2], thresholds=Thresholds(force="shm"))
        with g, pytest.raises(ValueError, match="shared-memory segment"):
            g.allreduce(np.ones(4, np.float32))

    run_ranks(2, body)


def test_futex_sleeps_until_woken_or_the_word_changes() -> None:
    """A wait on an unchanged word sleeps (no busy loop) until its timeout or a wake; a word that
    already differs returns at once."""
    import threading

    from trainer_core.collective.primitives import futex

    seg = Segment.create(2)
    address, words = seg.base_address, seg.counters
    try:
        t = time.monotonic()
        futex.wait(address, 0, 0.05)
        assert time.monotonic() - t >= 0.04 or not futex.available()
        t = time.monotonic()
        futex.wait(address, 7, 5.0)  # the word holds 0, not 7
        assert time.monotonic() - t < 1.0

        def later() -> None:
            time.sleep(0.05)
            words[0] = 1
            futex.wake(address)

        threading.Thread(target=later).start()
        t = time.monotonic()
        while words[0] == 0:
            futex.wait(address, 0, 5.0)
        assert time.monotonic() - t < 2.0
    finally:
        seg.close()


def test_the_leader_publishes_a_smaller_form_of_the_result_that_the_others_expand() -> None:
    """With ``cross`` returning the result in a smaller form and an ``expand``, the host's other
    ranks rebuild the result from that form in the segment (as the compressed allreduce's payloads
    are decoded) instead of copying it, and the leader from its own copy once it shared it; a form
    larger than the buffer goes the old way (the leader expands it and shares the result)."""
    from trainer_core.collective.algorithms import shmreduce
    from trainer_core.collective.primitives.reduce import spec_for

    locs = locals_for(["h0", "h0"])
    n = 1000
    xs = [np.full(n, r + 1, np.float32) for r in range(2)]
    expanded: list[int] = []

    def cross(buf: np.ndarray, big: bool) -> np.ndarray:  # the other hosts: x3, as float16 bits
        buf *= 3
        form = buf.astype(np.float16).view(np.uint8)
        return np.concatenate([form, np.zeros(2 * form.size, np.uint8)]) if big else form

    def expand(form: np.ndarray, out: np.ndarray) -> None:
        expanded.append(form.size)
        np.copyto(out, form[: 2 * n].view(np.float16))

    def body(r: int) -> list[np.ndarray]:
        loc = locs[r]
        assert loc is not None
        outs = []
        for big in (False, True):
            out = np.empty(n, np.float32)
            shmreduce.allreduce(
                loc, xs[r], out, spec_for(np.float32, "sum"), False, lambda b, big=big: cross(b, big), expand
            )
            outs.append(out)
        return outs

    got = run_closing(locs, body)
    for out in (*got[0], *got[1]):
        assert (out == 9).all()
    assert sorted(expanded) == [2 * n, 2 * n, 6 * n]  # both ranks the small form, the leader the big
