"""The NCCL path (``collective.nccl``) on numpy arrays, with a stand-in for cupy's NCCL calls that
does what NCCL does through the raw pointers, counts, type and op numbers it is given, so the
path's pointer and count arithmetic, its NCCL types and ops, and its choices are tested here;
NCCL itself runs only where a GPU is lent (docs/collectives.md)."""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Any

import numpy as np
import pytest

from trainer_core.collective import BFLOAT16, Group, bf16_to_f32, f32_to_bf16, spec_for
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.nccl import ID_BYTES, NCCL_TYPES, NcclPath, agree, nccl_names, shared_devices
from trainer_core.collective.primitives.links import Ctx

TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", BFLOAT16]
DTYPE_OF = {i: (np.dtype(np.uint16) if t == BFLOAT16 else np.dtype(t)) for i, t in enumerate(TYPES)}


class FakeNccl:
    """cupy.cuda.nccl's calls, on host memory addressed by pointer, for ranks that are threads."""

    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3

    def __init__(self, size: int) -> None:
        for i, t in enumerate(TYPES):
            setattr(self, NCCL_TYPES[t], i)
        self.size = size
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots: list[Any] = [None] * size
        self.calls: list[tuple[int, str, int]] = []  # (rank, call, count)
        self.made = 0
        self._lock = threading.Lock()
        outer = self

        class NcclCommunicator:
            def __init__(self, size: int, uid: tuple[int, ...], rank: int) -> None:
                assert size == outer.size and len(uid) == ID_BYTES and uid == outer.uid
                self.rank = rank
                with outer._lock:
                    outer.made += 1
                outer.barrier.wait()  # making a communicator is a collective

            def allReduce(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None:
                outer.reduce(self.rank, "allReduce", send, recv, count, dtype, op, None)

            def reduceScatter(
                self, send: int, recv: int, count: int, dtype: int, op: int, stream: int
            ) -> None:
                outer.reduce(self.rank, "reduceScatter", send, recv, count, dtype, op, count)

            def bcast(self, buf: int, count: int, dtype: int, root: int, stream: int) -> None:
                outer.exchange(self.rank, "bcast", buf, count, dtype, root)

            def allGather(self, send: int, recv: int, count: int, dtype: int, stream: int) -> None:
                outer.gather(self.rank, send, recv, count, dtype)

            def destroy(self) -> None:
                pass

        self.NcclCommunicator = NcclCommunicator
        self.uid = tuple(range(-64, 64))

    def get_unique_id(self) -> tuple[int, ...]:
        return self.uid

    def groupStart(self) -> None:
        pass

    def groupEnd(self) -> None:
        pass

    @staticmethod
    def memory(ptr: int, count: int, dtype: int) -> np.ndarray:
        dt = DTYPE_OF[dtype]
        raw = (ctypes.c_uint8 * (count * dt.itemsize)).from_address(ptr)
        return np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8).view(dt)

    def _all(self, rank: int, mine: Any) -> list[Any]:
        self.slots[rank] = mine
        self.barrier.wait()
        everyone = list(self.slots)
        self.barrier.wait()
        return everyone

    def reduce(
        self, rank: int, call: str, send: int, recv: int, count: int, dtype: int, op: int, block: int | None
    ) -> None:
        self.calls.append((rank, call, count))
        n = count * self.size if block is not None else count
        inputs = [x.copy() for x in self._all(rank, self.memory(send, n, dtype))]
        fn = {self.NCCL_SUM: np.add, self.NCCL_MAX: np.maximum, self.NCCL_MIN: np.minimum}[op]
        if TYPES[dtype] == BFLOAT16:
            total = f32_to_bf16(np, functools.reduce(fn, [bf16_to_f32(np, x) for x in inputs]))
        else:
            total = functools.reduce(fn, inputs)
        out = total if block is None else total[rank * block : (rank + 1) * block]
        self.barrier.wait()  # every rank has read its inputs before any writes (in place)
        self.memory(recv, count, dtype)[...] = out

    def exchange(self, rank: int, call: str, buf: int, count: int, dtype: int, root: int) -> None:
        self.calls.append((rank, call, count))
        data = [x.copy() for x in self._all(rank, self.memory(buf, count, dtype))]
        self.memory(buf, count, dtype)[...] = data[root]

    def gather(self, rank: int, send: int, recv: int, count: int, dtype: int) -> None:
        self.calls.append((rank, "allGather", count))
        data = [x.copy() for x in self._all(rank, self.memory(send, count, dtype))]
        self.barrier.wait()
        self.memory(recv, count * self.size, dtype)[...] = np.concatenate(data)


