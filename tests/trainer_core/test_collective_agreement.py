"""The ranks agree on each operation before its data moves (collective/agreement.py, negotiator.py):
the pure decision, then groups on in-process links (one thread per rank). The same cases among
real worker processes: test_collective_agreement_jobs.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.collective import CollectiveMismatch, Group, Thresholds
from trainer_core.collective.agreement import Descriptor, agreed, decide, mismatch
from trainer_core.collective.fabric import Fabric, run_ranks

_MADE: list[Group] = []


@pytest.fixture(autouse=True)
def _close_groups() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def groups(w: int, timeout: float = 5) -> list[Group]:
    fabric = Fabric(w, timeout=timeout, eager=False)
    made = [Group(fabric.endpoint(r), thresholds=Thresholds(segment_bytes=4096)) for r in range(w)]
    _MADE.extend(made)
    return made


def d(name: str, **kw: object) -> Descriptor:
    return Descriptor(name, str(kw.pop("kind", "allreduce")), **kw)  # type: ignore[arg-type]


def test_equal_records_agree_and_any_difference_or_refusal_does_not() -> None:
    a = d("x", shape=(4,), dtype="float32", op="sum")
    assert agreed([a.record(16), a.record(16)])
    assert not agreed([a.record(16), d("x", shape=(5,), dtype="float32", op="sum").record(20)])
    assert not agreed([a.record(16), d("y", shape=(4,), dtype="float32", op="sum").record(16)])
    refused = Descriptor("x", "allreduce", refused="ValueError: no")
    assert not agreed([refused.record(), refused.record()])


def test_the_decision_names_which_ranks_passed_what() -> None:
    descs = [d("noname.0", shape=(n,), dtype="float32", op="sum") for n in (4, 5, 5)]
    assert mismatch(descs) == (
        "collective allreduce 'noname.0': the ranks passed different shapes: rank 0 (4,), ranks 1, 2 (5,)"
    )
    kinds = [d("noname.3"), d("noname.3", kind="broadcast", root=0)]
    assert "different operations: rank 0 allreduce, rank 1 broadcast" in mismatch(kinds)
    assert "roots" not in mismatch(kinds)  # each kind's own fields go unsaid
    refused = [d("y"), Descriptor("y", "allreduce", refused="ValueError: bad op")]
    assert mismatch(refused) == (
        "collective allreduce 'y' refused by rank 1 (rank 1: ValueError: bad op): it fails on every rank"
    )


def test_the_decision_runs_a_name_every_rank_holds_or_waits() -> None:
    assert decide([[d("a"), d("b")], [d("b"), d("a")]]).name == "a"  # rank 0's order
    assert decide([[d("a"), d("b")], [d("b")]]).name == "b"
    assert decide([[d("a")], [d("b")]]).name is None
    assert decide([[d("a", op="sum")], [d("a", op="max")]]).error.endswith(
        "different ops: rank 0 sum, rank 1 max"
    )


@pytest.mark.parametrize("w", [2, 3, 4])
def test_different_lengths_fail_on_every_rank_and_the_group_goes_on(w: int) -> None:
    gs = groups(w)

    def body(r: int) -> tuple[str, list[float]]:
        try:
            gs[r].allreduce(np.ones(4 + r, np.float32))
            err = ""
        except CollectiveMismatch as exc:
            err = str(exc)
        return err, gs[r].allreduce(np.full(3, r, np.float32)).tolist()

    out = run_ranks(w, body)
    shapes = ", ".join(f"rank {r} ({4 + r},)" for r in range(w))
    want = f"collective allreduce 'noname.0': the ranks passed different shapes: {shapes}"
    total = float(sum(range(w)))
    assert out == [(want, [total] * 3)] * w


def test_a_rank_that_refuses_tells_the_others_and_the_next_operation_is_right() -> None:
    gs = groups(3)

    def body(r: int) -> tuple[str, list[float]]:
        try:
            gs[r].allreduce(np.ones(4, np.float32), op="prod" if r == 1 else "sum")
            err = ""
        except (CollectiveMismatch, ValueError) as exc:
            err = f"{type(exc).__name__}: {exc}"
        return err, gs[r].allreduce(np.full(2, r + 1, np.float32)).tolist()

    out = run_ranks(3, body)
    assert out[1][0].startswith("ValueError: collective op must be one of")
    for r in (0, 2):
        assert out[r][0].startswith("CollectiveMismatch: collective allreduce 'noname.0' refused by rank 1")
    assert [o[1] for o in out] == [[6.0, 6.0]] * 3


def test_a_list_is_a_type_error_saying_what_is_accepted() -> None:
    g = groups(1)[0]
    with pytest.raises(TypeError, match="takes a numpy or cupy array, not list"):
        g.allreduce([1.0, 2.0])
    with pytest.raises(TypeError, match="takes a numpy or cupy array, not float"):
        g.broadcast(3.0)
    assert g.allreduce(np.arange(3)).tolist() == [0, 1, 2]


def test_threads_are_matched_by_name_in_any_order() -> None:
    w, steps = 3, 20
    gs = groups(w)

    def body(r: int) -> list[tuple[str, float]]:
        got: list[tuple[str, float]] = []
        lock = threading.Lock()

        def one(tag: str, value: float) -> None:
            for i in range(steps):
                res = gs[r].allreduce(np.full(5, value * (i + 1), np.float64), name=f"{tag}.{i}")
                with lock:
                    got.append((f"{tag}.{i}", float(res[0])))

        order = ("a", "b") if r % 2 else ("b", "a")
        ts = [threading.Thread(target=one, args=(t, 1.0 if t == "a" else 100.0)) for t in order]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return sorted(got)

    want = sorted(
        (f"{t}.{i}", w * (i + 1) * (1.0 if t == "a" else 100.0)) for t in "ab" for i in range(steps)
    )
    assert run_ranks(w, body) == [want] * w


def test_a_name_submitted_twice_while_pending_fails_on_every_rank() -> None:
    gs = groups(2)
    x = np.ones(3)
    first = gs[0].allreduce_async(x, name="a")  # rank 1 comes later: "a" waits, "x" is queued
    w1 = gs[0].allreduce_async(x, name="x")
    w2 = gs[0].allreduce_async(x, name="x")
    other = [gs[1].allreduce_async(x, name=n) for n in ("a", "x")]
    assert first.wait().tolist() == [2.0] * 3 and other[0].wait().tolist() == [2.0] * 3
    for w in (w1, w2, other[1]):
        with pytest.raises(CollectiveMismatch, match="'x' submitted twice while in flight"):
            w.wait()
    nxt = [g.allreduce_async(x) for g in gs]
    assert [w.wait().tolist() for w in nxt] == [[2.0] * 3] * 2
