"""Horovod's API of trainer_core.torch with several ranks in one process (each rank a thread with
its own ``Runtime`` over an in-process collective group): Horovod's signatures, reductions with
numpy references, the operations' gradients, objects without pickle, ``SyncBatchNorm`` against
one process's ``BatchNorm``, and what is refused clearly."""

from __future__ import annotations

import inspect
import json
import pickle
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

import trainer_core.torch as hvd  # noqa: E402
from trainer_core.collective import Group  # noqa: E402
from trainer_core.collective.fabric import Fabric, run_ranks  # noqa: E402
from trainer_core.torch import basics, objects  # noqa: E402
from trainer_core.torch.backend import Collective, Solo  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402

W = 3


def on_ranks(w: int, fn: Callable[[int, Runtime], Any], hosts: Sequence[str] | None = None) -> list[Any]:
    """``fn(rank, runtime)`` on ``w`` threads linked by an in-process fabric."""
    fabric = Fabric(w, timeout=30)

    def body(r: int) -> Any:
        rt = Runtime()
        rt.attach(Collective(Group(fabric.endpoint(r), hosts=hosts)))
        try:
            return fn(r, rt)
        finally:
            rt.shutdown()

    return run_ranks(w, body, timeout=60)


def solo() -> Runtime:
    rt = Runtime()
    rt.attach(Solo())
    return rt


_SEEDED = threading.Lock()


# -- the three 'wrong' items ------------------------------------------------------------------------
def test_broadcast_optimizer_state_carries_tuples_such_as_adams_betas() -> None:
    def run(r: int, rt: Runtime) -> dict[str, Any]:
        with _SEEDED:
            torch.manual_seed(r)
            m = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(
            m.parameters(), lr=0.01 * (r + 1), betas=(0.5 + 0.1 * r, 0.9 + 0.01 * r), maximize=r == 1
        )
        hvd.broadcast_optimizer_state(opt, root_rank=1, runtime=rt)
        return opt.param_groups[0]

    for group in on_ranks(W, run):
        assert group["betas"] == (0.6, 0.91) and isinstance(group["betas"], tuple)
        assert group["lr"] == pytest.approx(0.02) and group["maximize"] is True


def test_broadcast_optimizer_state_takes_horovods_model_argument() -> None:
    emb = torch.nn.Embedding(5, 2, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(opt, 0, model=emb, runtime=solo())
    assert emb.weight.grad is None


def test_a_frozen_integer_parameter_is_not_exchanged() -> None:
    """Horovod exchanges the parameters that require a gradient: a frozen int64 parameter (and a
    frozen float one, whose gradient stays None) is left alone."""

    def run(r: int, rt: Runtime) -> tuple[torch.Tensor, Any]:
        with _SEEDED:
            torch.manual_seed(0)
            m = torch.nn.Linear(4, 2)
        m.register_parameter("steps", torch.nn.Parameter(torch.tensor([7]), requires_grad=False))
        m.register_parameter("frozen", torch.nn.Parameter(torch.ones(2), requires_grad=False))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=0.5), m.named_parameters(), runtime=rt
        )
        m(torch.full((1, 4), float(r))).sum().backward()
        opt.step()
        return m.weight.detach().clone(), (m.steps.item(), m.frozen.grad, m.frozen.detach().clone())

    got = on_ranks(W, run)
    for weight, (steps, frozen_grad, frozen) in got:
        assert torch.equal(weight, got[0][0])
        assert steps == 7 and frozen_grad is None and torch.equal(frozen, torch.ones(2))