def paths(w: int) -> tuple[FakeNccl, list[NcclPath]]:
    nccl = FakeNccl(w)
    return nccl, [NcclPath(nccl, r, w, nccl.uid, accepts=lambda a: True) for r in range(w)]


def on_ranks(w: int, body: Any) -> list[Any]:
    fabric = Fabric(w, timeout=10)
    return run_ranks(w, lambda r: body(r, Ctx.for_op(fabric.endpoint(r), 1)))


def make(kind: str, n: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng(rank * 7 + n)
    if kind == BFLOAT16:
        return f32_to_bf16(np, rng.standard_normal(n).astype(np.float32))
    dt = np.dtype(kind)
    if dt.kind in "iu":
        return rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, n, dtype=dt, endpoint=True)
    return rng.standard_normal(n).astype(dt)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_allreduce_passes_nccls_type_op_and_count_and_equals_the_host_path(kind: str, op: str) -> None:
    if op == "mean" and kind not in ("float16", "float32", "float64", BFLOAT16):
        pytest.skip("mean of integers is refused (spec_for)")
    w, n = 3, 1001
    inputs = [make(kind, n, r).reshape(7, 143) for r in range(w)]
    spec = spec_for(inputs[0].dtype, op, BFLOAT16 if kind == BFLOAT16 else None)
    nccl, ps = paths(w)
    got = on_ranks(w, lambda r, ctx: ps[r].allreduce(inputs[r], spec)(ctx))
    fabric = Fabric(w, timeout=10)

    def host(r: int) -> np.ndarray:
        with Group(fabric.endpoint(r)) as g:
            return g.allreduce(inputs[r], op, kind=BFLOAT16 if kind == BFLOAT16 else None)

    want = run_ranks(w, host)
    for r in range(w):
        assert got[r].shape == (7, 143) and got[r].dtype == inputs[r].dtype
        assert got[r].tobytes() == got[0].tobytes()
        if kind in ("int8", "uint8", "int32", "uint32", "int64", "uint64") or op in ("max", "min"):
            assert got[r].tobytes() == want[r].tobytes()
        else:  # NCCL's order of additions is its own: equal to float tolerance
            a, b = (bf16_to_f32(np, x) if kind == BFLOAT16 else x for x in (got[r], want[r]))
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=2e-2, atol=2e-2)
    assert sorted(nccl.calls) == [(r, "allReduce", n) for r in range(w)]
    assert nccl.made == w  # one communicator per rank, made at the first operation
    assert all(inputs[r].tobytes() == make(kind, n, r).tobytes() for r in range(w))  # untouched


def test_int16_and_uint16_have_no_nccl_type_and_stay_on_the_host_path() -> None:
    for dt in ("int16", "uint16"):
        assert nccl_names(spec_for(dt, "sum")) is None
        assert not NcclPath(FakeNccl(2), 0, 2, (), accepts=lambda a: True).takes(
            np.zeros(3, dt), spec_for(dt, "sum")
        )
    assert nccl_names(spec_for("uint16", "max", BFLOAT16)) == ("NCCL_BFLOAT16", "NCCL_MAX")


def test_allreduce_into_out_and_of_size_zero() -> None:
    w = 2
    _, ps = paths(w)
    outs = [np.full(5, -1.0, np.float32) for _ in range(w)]
    spec = spec_for(np.float32, "sum")
    got = on_ranks(
        w, lambda r, ctx: ps[r].allreduce(np.arange(5, dtype=np.float32) * (r + 1), spec, outs[r])(ctx)
    )
    assert all(g is o for g, o in zip(got, outs, strict=True))
    assert outs[0].tolist() == outs[1].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    empty = on_ranks(w, lambda r, ctx: ps[r].allreduce(np.zeros(0, np.float32), spec)(ctx))
    assert [e.shape for e in empty] == [(0,), (0,)]


