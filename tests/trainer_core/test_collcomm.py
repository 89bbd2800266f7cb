"""The collective ``Communicator`` (``train.collcomm``) on in-process fabric links: CNTK's worker
table, the learners on it equal to the same learners over a KV store, compressed aggregation with
error feedback; and the module-level collective API (``collective.group()`` and the functions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.test_learners import FakeKV, run_workers
from trainer_core import collective
from trainer_core.collective import Group
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.optim.local import get_learner
from trainer_core.train.collcomm import CollectiveCommunicator
from trainer_core.train.comm import WorkerDescriptor
from trainer_core.train.learners import (
    async_sgd_distributed_learner,
    block_momentum_distributed_learner,
    data_parallel_distributed_learner,
    model_averaging_distributed_learner,
)


def on_groups(n: int, fn: Callable[[Group], Any]) -> list[Any]:
    """``fn(group)`` on ``n`` threads, each rank's group over one in-process fabric."""
    fabric = Fabric(n, timeout=20)

    def body(rank: int) -> Any:
        with Group(fabric.endpoint(rank)) as group:
            return fn(group)

    return run_ranks(n, body)


def params_of(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rank)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3)}


def grads_of(rank: int, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 * step + rank)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3)}


def test_worker_table_rank_size_barrier() -> None:
    hosts = ["node-a", "node-b", "nöde-ç"]

    def fn(group: Group) -> tuple[list[WorkerDescriptor], WorkerDescriptor, int, int, bool]:
        comm = CollectiveCommunicator(group, host_id=hosts[group.rank])
        comm.barrier()
        return comm.workers(), comm.current_worker(), comm.rank(), comm.num_workers(), comm.is_main()

    for rank, (workers, me, r, n, main) in enumerate(on_groups(3, fn)):
        assert [(w.global_rank, w.host_id) for w in workers] == list(enumerate(hosts))
        assert (me, r, n, main) == (WorkerDescriptor(rank, hosts[rank]), rank, 3, rank == 0)


def train(make: Callable[..., Any], steps: int, rank: int, **comm: Any) -> dict[str, np.ndarray]:
    params = params_of(rank)
    dl = make(get_learner("momentum", params, lr=0.1, momentum=0.9), **comm)
    for step in range(steps):
        dl.update(grads_of(rank, step), 4)
    dl.flush()
    return {k: v.copy() for k, v in params.items()}


LEARNERS: dict[str, Callable[..., Any]] = {
    "data_parallel": lambda local, **c: data_parallel_distributed_learner(local, **c),
    "block_momentum": lambda local, **c: block_momentum_distributed_learner(local, 24, **c),
    "model_averaging": lambda local, **c: model_averaging_distributed_learner(local, 8, **c),
    "warm_started": lambda local, **c: block_momentum_distributed_learner(
        local, 24, distributed_after=8, **c
    ),
}


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_learners_over_allreduce_equal_the_kv_store(name: str) -> None:
    make = LEARNERS[name]
    over_kv = run_workers(3, lambda kv: train(make, 7, kv.rank, kv=kv))
    over_ar = on_groups(3, lambda g: train(make, 7, g.rank, communicator=CollectiveCommunicator(g)))
    for rank in range(3):
        for k in over_kv[rank]:
            np.testing.assert_allclose(over_ar[rank][k], over_kv[rank][k], rtol=1e-5, atol=1e-6)
            assert np.array_equal(over_ar[rank][k], over_ar[0][k])  # every rank bit-identical
            assert over_ar[rank][k].dtype == params_of(0)[k].dtype


@pytest.mark.parametrize("bits", [1, 2])
def test_compressed_aggregate_keeps_error_feedback(bits: int) -> None:
    """Constant gradients: with error feedback the running mean of the compressed aggregates
    (2 bits: a threshold above the largest mean, which a step cannot exceed)
    tends to the true mean (what a step loses is carried to the next), on every rank alike."""
    steps = 60
    true = np.mean([grads_of(r, 0)["w"] for r in range(3)], axis=0)

    def fn(group: Group) -> tuple[np.ndarray, int]:
        params = params_of(group.rank)
        comm = CollectiveCommunicator(group)
        dl = data_parallel_distributed_learner(
            get_learner("sgd", params, lr=1.0), num_quantization_bits=bits, threshold=2.0, communicator=comm
        )
        start = params["w"].copy()
        for _ in range(steps):
            dl.update(grads_of(group.rank, 0), 4)
        assert comm.feedback is not None
        return (start - params["w"]) / steps, len(comm.feedback.keys)

    results = on_groups(3, fn)
    for mean, keys in results:
        assert np.array_equal(mean, results[0][0]) and keys == 2
        assert np.max(np.abs(mean - true)) < 0.1 * np.max(np.abs(true)), (mean, true)


def test_async_learner_refuses_the_collective_path() -> None:
    def fn(group: Group) -> None:
        comm = CollectiveCommunicator(group)
        with pytest.raises(ValueError, match="KV store"):
            async_sgd_distributed_learner(get_learner("sgd", params_of(0), lr=0.1), kv=comm)
        # communicator= as the other learners take it: refused for what it is, not a TypeError
        with pytest.raises(
            ValueError, match=r"needs a KV store \(kv=, or a KVCommunicator\), not a Collective"
        ):
            async_sgd_distributed_learner(get_learner("sgd", params_of(0), lr=0.1), communicator=comm)

    on_groups(1, fn)


def test_a_learner_takes_kv_or_communicator_not_both() -> None:
    def fn(kv: FakeKV) -> None:
        with pytest.raises(ValueError, match=r"either kv= .* or communicator="):
            data_parallel_distributed_learner(get_learner("sgd", params_of(0), lr=0.1))

    run_workers(1, fn)


def test_module_functions_run_on_the_default_group_or_the_given_one() -> None:
    def fn(group: Group) -> list[Any]:
        x = np.arange(5, dtype=np.float64) + group.rank
        return [
            collective.allreduce(x, group=group),
            collective.allreduce_async(x, op="max", group=group).wait(),
            collective.broadcast(x, 1, group=group),
            collective.allgather(x[: group.rank + 1], group=group),
            collective.reduce_scatter(x, group=group),
            collective.barrier(group=group),
        ]

    results = on_groups(2, fn)
    base = np.arange(5, dtype=np.float64)
    for rank, (total, top, root, rows, mine, _) in enumerate(results):
        np.testing.assert_array_equal(total, 2 * base + 1)
        np.testing.assert_array_equal(top, base + 1)
        np.testing.assert_array_equal(root, base + 1)
        np.testing.assert_array_equal(rows, [0, 1, 2])
        np.testing.assert_array_equal(mine, np.array_split(2 * base + 1, 2)[rank])


def test_default_group_is_made_on_first_use_closed_and_made_again() -> None:
    fabric = Fabric(1, timeout=5)
    made: list[Group] = []

    def factory() -> Group:
        made.append(Group(fabric.endpoint(0)))
        return made[-1]

    holder = collective.DefaultGroup(factory)
    assert holder.get() is holder.get() and len(made) == 1
    np.testing.assert_array_equal(holder.get().allreduce(np.ones(3)), np.ones(3))
    holder.close()
    with pytest.raises(collective.CollectiveClosed):
        made[0].allreduce(np.ones(3))
    assert holder.get() is made[1]
    other = Group(fabric.endpoint(0))
    assert holder.set(other) is made[1]
    assert holder.get() is other
    holder.close()
    made[1].close()
    assert collective.default is not holder  # the process's own holder is untouched