def test_step_after_synchronize_warns_as_horovod() -> None:
    m = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=solo())
    m(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


# -- Horovod's signatures ---------------------------------------------------------------------------
HOROVOD_SIGNATURES = {  # horovod/torch's parameters, in order (trainer_core adds keyword-only ones)
    "allreduce": "tensor average name compression op prescale_factor postscale_factor process_set",
    "allreduce_async": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_async_": "tensor average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce": "tensors average name compression op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async": "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_": "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async_": "tensors average name op prescale_factor postscale_factor process_set",
    "sparse_allreduce_async": "tensor name op process_set",
    "allgather": "tensor name process_set",
    "allgather_async": "tensor name process_set",
    "grouped_allgather": "tensors name process_set",
    "grouped_allgather_async": "tensors name process_set",
    "broadcast": "tensor root_rank name process_set",
    "broadcast_async": "tensor root_rank name process_set",
    "broadcast_": "tensor root_rank name process_set",
    "broadcast_async_": "tensor root_rank name process_set",
    "alltoall": "tensor splits name process_set",
    "alltoall_async": "tensor splits name process_set",
    "reducescatter": "tensor name compression op process_set prescale_factor postscale_factor",
    "reducescatter_async": "tensor name op process_set prescale_factor postscale_factor",
    "grouped_reducescatter": "tensors name compression op process_set prescale_factor postscale_factor",
    "grouped_reducescatter_async": "tensors name op process_set prescale_factor postscale_factor",
    "join": "device",
    "barrier": "process_set",
    "init": "comm process_sets",
    "broadcast_parameters": "params root_rank",
    "broadcast_optimizer_state": "optimizer root_rank model",
    "broadcast_object": "obj root_rank name process_set",
    "allgather_object": "obj name process_set",
    "DistributedOptimizer": "optimizer named_parameters compression backward_passes_per_step op "
    "gradient_predivide_factor num_groups groups sparse_as_dense process_set",
    "SyncBatchNorm": "num_features eps momentum affine track_running_stats",
    "start_timeline": "file_path mark_cycles",
}


@pytest.mark.parametrize("name", sorted(HOROVOD_SIGNATURES))
def test_horovods_signatures(name: str) -> None:
    params = inspect.signature(getattr(hvd, name)).parameters.values()
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    if name == "SyncBatchNorm":
        positional = positional[1:] if positional and positional[0] == "self" else positional
    assert positional == HOROVOD_SIGNATURES[name].split()


HOROVOD_NAMES = [
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "HorovodInternalError",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "is_homogeneous",
    "allreduce",
    "allreduce_async",
    "allreduce_",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "broadcast_",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "barrier",
    "poll",
    "synchronize",
    "Compression",
    "DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "SyncBatchNorm",
]


def test_every_horovod_torch_name_exists() -> None:
    missing = [n for n in HOROVOD_NAMES if not hasattr(hvd, n)]
    assert not missing


def test_allreduce_async_takes_op_fourth_as_horovod() -> None:
    def run(r: int, rt: Runtime) -> torch.Tensor:
        return hvd.synchronize(hvd.allreduce_async(torch.tensor([float(r)]), None, "x", hvd.Sum, runtime=rt))

    assert all(t.item() == 3.0 for t in on_ranks(W, run))


# -- reductions against numpy ----------------------------------------------------------------------
def rank_values(r: int, dtype: Any) -> torch.Tensor:
    base = np.array([7, -5, 3, 12, -1, 0], dtype=np.int64) * (r + 1) + r
    return torch.from_numpy(base).to(dtype)


INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_average_of_integers_truncates_the_scaled_sum(dtype: Any) -> None:
    """Horovod: Average is the sum times postscale/size in float64, truncated toward zero."""

    def run(r: int, rt: Runtime) -> dict[str, torch.Tensor]:
        t = rank_values(r, dtype)
        return {
            "avg": hvd.allreduce(t, runtime=rt),
            "scaled": hvd.allreduce(t, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0, runtime=rt),
            "prod": hvd.allreduce(t, op=hvd.Product, runtime=rt),
        }

    every = np.stack([rank_values(r, dtype).numpy() for r in range(W)])
    avg = np.trunc(every.sum(0, dtype=every.dtype).astype(np.float64) * (1.0 / W))  # sums wrap
    wide = every.astype(np.float64)
    pre = np.trunc(wide * 0.5).astype(every.dtype)
    scaled = np.trunc(pre.sum(0, dtype=every.dtype).astype(np.float64) * (3.0 / W))
    prod = every[0] * every[1] * every[2]
    for got in on_ranks(W, run):
        assert got["avg"].dtype == dtype
        np.testing.assert_array_equal(got["avg"].numpy(), avg.astype(every.dtype))
        np.testing.assert_array_equal(got["scaled"].numpy(), scaled.astype(every.dtype))
        np.testing.assert_array_equal(got["prod"].numpy(), prod)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_floats_with_scale_factors_and_product(dtype: Any) -> None:
    def run(r: int, rt: Runtime) -> list[torch.Tensor]:
        t = rank_values(r, torch.float64).to(dtype) / 4
        h = hvd.allreduce_async(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, runtime=rt)
        out = [hvd.synchronize(h)]
        out.append(hvd.allreduce(t, op=hvd.Product, runtime=rt))
        out.append(hvd.allreduce(t, op=hvd.Min, runtime=rt))
        inplace = t.clone()
        hvd.allreduce_(inplace, op=hvd.Max, runtime=rt)
        return [*out, inplace]

    every = torch.stack([rank_values(r, torch.float64).to(dtype) / 4 for r in range(W)])
    total = (every.double() * 2).sum(0) * 0.25
    prod = every.double().prod(0)
    for got in on_ranks(W, run):
        assert all(t.dtype == dtype for t in got)
        torch.testing.assert_close(got[0].double(), total, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got[1].double(), prod, rtol=2e-2, atol=1e-2)
        assert torch.equal(got[2], every.min(0).values) and torch.equal(got[3], every.max(0).values)


def test_grouped_operations_in_order() -> None:
    def run(r: int, rt: Runtime) -> dict[str, Any]:
        a, b = torch.full((2,), float(r)), torch.full((3, 2), r + 1, dtype=torch.int32)
        h = hvd.grouped_allreduce_async([a, b], op=hvd.Sum, runtime=rt)
        inplace = [a.clone(), b.clone()]
        hvd.grouped_allreduce_(inplace, op=hvd.Max, runtime=rt)
        return {
            "sum": hvd.synchronize(h),
            "avg": hvd.grouped_allreduce([a, a * 2], runtime=rt),
            "max": inplace,
            "gather": hvd.grouped_allgather([a[: r + 1], b], runtime=rt),
            "rs": hvd.grouped_reducescatter([torch.arange(6.0) * (r + 1)], op=hvd.Sum, runtime=rt),
        }

    for r, got in enumerate(on_ranks(W, run)):
        assert torch.equal(got["sum"][0], torch.full((2,), 3.0)) and torch.equal(
            got["sum"][1], torch.full((3, 2), 6, dtype=torch.int32)
        )
        assert torch.equal(got["avg"][1], torch.full((2,), 2.0))
        assert torch.equal(got["max"][1], torch.full((3, 2), 3, dtype=torch.int32))
        assert got["gather"][0].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0] and got["gather"][1].shape == (9, 2)
        assert got["rs"][0].tolist() == (torch.arange(6.0) * 6)[2 * r : 2 * r + 2].tolist()


