"""Tensor fusion across operations (collective/batching.py, fusion.py, the negotiator's cycle): the
pure batching functions, then groups on in-process links (one thread per rank) whose
``allreduce_async``s run fused. The same among real worker processes under Horovod's environment
variables: test_torch_fusion_jobs.py."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.collective import CollectiveMismatch, Group, Thresholds
from trainer_core.collective.agreement import JOIN, Descriptor, agreed
from trainer_core.collective.batching import batch_record, candidate, key, layout, together
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.fusion import Part, fuser

_MADE: list[Group] = []


@pytest.fixture(autouse=True)
def _close_groups() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def d(name: str, fuse: int = 8, dtype: str = "float32", op: str = "sum", refused: str = "") -> Descriptor:
    return Descriptor(name, "allreduce", (fuse // 4,), dtype, op, group="2 ranks", refused=refused, fuse=fuse)


# -- the pure functions ---------------------------------------------------------------------------
def test_the_key_is_what_a_buffer_shares_and_unfusable_operations_have_none() -> None:
    assert key(d("a")) == ("allreduce", "float32", "sum", "2 ranks")
    assert key(d("a", fuse=0)) is None
    assert key(d("a", refused="ValueError: no")) is None
    assert key(Descriptor("j", JOIN)) is None


def test_a_candidate_takes_the_heads_kind_in_queue_order_within_the_limit() -> None:
    q = [d("a", 8), d("b", 8, dtype="float64"), d("c", 8), d("d", 8, op="max"), d("e", 8), d("f", 4)]
    assert candidate(q, 100) == [0, 2, 4, 5]
    assert candidate(q, 20) == [0, 2, 5]  # e does not fit after c; f still does
    assert candidate(q, 8) == []  # nothing joins the head
    assert candidate(q, 0) == []  # fusion off
    assert candidate([d("a", 0), d("b")], 100) == []  # the head runs alone
    assert candidate([d("a", 200), d("b")], 100) == []  # larger than a buffer
    assert candidate([], 100) == []


def test_together_takes_what_every_rank_holds_alike_in_rank_0s_order() -> None:
    r0 = [d("a"), d("b"), d("c"), d("x", 8, dtype="float64"), d("m")]
    r1 = [d("m", 12), d("c"), d("b"), d("x", 8, dtype="float64"), d("a")]  # m differs; reversed
    assert together([r0, r1], "a", 100) == ["a", "b", "c"]
    assert together([r0, r1], "a", 16) == ["a", "b"]
    assert together([r0, [d("a"), d("m", 12)]], "a", 100) == ["a"]  # b, c not submitted on rank 1
    assert together([r0, r1], "a", 0) == ["a"]
    assert together([r0, r1], "x", 100) == ["x"]  # nothing else of its kind
    joined = [Descriptor("join.0", JOIN)]
    assert together([r0, joined], "a", 100) == ["a"]  # a joined rank stands in for one at a time


def test_the_layout_and_record_do_not_depend_on_the_submission_order() -> None:
    a, b = d("b"), d("a")
    assert layout(["b", "a", "c"]) == ["a", "b", "c"]
    assert batch_record([b, a]) == batch_record([b, a])
    assert batch_record([b, a]) != batch_record([b, d("a", 12)])  # another shape
    assert batch_record([b, a]) != batch_record([b, d("a", refused="no")])
    assert not agreed([batch_record([b, d("a", refused="no")])] * 2)
    assert batch_record([b, a]) != batch_record([b, d("c")])


def test_the_fusers_pack_and_run_give_each_part_its_piece() -> None:
    xs = [np.arange(3, dtype=np.float32), np.arange(5, dtype=np.float32) + 10]
    seen = []
    parts = [Part(x, None, lambda piece: piece.copy()) for x in xs]

    def reduce(seq: int, buf: np.ndarray) -> None:
        seen.append((seq, buf.copy()))
        buf *= 2

    pack, run = fuser(parts, reduce)
    pack()
    out = run(7)
    assert seen[0][0] == 7 and seen[0][1].tolist() == [*range(3), *range(10, 15)]
    assert [o.tolist() for o in out] == [[0, 2, 4], [20, 22, 24, 26, 28]]


# -- groups on in-process links -------------------------------------------------------------------
def groups(w: int, threshold: int, cycle_s: float = 30.0) -> list[Group]:
    fabric = Fabric(w, timeout=10, eager=False)
    made = [Group(fabric.endpoint(r), thresholds=Thresholds(segment_bytes=4096)) for r in range(w)]
    for g in made:
        g.fuse(threshold, cycle_s)
    _MADE.extend(made)
    return made


DTYPES = (np.float32, np.float64, np.int32, np.float16)


def inputs(rank: int, n: int = 24) -> list[np.ndarray]:
    """Rank ``rank``'s arrays: sizes and dtypes vary; random floats (so that another order of
    the sums would show in the bits)."""
    rng = np.random.default_rng(rank)
    return [(rng.standard_normal(1 + 7 * i % 50) * 100).astype(DTYPES[i % len(DTYPES)]) for i in range(n)]


def op_of(i: int) -> str:
    """Every third float array averaged (integers are summed: a mean of them is refused)."""
    return "mean" if i % 3 == 0 and np.dtype(DTYPES[i % len(DTYPES)]).kind == "f" else "sum"


def reduce_all(gs: list[Group], reverse_last: bool) -> tuple[list[list[np.ndarray]], list[int]]:
    """Every rank's results (by index) and how many collectives each ran; the last rank submits
    in reverse order; the cycle ends when each rank waits (nothing is left to submit)."""

    def body(r: int) -> tuple[list[np.ndarray], int]:
        xs = inputs(r)
        order = list(range(len(xs)))[:: -1 if reverse_last and r == len(gs) - 1 else 1]
        before = gs[r].collectives
        works = {i: gs[r].allreduce_async(xs[i], op_of(i), name=f"t{i}") for i in order}
        return [works[i].wait() for i in range(len(xs))], gs[r].collectives - before

    got = run_ranks(len(gs), body)
    return [g[0] for g in got], [g[1] for g in got]


@pytest.mark.parametrize("w", [2, 3])
def test_fused_results_equal_the_unfused_ones_bit_for_bit_in_fewer_collectives(w: int) -> None:
    fused, ran = reduce_all(groups(w, 1 << 20), reverse_last=True)
    alone, ran_alone = reduce_all(groups(w, 0), reverse_last=True)
    keys = {(np.dtype(DTYPES[i % len(DTYPES)]).name, op_of(i)) for i in range(24)}
    assert ran_alone == [24] * w  # threshold 0: one collective per array
    assert ran == [ran[0]] * w and ran[0] <= len(keys) < 24, ran  # one per dtype and op
    for r in range(w):
        for i in range(24):
            assert fused[r][i].dtype == alone[r][i].dtype
            assert fused[r][i].tobytes() == alone[r][i].tobytes(), (r, i)
            assert fused[r][i].tobytes() == fused[0][i].tobytes()  # the same on every rank
    want = np.sum([inputs(r)[5].astype(np.float64) for r in range(w)], axis=0)
    assert np.allclose(fused[0][5], want, rtol=1e-5)


def test_the_threshold_bounds_a_batch() -> None:
    gs = groups(2, 64)  # 16 float32 elements

    def body(r: int) -> int:
        before = gs[r].collectives
        works = [gs[r].allreduce_async(np.full(8, r + i, np.float32), name=f"x{i}") for i in range(6)]
        assert [w.wait().tolist() for w in works] == [[1.0 + 2 * i] * 8 for i in range(6)]
        return gs[r].collectives - before

    assert run_ranks(2, body) == [3, 3]


def test_a_mismatch_inside_a_batch_fails_that_operation_on_every_rank_and_the_group_goes_on() -> None:
    gs = groups(3, 1 << 20)

    def body(r: int) -> tuple[list[float], str, list[float]]:
        g = gs[r]
        works = [g.allreduce_async(np.full(4, 1.0), name=f"ok{i}") for i in range(3)]
        bad = g.allreduce_async(np.ones(5 if r == 1 else 4), name="bad")
        more = g.allreduce_async(np.full(4, 2.0), name="ok3")
        sums = [float(w.wait()[0]) for w in [*works, more]]
        with pytest.raises(CollectiveMismatch) as err:
            bad.wait()
        after = g.allreduce_async(np.full(2, 5.0), name="after").wait()
        return sums, str(err.value), after.tolist()

    got = run_ranks(3, body)
    for sums, err, after in got:
        assert sums == [3.0, 3.0, 3.0, 6.0] and after == [15.0, 15.0]
        assert "'bad'" in err and "different shapes" in err and "rank 1 (5,)" in err


def test_a_fusable_head_waits_for_the_cycle_unless_a_caller_waits() -> None:
    gs = groups(2, 1 << 20, cycle_s=0.05)

    def body(r: int) -> list[float]:
        first = gs[r].allreduce_async(np.ones(3), name="a")
        while not first.done():  # nobody waits: the cycle (50 ms) ends and it runs alone
            first._event.wait(0.01)
        return first.wait().tolist()

    assert run_ranks(2, body) == [[2.0] * 3] * 2


def test_a_batchs_names_may_be_submitted_again_once_their_results_are_in() -> None:
    gs = groups(2, 1 << 20)

    def body(r: int) -> list[float]:
        sums = []
        for step in range(5):  # the same names every step, as a training loop submits them
            works = [gs[r].allreduce_async(np.full(10, float(step + i)), name=f"g{i}") for i in range(20)]
            sums.append(sum(float(w.wait()[0]) for w in works))
        return sums

    assert run_ranks(2, body) == [[2.0 * sum(step + i for i in range(20)) for step in range(5)]] * 2
