"""The Group API (trainer_core.collective.group): broadcast, allgather (ragged), reduce_scatter,
barrier, async handles, fusion, and failures, on in-process synchronous links."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.collective import CollectiveClosed, Group, PeerTimeout, Thresholds
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.fusion import plan

TH = Thresholds(segment_bytes=4096)


_MADE: list[Group] = []


@pytest.fixture(autouse=True)
def _close_groups() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def groups(w: int, timeout: float = 10) -> list[Group]:
    """``w`` groups on synchronous in-memory links (closed after the test)."""
    fabric = Fabric(w, timeout=timeout, eager=False)
    made = [Group(fabric.endpoint(r), thresholds=TH) for r in range(w)]
    _MADE.extend(made)
    return made


@pytest.mark.parametrize("w", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 10_001])
def test_broadcast_from_every_root(w: int, n: int) -> None:
    gs = groups(w)
    for root in range(w):
        inputs = [np.full((n, 2), r, np.float64) for r in range(w)]

        def body(r: int, inputs: list[np.ndarray] = inputs, root: int = root) -> np.ndarray:
            return gs[r].broadcast(inputs[r], root)

        out = run_ranks(w, body)
        for o in out:
            assert o.shape == (n, 2) and (o == root).all()


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
def test_ragged_allgather(w: int) -> None:
    gs = groups(w)
    inputs = [np.arange(r * 3, dtype=np.int32).reshape(r, 3) + 100 * r for r in range(w)]  # rank 0: none
    out = run_ranks(w, lambda r: gs[r].allgather(inputs[r]))
    want = np.concatenate(inputs)
    for o in out:
        assert o.dtype == np.int32 and np.array_equal(o, want)


def test_allgather_of_large_and_scalar_arrays() -> None:
    gs = groups(3)
    big = [np.random.default_rng(r).standard_normal(50_001 + r) for r in range(3)]
    out = run_ranks(3, lambda r: gs[r].allgather(big[r]))
    assert all(np.array_equal(o, np.concatenate(big)) for o in out)
    out = run_ranks(3, lambda r: gs[r].allgather(np.float32(r)))
    assert all(o.tolist() == [0.0, 1.0, 2.0] for o in out)


@pytest.mark.parametrize("w", [1, 2, 3, 5])
@pytest.mark.parametrize("rows", [0, 1, 7, 1000])
def test_reduce_scatter_keeps_this_ranks_rows(w: int, rows: int) -> None:
    gs = groups(w)
    inputs = [np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) * (r + 1) for r in range(w)]
    out = run_ranks(w, lambda r: gs[r].reduce_scatter(inputs[r]))
    total = sum(inputs)
    for r, part in zip(range(w), np.array_split(total, w), strict=True):
        assert np.array_equal(out[r], part)


def test_mean_reduce_scatter_and_out() -> None:
    gs = groups(2)
    out = run_ranks(2, lambda r: gs[r].reduce_scatter(np.full(4, 2.0 * (r + 1)), op="mean"))
    assert out[0].tolist() == [3.0, 3.0] and out[1].tolist() == [3.0, 3.0]
    dest = [np.empty((2, 2), np.float32) for _ in range(2)]
    got = run_ranks(2, lambda r: gs[r].allreduce(np.ones((2, 2), np.float32), out=dest[r]))
    assert got[0] is dest[0] and (dest[1] == 2).all()
    # refused on rank 0 alone: the refusal it sends waits for rank 1, which never comes, so its
    # group's close waits out the links' timeout (1 s here, not the 10 s of the groups above)
    refusing = groups(2, timeout=1)[0]
    with pytest.raises(ValueError, match=r"out must be a float32 array of shape \(2, 2\)"):
        refusing.allreduce(np.ones((2, 2), np.float32), out=np.empty(4, np.float32))


def test_barrier_waits_for_the_last_rank() -> None:
    """Four ranks enter; none leaves before the fifth (rank 3) entered, then all do."""
    gs = groups(5)
    works = [gs[r].barrier_async() for r in (0, 1, 2, 4)]
    assert not any(w.done() for w in works)  # rank 3 has not entered: no barrier can have ended
    gs[3].barrier()
    for w in works:
        w.wait()
    assert all(w.done() for w in works)


def test_async_handles_overlap_and_keep_their_order() -> None:
    """Each rank queues several operations without blocking, computes, then waits (out of order);
    rank 1 queues only after rank 0 saw its first handle still pending."""
    gs = groups(2)
    seen_pending = threading.Event()

    def body(r: int) -> list[float]:
        if r == 1:
            assert seen_pending.wait(5)
        works = [gs[r].allreduce_async(np.full(1000, float(k + r))) for k in range(4)]
        works.append(gs[r].allgather_async(np.array([r])))
        if r == 0:
            assert not works[0].done()  # rank 1 has not submitted: nothing can have finished
            seen_pending.set()
        busy = sum(i * i for i in range(20_000))  # the caller computes meanwhile
        assert busy > 0
        got = [float(w.wait()[0]) for w in reversed(works[:4])]
        assert works[4].wait().tolist() == [0, 1]
        return got

    out = run_ranks(2, body)
    assert out[0] == out[1] == [7.0, 5.0, 3.0, 1.0]


def test_grouped_allreduce_fuses_into_buckets() -> None:
    w = 3
    shapes = [(3,), (2, 2), (0,), (5,), (1,), (7, 3)]
    dtypes = [np.float32, np.float32, np.float32, np.int64, np.float32, np.int64]
    inputs = [
        [np.full(s, r + i, dt) for i, (s, dt) in enumerate(zip(shapes, dtypes, strict=True))]
        for r in range(w)
    ]
    fabric = Fabric(w, timeout=10, eager=False)
    th = Thresholds(fusion_bytes=30)
    out = run_ranks(w, lambda r: Group(fabric.endpoint(r), thresholds=th).grouped_allreduce(inputs[r]))
    for res in out:
        for i, (s, dt) in enumerate(zip(shapes, dtypes, strict=True)):
            assert res[i].shape == s and res[i].dtype == dt
            assert (res[i] == sum(r + i for r in range(w))).all()
    # the buckets those arrays made: float32 12 + 16 + 0 bytes, then 4 more would pass 30; each
    # int64 array is a bucket of its own
    sizes = [
        (np.dtype(dt).name, int(np.prod(s)) * np.dtype(dt).itemsize)
        for s, dt in zip(shapes, dtypes, strict=True)
    ]
    assert plan(sizes, 30) == [[0, 1, 2], [3], [4], [5]]
    assert plan(sizes, 1 << 20) == [[0, 1, 2, 4], [3, 5]]


def test_fusion_sends_fewer_messages() -> None:
    w, k = 2, 50
    small = [[np.full(10, float(r + i), np.float32) for i in range(k)] for r in range(w)]
    messages = []
    for fused in (False, True):
        fabric = Fabric(w, timeout=10)

        def body(r: int, fused: bool = fused, fabric: Fabric = fabric) -> list[np.ndarray]:
            g = Group(fabric.endpoint(r))
            return g.grouped_allreduce(small[r]) if fused else [g.allreduce(a) for a in small[r]]

        res = run_ranks(w, body)
        assert all((res[0][i] == 2 * i + 1).all() for i in range(k))
        messages.append(fabric.endpoint(0).sent_messages)
    assert messages[1] * k == messages[0]


def test_a_silent_peer_fails_the_collective_naming_it() -> None:
    """Rank 2 never comes: rank 0, which waits for every rank to announce the operation
    (negotiator), names it; rank 1 waits on rank 0's answer and fails within the same timeout,
    naming the peer it waited on (naming the root cause on every rank is the node layer's
    liveness, not the links')."""
    gs = groups(3, timeout=0.5)
    start = time.monotonic()
    works = [gs[r].allreduce_async(np.ones(10)) for r in (0, 1)]
    with pytest.raises(PeerTimeout, match=r"rank 2 sent nothing to rank 0 within 0.5 s") as info:
        works[0].wait()
    assert info.value.node == "rank 2" and info.value.peer == 2
    with pytest.raises(PeerTimeout, match=r"rank 0 (sent nothing to|did not take a message from) rank 1"):
        works[1].wait()
    assert time.monotonic() - start < 3.0
    # the group is broken from then on: later operations fail at once with that error
    with pytest.raises(PeerTimeout, match="rank 2 sent nothing to rank 0"):
        gs[0].barrier()


def test_a_silent_peer_in_a_ring_is_named() -> None:
    gs = groups(2, timeout=0.3)
    ring = Group(gs[0].links, thresholds=Thresholds(force="ring"))
    start = time.monotonic()
    with pytest.raises(PeerTimeout, match=r"rank 1 sent nothing to rank 0 within 0\.3 s"):
        ring.allreduce(np.ones(100))
    assert time.monotonic() - start < 2.0


def test_closed_group_refuses_work() -> None:
    g = groups(1)[0]
    assert g.allreduce(np.arange(3)).tolist() == [0, 1, 2]
    g.close()
    with pytest.raises(CollectiveClosed, match="allreduce: the group is closed"):
        g.allreduce(np.arange(3))


def test_bad_arguments_fail_in_the_caller() -> None:
    # rank 1 never joins the refusals rank 0 sends: the close waits out the links' timeout (1 s)
    g = groups(2, timeout=1)[0]
    with pytest.raises(ValueError, match="root must be a rank of the group"):
        g.broadcast(np.ones(2), root=2)
    with pytest.raises(ValueError, match="hosts lists 3 ranks for a group of 2"):
        Group(g.links, hosts=["a", "b", "c"])
    with pytest.raises(ValueError, match="algorithm must be one of"):
        Thresholds(force="tree")
    with pytest.raises(TypeError, match="not bool"):
        g.allreduce(np.ones(2, bool))


@pytest.mark.parametrize("shm", [False, True])
def test_grouped_allreduce_on_several_hosts_takes_the_ring_between_leaders(shm: bool) -> None:
    """A fused bucket (one phase), the hierarchical path (a second) and the leaders' ring (its
    reduce-scatter and allgather: a third) nest three phases deep; they ran out of tag space
    before (ValueError), with or without the hosts' shared memory."""
    from tests.trainer_core.test_collective_shm import locals_for

    hosts = ["a", "a", "b", "b"]
    fabric = Fabric(4, timeout=10, eager=False)
    locs = locals_for(hosts) if shm else [None] * 4
    th = Thresholds(ring_min_bytes=1000)

    def body(r: int) -> list[np.ndarray]:
        with Group(fabric.endpoint(r), hosts=hosts, thresholds=th, local=locs[r]) as g:
            out = g.grouped_allreduce([np.full(10_000, r, np.float32), np.ones(3, np.float32)])
            assert g.last_algorithm == "hierarchical"
            return out

    try:
        for a, b in run_ranks(4, body):
            assert (a == 6).all() and (b == 4).all()
    finally:
        for loc in locs:
            if loc is not None:
                loc.close()


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda g: g.allreduce([1.0, 2.0]), "collective allreduce takes a numpy or cupy array, not list"),
        (lambda g: g.allreduce_async(3), "collective allreduce takes a numpy or cupy array, not int"),
        (
            lambda g: g.reduce_scatter([1.0, 2.0]),
            "collective reduce_scatter takes a numpy or cupy array, not list",
        ),
        (
            lambda g: g.grouped_allreduce([np.ones(2), [1.0]]),
            "collective grouped_allreduce takes a numpy or cupy array, not list",
        ),
        (lambda g: g.broadcast(np.ones(2), root="0"), "broadcast root must be a rank (an int), not str '0'"),
        (
            lambda g: g.broadcast(np.ones(2), root=0.0),
            "broadcast root must be a rank (an int), not float 0.0",
        ),
    ],
    ids=["allreduce list", "allreduce int", "reduce_scatter list", "grouped list", "root str", "root float"],
)
def test_what_is_not_an_array_or_a_rank_is_refused_before_anything_is_sent(call: object, said: str) -> None:
    """Before: AttributeError 'list' object has no attribute 'dtype'; TypeError on '<='; and a
    root of 0.0 passed the range check, sent to rank 1.0 and hung until the peers' timeout. Each
    rank refuses on its own, at once (no rank waits for another)."""
    for g in groups(2, timeout=30):
        started = time.monotonic()
        with pytest.raises(TypeError) as info:
            call(g)  # type: ignore[operator]
        assert said in str(info.value)
        assert time.monotonic() - started < 5


def test_a_root_of_an_integer_type_is_a_rank() -> None:
    made = groups(2)
    out = run_ranks(2, lambda r: made[r].broadcast(np.full(2, float(r)), root=np.int64(1)))
    assert all(np.array_equal(o, [1.0, 1.0]) for o in out)