def test_reducescatter_splits_rows_as_horovod() -> None:
    """5 rows over 3 ranks: 2, 2, 1 (the first ``rows % size`` ranks get one more); Average by default."""

    def run(r: int, rt: Runtime) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(10.0).reshape(5, 2) * (r + 1)
        h = hvd.reducescatter_async(t, op=hvd.Sum, runtime=rt)
        return hvd.reducescatter(t, runtime=rt), hvd.synchronize(h)

    total = torch.arange(10.0).reshape(5, 2) * 6
    blocks = [total[0:2], total[2:4], total[4:5]]
    for r, (avg, summed) in enumerate(on_ranks(W, run)):
        assert torch.equal(summed, blocks[r]) and torch.equal(avg, blocks[r] / 3)


def test_alltoall_with_and_without_splits() -> None:
    def run(r: int, rt: Runtime) -> dict[str, Any]:
        splits = [r, 1, 2]  # rank r sends r rows to rank 0, 1 to rank 1, 2 to rank 2
        t = torch.arange(sum(splits), dtype=torch.float32) + 10 * r
        out, received = hvd.alltoall(t, splits=torch.tensor(splits, dtype=torch.int64), runtime=rt)
        even = hvd.alltoall(torch.full((3, 2), r), runtime=rt)
        o2, rec2 = hvd.synchronize(hvd.alltoall_async(t, splits, runtime=rt))
        return {"out": out, "received": received, "even": even, "async": (o2, rec2)}

    got = on_ranks(W, run)
    assert got[0]["out"].tolist() == [10.0, 20.0, 21.0]
    assert got[0]["received"].tolist() == [0, 1, 2] and got[0]["received"].dtype == torch.int64
    assert got[1]["out"].tolist() == [0.0, 11.0, 22.0]
    assert got[2]["out"].tolist() == [1.0, 2.0, 12.0, 13.0, 23.0, 24.0]
    assert got[2]["async"][1].dtype == torch.int32 and got[2]["async"][0].tolist() == got[2]["out"].tolist()
    assert got[1]["even"].tolist() == [[0, 0], [1, 1], [2, 2]]