@pytest.mark.parametrize("root", [0, 2])
def test_broadcast_sends_the_roots_bytes_of_any_dtype(root: int) -> None:
    w = 3
    nccl, ps = paths(w)
    inputs = [np.arange(6, dtype=np.int16).reshape(2, 3) + 100 * r for r in range(w)]
    got = on_ranks(w, lambda r, ctx: ps[r].broadcast(inputs[r], root)(ctx))
    assert all(g.tolist() == inputs[root].tolist() and g.dtype == np.int16 for g in got)
    assert {c for _, c, _ in nccl.calls} == {"bcast"} and {n for _, _, n in nccl.calls} == {12}  # bytes


@pytest.mark.parametrize("rows", [[2, 2, 2], [3, 0, 1], [1]])
def test_allgather_equal_and_ragged_first_axis(rows: list[int]) -> None:
    w = len(rows)
    nccl, ps = paths(w)
    inputs = [np.full((n, 2), r, dtype=np.float64) for r, n in enumerate(rows)]
    got = on_ranks(w, lambda r, ctx: ps[r].allgather(inputs[r])(ctx))
    want = np.concatenate(inputs)
    assert all(g.shape == want.shape and g.tobytes() == want.tobytes() for g in got)
    calls = {c for _, c, _ in nccl.calls}
    assert calls == ({"allGather"} if len(set(rows)) == 1 else {"bcast"})


@pytest.mark.parametrize("rows", [6, 7])
def test_reduce_scatter_keeps_this_ranks_rows_as_array_split_does(rows: int) -> None:
    w = 3
    nccl, ps = paths(w)
    inputs = [np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) * (r + 1) for r in range(w)]
    spec = spec_for(np.int64, "sum")
    got = on_ranks(w, lambda r, ctx: ps[r].reduce_scatter(inputs[r], spec)(ctx))
    total = sum(inputs)
    for r, part in enumerate(np.array_split(total, w)):
        assert got[r].tolist() == part.tolist()
    assert {c for _, c, _ in nccl.calls} == ({"reduceScatter"} if rows % w == 0 else {"allReduce"})


def test_grouped_allreduce_reduces_each_bucket_in_one_call() -> None:
    w = 2
    nccl, ps = paths(w)
    arrays = [[np.full(s, r + 1.0, np.float32) for s in ((3,), (2, 2), (5,))] for r in range(w)]
    specs = [spec_for(np.float32, "mean")] * 3
    got = on_ranks(w, lambda r, ctx: ps[r].grouped_allreduce(arrays[r], specs, [[0, 1], [2]])(ctx))
    for res in got:
        assert [x.shape for x in res] == [(3,), (2, 2), (5,)]
        assert all(np.all(x == 1.5) for x in res)
    assert sorted(n for r, _, n in nccl.calls if r == 0) == [5, 7]


def test_agree_uses_nccl_only_when_every_rank_can() -> None:
    w = 3
    nccl = FakeNccl(w)
    fabric = Fabric(w, timeout=10)

    def join(r: int, can: bool) -> NcclPath | None:
        with Group(fabric.endpoint(r)) as g:  # each rank on a GPU of its own (a real GPU here is one)
            return agree(g, nccl if can else None, where=(1, r + 1))

    all_can = run_ranks(w, lambda r: join(r, True))
    assert all(p is not None and p.uid == nccl.uid and p.rank == r for r, p in enumerate(all_can))
    fabric = Fabric(w, timeout=10)
    one_cannot = run_ranks(w, lambda r: join(r, r != 1))
    assert one_cannot == [None, None, None]


