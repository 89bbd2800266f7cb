"""Horovod's ``join`` on a group (collective/joining.py, agreement.decide's joined ranks): the pure
decision, then groups on in-process links (one thread per rank) with uneven batches against a
numpy reference. The same among real worker processes: test_collective_joining_jobs.py."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from trainer_core.collective import CollectiveMismatch, Group, Thresholds, bf16_to_f32, f32_to_bf16
from trainer_core.collective.agreement import JOIN, Descriptor, decide
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.joining import last_joined, zeros

_MADE: list[Group] = []


@pytest.fixture(autouse=True)
def _close_groups() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def groups(w: int) -> list[Group]:
    fabric = Fabric(w, timeout=10, eager=False)
    made = [Group(fabric.endpoint(r), thresholds=Thresholds(segment_bytes=4096)) for r in range(w)]
    _MADE.extend(made)
    return made


def d(name: str, kind: str = "allreduce", **kw: object) -> Descriptor:
    return Descriptor(name, kind, **kw)  # type: ignore[arg-type]


def test_joined_ranks_stand_in_for_what_the_others_agree_on() -> None:
    x = d("g", shape=(3,), dtype="float32", op="sum")
    got = decide([[d("join.0", JOIN)], [x], [x, d("h")]])
    assert (got.name, got.error, got.standin) == ("g", "", x)
    assert decide([[d("join.0", JOIN)], [d("a")], [d("b")]]).name is None  # the others wait
    everyone = decide([[d("join.0", JOIN)], [d("join.0", JOIN)]])
    assert (everyone.name, everyone.error, everyone.standin) == ("join.0", "", None)


def test_a_join_behind_pending_operations_is_not_chosen_before_them() -> None:
    assert decide([[d("a"), d("join.0", JOIN)], [d("b"), d("join.0", JOIN)]]).name is None


def test_what_a_joined_rank_cannot_take_part_in_fails_on_every_rank() -> None:
    bc = d("b", "broadcast", shape=(2,), dtype="float32", root=0)
    got = decide([[d("join.0", JOIN)], [bc], [bc]])
    assert got.name == "b"
    assert got.error == (
        "collective broadcast 'b': its root, rank 0, has joined (hvd.join) and sends nothing; "
        "it fails on every rank"
    )
    comp = d("c", "compressed_allreduce", shape=(2,), dtype="float32", op="mean (onebit)")
    assert "cannot run while rank 1 joined" in decide([[comp], [d("join.0", JOIN)]]).error


def test_the_last_to_join_is_the_latest_slot_and_ties_go_to_the_highest_rank() -> None:
    assert last_joined([5, 9, 2]) == 1
    assert last_joined([7, 3, 7]) == 2


def test_stand_in_zeros_keep_the_dtype_and_bfloat16_travels_as_its_bits() -> None:
    a, kind = zeros((2, 3), "int64")
    assert a.dtype == np.int64 and a.shape == (2, 3) and kind is None and not a.any()
    b, kind = zeros((4,), "bfloat16")
    assert b.dtype == np.uint16 and kind == "bfloat16"


def batches(r: int) -> int:
    return 2 + 2 * r  # rank r has 2 + 2r batches: rank 0 joins first, the last rank last


def value(r: int, step: int, n: int = 5) -> np.ndarray:
    return (np.arange(n, dtype=np.float64) + 10 * r + step).astype(np.float32)


def reference(w: int, step: int, op: str) -> np.ndarray:
    """What rank r's allreduce of ``value(r, step)`` gives at ``step``, zeros from joined ranks."""
    parts = [value(r, step) if step < batches(r) else np.zeros(5, np.float32) for r in range(w)]
    stack = np.stack(parts)
    if op == "mean":
        return stack.sum(0) / w  # divided by the whole group, as Horovod's Average
    return {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0)}[op]