def test_sparse_allreduce_async_sums_coo_tensors() -> None:
    def run(r: int, rt: Runtime) -> torch.Tensor:
        t = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([[1.0, 2.0]]), (4, 2))
        return hvd.sparse_allreduce_async(t, "emb", hvd.Sum, runtime=rt)().to_dense()

    for dense in on_ranks(W, run):
        assert dense.tolist() == [[1.0, 2.0]] * 3 + [[0.0, 0.0]]


# -- gradients ---------------------------------------------------------------------------------------
def test_gradients_through_each_operation() -> None:
    def run(r: int, rt: Runtime) -> dict[str, torch.Tensor]:
        w = float(r + 1)  # each rank's loss weight
        x = torch.full((2,), float(r), requires_grad=True)
        (hvd.allreduce(x, op=hvd.Sum, runtime=rt) * w).sum().backward()
        out = {"allreduce": x.grad.clone()}
        x.grad = None
        (hvd.broadcast(x, 1, runtime=rt) * w).sum().backward()
        out["broadcast"] = x.grad.clone()
        x.grad = None
        rows = torch.ones(r + 1, 2, requires_grad=True)
        g = hvd.allgather(rows, runtime=rt)
        (g * torch.arange(g.shape[0], dtype=torch.float32)[:, None] * w).sum().backward()
        out["allgather"] = rows.grad.clone()
        y = torch.ones(4, requires_grad=True)
        o, _ = hvd.alltoall(y, splits=[1, 1, 2] if r == 0 else [2, 1, 1], runtime=rt)
        (o * torch.arange(o.shape[0], dtype=torch.float32)).sum().backward()
        out["alltoall"] = y.grad.clone()
        z = torch.ones(3, 2, requires_grad=True)
        (hvd.reducescatter(z, op=hvd.Sum, runtime=rt) * w).sum().backward()
        out["reducescatter"] = z.grad.clone()
        return out

    got = on_ranks(W, run)
    mean_w = (1 + 2 + 3) / W
    for r, g in enumerate(got):
        assert torch.equal(g["allreduce"], torch.full((2,), 6.0))  # the allreduce-sum of the weights
        # broadcast: the average of the gradients on the root, zeros elsewhere (Horovod's)
        assert torch.equal(g["broadcast"], torch.full((2,), mean_w if r == 1 else 0.0))
        start = [0, 1, 3][r]
        want = torch.arange(start, start + r + 1, dtype=torch.float32)[:, None].expand(r + 1, 2) * mean_w
        torch.testing.assert_close(g["allgather"], want)
        # reducescatter Sum: Horovod's gradient is the allgather of the gradients times the size
        torch.testing.assert_close(
            g["reducescatter"], torch.tensor([1.0, 2.0, 3.0])[:, None].expand(3, 2) * W
        )
    # alltoall: each row's gradient is its position among the rows its receiver got
    assert got[0]["alltoall"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert got[1]["alltoall"].tolist() == [1.0, 2.0, 1.0, 2.0]
    assert got[2]["alltoall"].tolist() == [3.0, 4.0, 2.0, 3.0]


# -- job layout, build, refusals --------------------------------------------------------------------
def test_cross_rank_and_homogeneity_from_the_hosts() -> None:
    assert basics.cross_of(("a", "a", "b"), 1) == (0, 1)
    assert basics.cross_of(("a", "a", "b"), 2) == (1, 2)
    assert not basics.homogeneous(("a", "a", "b")) and basics.homogeneous(("a", "b", "a", "b"))

    def run(r: int, rt: Runtime) -> tuple[int, int, bool]:
        b = rt.backend()
        hosts = basics.hosts_of(b)
        return (*basics.cross_of(hosts, b.rank), basics.homogeneous(hosts))

    assert on_ranks(W, run, hosts=["a", "a", "b"]) == [(0, 2, False), (0, 1, False), (1, 2, False)]


def test_build_queries_are_truthful() -> None:
    assert not any(
        f()
        for f in (
            hvd.mpi_built,
            hvd.mpi_enabled,
            hvd.gloo_built,
            hvd.gloo_enabled,
            hvd.ddl_built,
            hvd.ccl_built,
        )
    )
    from trainer_core.collective import nccl
    from trainer_core.xp import cupy_module

    assert hvd.nccl_built() == (nccl.load() is not None)
    assert hvd.cuda_built() == (cupy_module() is not None and not hvd.rocm_built())


def test_refusals_name_what_is_not_supported() -> None:
    rt = solo()
    with pytest.raises(ValueError, match=r"timeline records the collectives' operations.*path is 'solo'"):
        hvd.start_timeline("/tmp/t.json", runtime=rt)
    with pytest.raises(ValueError, match=r"op=Adasum reduces floating-point tensors, not torch\.int64"):
        hvd.allreduce(torch.ones(2, dtype=torch.int64), op=hvd.Adasum, runtime=rt)
    assert hvd.allreduce(torch.tensor([1.0, -2.0]), op=hvd.Adasum, runtime=rt).tolist() == [1.0, -2.0]
    with pytest.raises(ValueError, match="add_process_set after init needs dynamic process sets"):
        hvd.add_process_set([0])
    with pytest.raises(TypeError, match="path='ps'"):
        hvd.init(comm="ps")
    assert hvd.join(runtime=rt) == 0


def test_a_failed_group_is_horovods_internal_error() -> None:
    fabric = Fabric(2, timeout=0.5)
    rt = Runtime()
    rt.attach(Collective(Group(fabric.endpoint(0))))
    try:
        with pytest.raises(hvd.HorovodInternalError):
            hvd.allreduce(torch.ones(2), runtime=rt)  # rank 1 never comes
    finally:
        rt.shutdown()


# -- objects -----------------------------------------------------------------------------------------
class Custom:
    pass


def test_objects_round_trip_without_pickle() -> None:
    obj = {
        "n": None,
        "t": (True, 3, -(2**70), 1.5, float("inf"), 2j, "s", b"b", bytearray(b"m")),
        1: [torch.arange(4, dtype=torch.bfloat16).reshape(2, 2), torch.tensor(3)],
        "np": [np.arange(3, dtype=np.float16), np.int32(4), np.bool_(True)],
        "od": OrderedDict(a=frozenset({1, 2}), b={3}),
        "meta": (torch.float16, torch.Size([2, 3])),
    }
    back = objects.decode(objects.encode(obj))
    assert back["n"] is None and back["t"] == obj["t"] and type(back["t"][8]) is bytearray
    assert (
        torch.equal(back[1][0], obj[1][0]) and back[1][0].dtype == torch.bfloat16 and back[1][1].shape == ()
    )
    assert back["np"][0].dtype == np.float16 and np.array_equal(back["np"][0], obj["np"][0])
    assert isinstance(back["np"][1], np.int32) and back["np"][1] == 4
    assert type(back["od"]) is OrderedDict and back["od"] == obj["od"] and back["meta"] == obj["meta"]
    with pytest.raises(ValueError, match="not trainer_core's object encoding"):
        objects.decode(pickle.dumps({"a": 1}))


def test_broadcast_and_allgather_objects() -> None:
    def run(r: int, rt: Runtime) -> dict[str, Any]:
        out: dict[str, Any] = {"b": hvd.broadcast_object({"rank": r, "w": torch.ones(r + 1)}, 2, runtime=rt)}
        out["g"] = hvd.allgather_object(("r", r), runtime=rt)
        try:
            hvd.broadcast_object(Custom() if r == 0 else None, 0, runtime=rt)
        except (TypeError, ValueError) as e:
            out["err"] = (type(e).__name__, str(e))
        return out

    for r, got in enumerate(on_ranks(W, run)):
        assert got["b"]["rank"] == 2 and torch.equal(got["b"]["w"], torch.ones(3))
        assert got["g"] == [("r", 0), ("r", 1), ("r", 2)]
        kind, msg = got["err"]
        if r == 0:
            assert kind == "TypeError" and "Custom" in msg and "nothing is pickled" in msg
        else:
            assert kind == "ValueError" and "rank 0" in msg


# -- SyncBatchNorm -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5, 2)])
def test_sync_batch_norm_equals_batch_norm_on_the_concatenated_batch(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(shape, generator=g, dtype=torch.float64) * (r + 1) + r for r in range(W)]
    gouts = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(W)]

    def run(r: int, rt: Runtime) -> dict[str, torch.Tensor]:
        bn = hvd.SyncBatchNorm(3, momentum=0.3, runtime=rt).double()
        x = xs[r].clone().requires_grad_(True)
        out = bn(x)
        out.backward(gouts[r])
        return {
            "out": out.detach(),
            "dx": x.grad,
            "dw": bn.weight.grad,
            "rm": bn.running_mean,
            "rv": bn.running_var,
        }

    ref = (
        torch.nn.BatchNorm1d(3, momentum=0.3).double()
        if len(shape) == 2
        else torch.nn.BatchNorm2d(3, momentum=0.3).double()
    )
    x = torch.cat(xs).requires_grad_(True)
    out = ref(x)
    out.backward(torch.cat(gouts))
    n = shape[0]
    got = on_ranks(W, run)
    for r, g_ in enumerate(got):
        torch.testing.assert_close(g_["out"], out.detach()[r * n : (r + 1) * n])
        torch.testing.assert_close(g_["dx"], x.grad[r * n : (r + 1) * n])
        torch.testing.assert_close(g_["rm"], ref.running_mean)
        torch.testing.assert_close(g_["rv"], ref.running_var)
    # each rank's weight gradient is its own part; their sum is the one process's
    torch.testing.assert_close(sum(g_["dw"] for g_ in got), ref.weight.grad)