class BytesIdNccl(FakeNccl):
    """cupy 14's binding: ``get_unique_id`` gives the id's bytes and the communicator takes bytes
    (a tuple is refused with a TypeError, as cupy's typed argument does)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        made_by_tuple = self.NcclCommunicator
        self.raw = bytes(b & 0xFF for b in self.uid)
        outer = self

        def communicator(size: int, uid: bytes, rank: int) -> Any:
            if not isinstance(uid, bytes):
                raise TypeError(
                    f"Argument 'commId' has incorrect type (expected bytes, got {type(uid).__name__})"
                )
            assert uid == outer.raw
            return made_by_tuple(size, outer.uid, rank)

        self.NcclCommunicator = communicator  # type: ignore[assignment]

    def get_unique_id(self) -> bytes:  # type: ignore[override]
        return self.raw


def test_agree_and_the_communicator_take_cupy_14s_bytes_ids() -> None:
    w = 2
    nccl = BytesIdNccl(w)
    fabric = Fabric(w, timeout=10)

    def join(r: int) -> Any:
        with Group(fabric.endpoint(r)) as g:
            path = agree(g, nccl, where=(1, r + 1))
        assert path is not None and path.uid == nccl.uid  # signed values, as before cupy 14
        return path.comm()

    run_ranks(w, join)
    assert nccl.made == w


def test_agree_takes_the_host_path_where_two_ranks_share_one_gpu(caplog) -> None:
    """NCCL refuses two ranks on one GPU (ncclInvalidUsage, "Duplicate GPU detected", at the first
    device operation): such a job (two workers on a one-GPU machine) reduces through host memory."""
    w = 3
    nccl = FakeNccl(w)

    def join(places: list[tuple[int, int]]) -> list[NcclPath | None]:
        fabric = Fabric(w, timeout=10)

        def one(r: int) -> NcclPath | None:
            with Group(fabric.endpoint(r)) as g:
                return agree(g, nccl, where=places[r], log=logging.getLogger("test.nccl"))

        return run_ranks(w, one)

    caplog.set_level(logging.WARNING, "test.nccl")
    assert join([(7, 1), (7, 1), (8, 1)]) == [None, None, None]  # ranks 0 and 1: host 7's GPU 1
    assert "ranks 0 and 1 share one GPU" in caplog.text
    spread = join([(7, 1), (7, 2), (8, 1)])  # host 8's GPU 1 is another GPU
    assert all(isinstance(p, NcclPath) for p in spread)
    assert shared_devices([(7, 0), (7, 0)]) == []  # GPU unknown (no cupy): never counted as shared
    assert shared_devices([(1, 5), (2, 5), (1, 5), (1, 6)]) == [0, 2]


def test_a_group_with_an_nccl_path_sends_what_nccl_takes_through_it_and_the_rest_through_the_host() -> None:
    w = 2
    nccl, ps = paths(w)
    fabric = Fabric(w, timeout=10)

    def body(r: int) -> list[Any]:
        with Group(fabric.endpoint(r), nccl=ps[r]) as g:
            got = [
                g.allreduce(np.full(4, r + 1, np.float32)),
                g.grouped_allreduce([np.ones(3, np.float64), np.ones(2, np.float64)], op="mean"),
                g.broadcast(np.full(2, r, np.int64), root=1),
                g.allgather(np.full(r + 1, r, np.int32)),
                g.reduce_scatter(np.ones((4, 1), np.int32)),
                g.allreduce(np.ones(3, np.int16)),  # no NCCL type: the host path
            ]
            g.barrier()
            return got

    res = run_ranks(w, body)
    for r in range(w):
        a, grouped, b, gathered, rs, i16 = res[r]
        assert a.tolist() == [3.0] * 4 and [x.tolist() for x in grouped] == [[1.0] * 3, [1.0] * 2]
        assert b.tolist() == [1, 1] and gathered.tolist() == [0, 1, 1] and rs.tolist() == [[2], [2]]
        assert i16.tolist() == [2, 2, 2]
    calls = [c for rank, c, _ in nccl.calls if rank == 0]
    assert calls == ["allReduce", "allReduce", "bcast", "bcast", "bcast", "reduceScatter"]
    assert nccl.made == w