@pytest.mark.parametrize("w", [2, 3, 4])
def test_uneven_batches_reduce_gather_and_broadcast_with_the_joined_ranks(w: int) -> None:
    gs = groups(w)

    def body(r: int) -> tuple[list[tuple[str, list[float]]], int]:
        g, seen = gs[r], []
        for step in range(batches(r)):
            for op in ("sum", "mean", "max"):
                seen.append((op, g.allreduce(value(r, step), op=op).tolist()))
            seen.append(("async", g.allreduce_async(value(r, step), op="sum").wait().tolist()))
            seen.append(("gather", g.allgather(np.full((1 + r, 2), step, np.int32)).ravel().tolist()))
            root = w - 1  # the last rank never joins before the others
            seen.append(("bcast", g.broadcast(np.full(3, r, np.float64), root=root).tolist()))
        return seen, g.join()

    out = run_ranks(w, body)
    assert [last for _, last in out] == [w - 1] * w
    for r, (seen, _) in enumerate(out):
        it = iter(seen)
        for step in range(batches(r)):
            for op in ("sum", "mean", "max"):
                assert next(it) == (op, pytest.approx(reference(w, step, op).tolist(), rel=1e-6))
            assert next(it) == ("async", reference(w, step, "sum").tolist())
            rows = [np.full((1 + q, 2), step, np.int32) for q in range(w) if step < batches(q)]
            assert next(it) == ("gather", np.concatenate(rows).ravel().tolist())
            assert next(it) == ("bcast", [float(w - 1)] * 3)


@pytest.mark.parametrize("w", [2, 3])
def test_the_group_goes_on_after_a_join_with_unnamed_operations_matched(w: int) -> None:
    gs = groups(w)

    def body(r: int) -> tuple[int, list[float], int]:
        g = gs[r]
        for _ in range(batches(r)):
            g.allreduce(np.ones(2, np.float32))  # unnamed: rank 0 names fewer before joining
        first = g.join()
        after = g.allreduce(np.full(2, r, np.float32)).tolist()  # named alike on every rank again
        g.barrier()
        return first, after, g.join()

    out = run_ranks(w, body)
    total = float(sum(range(w)))
    assert [o[:2] for o in out] == [(w - 1, [total, total])] * w
    assert len({o[2] for o in out}) == 1  # the second join: one answer on every rank


def test_a_broadcast_from_a_joined_root_fails_on_every_rank_and_join_says_so() -> None:
    gs = groups(3)

    def body(r: int) -> tuple[str, int | str]:
        g = gs[r]
        if r == 0:
            try:
                return "", g.join()
            except CollectiveMismatch as exc:
                return "", f"join: {exc}"
        try:
            g.broadcast(np.ones(2, np.float32), root=0)
            err = ""
        except CollectiveMismatch as exc:
            err = str(exc)
        ok = g.allreduce(np.ones(2, np.float32)).tolist()  # the group goes on, rank 0 standing in
        assert ok == [2.0, 2.0]
        return err, g.join()

    out = run_ranks(3, body)
    why = "collective broadcast 'noname.0': its root, rank 0, has joined (hvd.join)"
    assert out[0][1] == f"join: {why} and sends nothing; it fails on every rank"
    for r in (1, 2):
        assert out[r][0].startswith(why)
        assert out[r][1] in (1, 2)


def test_one_rank_joins_at_once() -> None:
    assert groups(1)[0].join() == 0


def test_a_group_with_an_nccl_path_refuses_join_saying_why() -> None:
    g = groups(1)[0]
    g.nccl = SimpleNamespace(close=lambda: None)  # type: ignore[assignment]
    with pytest.raises(NotImplementedError, match=r"NCCL path is not supported.*use_nccl=False"):
        g.join()


def test_reduce_scatter_barrier_and_bfloat16_with_a_joined_rank() -> None:
    gs = groups(3)
    bits = f32_to_bf16(np, np.array([1.0, 2.0, 3.0, 4.0], np.float32))

    def body(r: int) -> tuple[list[float], list[float], int]:
        g = gs[r]
        if r == 0:
            return [], [], g.join()
        mine = g.reduce_scatter(np.arange(6, dtype=np.int64).reshape(3, 2) * r).ravel().tolist()
        g.barrier()
        half = bf16_to_f32(np, g.allreduce(bits, kind="bfloat16")).tolist()
        return mine, half, g.join()

    out = run_ranks(3, body)
    total = np.arange(6).reshape(3, 2) * 3  # ranks 1 and 2; rank 0 gave zeros
    assert out[1][0] == total[1].tolist() and out[2][0] == total[2].tolist()
    assert out[1][1] == out[2][1] == [2.0, 4.0, 6.0, 8.0]
    assert {o[2] for o in out} in ({1}, {2})