def test_sync_batch_norm_alone_is_batch_norm() -> None:
    bn = hvd.SyncBatchNorm(2, runtime=solo())
    x = torch.randn(5, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(
            bn(x), torch.nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True)
        )


def test_the_docs_table_names_every_horovod_name_with_a_status() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pytorch.md").read_text()
    section = doc.split("## The API: every `horovod.torch` name", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) > 30
    for row in rows:
        status = row.rsplit(" | ", 1)[1]
        assert status.startswith(("same", "differs:", "not supported")), row
    named = " ".join(row.split(" | ", 1)[0] for row in rows)
    missing = [n for n in HOROVOD_NAMES if f"`{n}" not in named and f" {n}," not in named]
    assert not missing, missing


# -- DistributedOptimizer's Horovod parameters -------------------------------------------------------
def test_gradient_predivide_factor_gives_the_same_mean() -> None:
    """Horovod's: 1/f before the sum, f/size after: the averaged gradient is unchanged."""

    def run(r: int, rt: Runtime, f: float) -> torch.Tensor:
        with _SEEDED:
            torch.manual_seed(0)
            m = torch.nn.Linear(3, 2)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.5),
            m.named_parameters(),
            gradient_predivide_factor=f,
            runtime=rt,
        )
        m(torch.full((2, 3), float(r + 1))).pow(2).sum().backward()
        opt.step()
        return m.weight.detach().clone()

    plain = on_ranks(W, lambda r, rt: run(r, rt, 1.0))
    split = on_ranks(W, lambda r, rt: run(r, rt, 4.0))
    for a, b in zip(plain, split, strict=True):
        torch.testing.assert_close(a, b)
    m = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="op != Average"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), op=hvd.Sum, gradient_predivide_factor=2.0, runtime=solo()
        )


