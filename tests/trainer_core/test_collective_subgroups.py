"""Process sets (``collective.subgroups``) in process: tag spaces that never meet, and sets of an
in-memory group reducing concurrently with the whole group, their results equal to numpy's."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer_core.collective import Group, SubLinks, Thresholds
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.primitives.links import (
    MAX_SPACES,
    SEQ_WRAP,
    Ctx,
    data_op,
    op_bits,
    space_of,
)
from trainer_core.collective.subgroups import Subgroups, members_of

_MADE: list[Subgroups | Group] = []


@pytest.fixture(autouse=True)
def _close() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def sets_of(w: int) -> list[Subgroups]:
    fabric = Fabric(w, timeout=20, eager=False)
    groups = [Group(fabric.endpoint(r), thresholds=Thresholds()) for r in range(w)]
    _MADE.extend(groups)
    made = [Subgroups(g) for g in groups]
    _MADE.extend(made)  # closed first (the list is popped from its end)
    return made


# -- tag spaces ---------------------------------------------------------------------------------------
class _Record:
    """Links that record the tags they are given."""

    rank, size = 1, 4

    def __init__(self) -> None:
        self.tags: list[tuple[int, int]] = []
        self.dropped: list[tuple[int, int]] = []

    def send(self, peer: int, tag: int, buffer: np.ndarray) -> None:
        self.tags.append((peer, tag))

    def recv(self, peer: int, tag: int, out: np.ndarray) -> None:
        self.tags.append((peer, tag))

    def drop(self, seq: int, space: int = 0) -> None:
        self.dropped.append((seq, space))


def test_a_sets_tags_carry_its_space_and_never_equal_the_global_groups() -> None:
    inner = _Record()
    sub = SubLinks(inner, [1, 3], space=5)  # type: ignore[arg-type]
    assert (sub.rank, sub.size) == (0, 2)
    buf = np.zeros(1)
    seen = set()
    for seq in (0, 1, SEQ_WRAP - 1):
        ctx = Ctx.for_op(sub, seq)
        for tag in (ctx.tag(0), ctx.phase(2).tag(7, 3), ctx.control(1)):
            sub.send(1, tag, buf)
            peer, sent = inner.tags[-1]
            assert peer == 3 and space_of(sent) == 5 and space_of(tag) == 0
            assert sent != tag and sent not in seen
            seen.add(sent)
            # the global group's operation of the same number uses the tag without the space
            assert Ctx.for_op(inner, seq).tag(0) & ~((1 << 60) - 1) == 0  # type: ignore[arg-type]
        assert data_op(ctx.tag(0) | (5 << 60)) == op_bits(seq, 5) != op_bits(seq)
        assert data_op(ctx.control(0)) is None
    sub.drop(4)
    assert inner.dropped == [(4, 5)]


def test_spaces_are_bounded_and_sequence_numbers_wrap_within_their_bits() -> None:
    with pytest.raises(ValueError, match="tag space 16"):
        SubLinks(_Record(), [1], space=MAX_SPACES)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in the subgroup"):
        SubLinks(_Record(), [0, 2])  # type: ignore[arg-type]
    assert op_bits(SEQ_WRAP + 3) == op_bits(3) and op_bits(3, 1) == SEQ_WRAP + 3


def test_members_are_checked() -> None:
    assert members_of([3, 1], 4) == (1, 3)
    for bad, why in (([], "at least one"), ([0, 4], "out of 0..3"), ([1, 1], "each rank once")):
        with pytest.raises(ValueError, match=why):
            members_of(bad, 4)
    with pytest.raises(TypeError, match="list of ranks"):
        members_of(["a"], 4)


# -- sets of an in-memory group ------------------------------------------------------------------------
@pytest.mark.parametrize("w", [3, 4])
def test_two_disjoint_sets_reduce_concurrently_with_the_global_group(w: int) -> None:
    sets = sets_of(w)
    even, odd = list(range(0, w, 2)), list(range(1, w, 2))
    inputs = [np.random.default_rng(r).standard_normal(1000) for r in range(w)]

    def body(r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = sets[r]
        ids = (s.add(even), s.add(odd))
        mine = s.group(ids[0] if r in even else ids[1])
        # the set's operation is queued before and runs alongside the global one
        in_set = mine.allreduce_async(inputs[r] * 2, "sum")
        whole = s.parent.allreduce_async(inputs[r], "sum")
        gathered = mine.allgather(np.array([r]))
        return in_set.wait(), whole.wait(), gathered

    out = run_ranks(w, body)
    for r, (in_set, whole, gathered) in enumerate(out):
        members = even if r in even else odd
        np.testing.assert_allclose(in_set, sum(inputs[m] * 2 for m in members), rtol=1e-12)
        np.testing.assert_allclose(whole, sum(inputs), rtol=1e-12)
        assert gathered.tolist() == members


def test_ids_are_agreed_by_order_reused_after_removal_and_outsiders_are_refused() -> None:
    sets = sets_of(3)

    def body(r: int) -> list[object]:
        s = sets[r]
        a, b = s.add([0, 1]), s.add([1, 2])
        got: list[object] = [a, b]
        if r == 2:
            with pytest.raises(ValueError, match="rank 2 is not in process set 1"):
                s.group(a, "allreduce")
        else:
            got.append(s.group(a).broadcast(np.array([r + 10]), root=1).tolist())
        with pytest.raises(ValueError, match="already registered"):
            s.add([1, 0])
        s.remove(a)
        with pytest.raises(ValueError, match="not registered"):
            s.group(a)
        got.append(s.add([0, 2]))  # the lowest free id again
        assert s.find([0, 2]) == a and s.find([0, 1, 2]) == 0 and s.find([0, 1]) is None
        if r != 1:
            got.append(s.group(a).allreduce(np.array([float(r)])).tolist())
        return got

    out = run_ranks(3, body)
    assert out[0] == [1, 2, [11], 1, [2.0]]
    assert out[1] == [1, 2, [11], 1]
    assert out[2] == [1, 2, 1, [2.0]]


def test_the_whole_group_is_not_a_set_and_ids_run_out_at_the_tag_spaces() -> None:
    sets = sets_of(5)
    some = [c for k in (1, 2) for c in itertools.combinations(range(5), k)]
    assert len(some) == MAX_SPACES - 1

    def body(r: int) -> list[int]:
        s = sets[r]
        with pytest.raises(ValueError, match="the global one"):
            s.add(range(5))
        ids = [s.add(c) for c in some]
        with pytest.raises(ValueError, match=f"at most {MAX_SPACES - 1} process sets"):
            s.add([0, 1, 2])
        return ids

    assert run_ranks(5, body) == [list(range(1, MAX_SPACES))] * 5


def test_ranks_that_register_different_sets_are_told_on_every_rank() -> None:
    sets = sets_of(3)

    def body(r: int) -> str:
        with pytest.raises(ValueError, match=r"disagree on process set 1: ranks \[2\] registered") as err:
            sets[r].add([0, 1] if r < 2 else [1, 2])
        assert sets[r].ids() == []  # not registered anywhere
        return str(err.value)

    out = run_ranks(3, body)
    assert "rank 2: ranks [1, 2]" in out[2] and "rank 0: ranks [0, 1]" in out[0]


# -- the timeline --------------------------------------------------------------------------------------
def test_the_timeline_records_each_sets_operations_where_its_writer_is(tmp_path: Path) -> None:
    """Rank 0 writes the whole group's operations and those of the sets it is in (one added after
    the start too), on rows naming the set; the set without rank 0 is in its first member's file."""
    sets = sets_of(3)
    path = str(tmp_path / "t.json")

    def body(r: int) -> None:
        s = sets[r]
        a, b = s.add([0, 1]), s.add([1, 2])
        s.start_timeline(path)
        s.parent.allreduce(np.ones(2), "sum", name="grad")
        if r in (0, 1):
            s.group(a).allreduce(np.ones(2), "sum", name="grad")
        if r in (1, 2):
            s.group(b).allreduce(np.ones(2), "sum", name="grad")
            s.group(b).allgather(np.ones(1), name="rows")
        c = s.add([0, 2])
        if r in (0, 2):
            s.group(c).broadcast(np.ones(1), root=1, name="w")
        s.stop_timeline()
        s.parent.allreduce(np.ones(2), "sum", name="after")  # not recorded

    run_ranks(3, body)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.set-1-2.json"]

    def rows(name: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
        events = json.loads((tmp_path / name).read_text())
        named = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
        return named, [e for e in events if e["ph"] == "X"]

    main, spans = rows("t.json")
    named = {n for n in main if not n.startswith("noname.")}  # (noname.2: set 3's registration)
    assert named == {"grad", "grad (process set 1 [0, 1])", "w (process set 3 [0, 2])"}, main
    assert {e["args"]["rank"] for e in spans} == {0}
    assert [e["name"] for e in spans if e["pid"] == main["w (process set 3 [0, 2])"]][-1] == "BROADCAST"
    side, spans = rows("t.set-1-2.json")
    assert set(side) == {"grad (process set 2 [1, 2])", "rows (process set 2 [1, 2])"}
    assert {e["args"]["rank"] for e in spans} == {1}
    assert {e["args"]["process_set"] for e in spans} == {"process set 2 [1, 2]"}