def test_horovods_optimizer_attributes_and_groups_checks() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with pytest.warns(DeprecationWarning, match="num_groups"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), num_groups=2, runtime=solo())
    assert (
        opt.op == hvd.Average and opt.gradient_predivide_factor == 1.0 and opt.backward_passes_per_step == 1
    )
    assert opt.sparse_as_dense is False and opt.process_set is None and opt._groups == 2
    assert sorted(opt._parameter_names.values())[0] == "allreduce.noname.0.0"
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    w = m[0].weight
    with pytest.raises(ValueError, match="only appear once"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), groups=[[w], [w]], runtime=solo())
    with pytest.raises(
        ValueError, match="path \\('solo'\\): this process runs alone, and its only set is the global"
    ):
        hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), process_set=hvd.ProcessSet([0, 1]), runtime=solo()
        )


def test_grouped_results_are_lists_or_tuples_as_horovods() -> None:
    rt, ts = solo(), [torch.ones(2), torch.zeros(1)]
    assert type(hvd.grouped_allreduce(ts, runtime=rt)) is list
    assert type(hvd.grouped_allreduce_(ts, runtime=rt)) is tuple
    assert type(hvd.synchronize(hvd.grouped_allreduce_async(ts, runtime=rt))) is tuple
    assert type(hvd.grouped_allgather(ts, runtime=rt)) is tuple
    assert type(hvd.grouped_reducescatter(ts, runtime=rt)) is list


def test_horovod_timeline_variable_is_said_to_be_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_TIMELINE", "/tmp/timeline.json")
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    try:
        with pytest.warns(UserWarning, match="HOROVOD_TIMELINE.*ignored"):
            hvd.init()
    finally:
        hvd.shutdown()


def test_the_adasum_optimizer_alone_takes_the_plain_step() -> None:
    rt = solo()
    torch.manual_seed(1)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.1), op=hvd.Adasum, runtime=rt)
    plain = torch.optim.SGD(b.parameters(), lr=0.1)
    x = torch.arange(6.0).reshape(2, 3)
    for model, o in ((a, opt), (b, plain)):
        model(x).pow(2).sum().backward()
        o.step()
    assert isinstance(opt, torch.optim.SGD)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):  # start + (new - start): rounding
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    with opt.skip_synchronize():
        opt.synchronize()


def test_a_synchronous_allgather_goes_by_its_name(tmp_path: Any) -> None:
    """``allgather(name=...)`` matches by its name as the other operations do (it ran unnamed):
    the timeline's row is the name."""
    path = str(tmp_path / "t.json")

    def run(r: int, rt: Runtime) -> list[float]:
        hvd.start_timeline(path, runtime=rt)
        got = hvd.allgather(torch.tensor([float(r)]), name="rows", runtime=rt).tolist()
        hvd.stop_timeline(runtime=rt)
        return got

    assert on_ranks(2, run) == [[0.0, 1.0]] * 2
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"rows"}
