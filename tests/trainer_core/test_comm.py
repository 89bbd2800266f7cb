"""Communicator: rank, size, main, the worker table (hostnames exchanged through the store)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer_core.test_learners import FakeKV, run_workers
from trainer_core import kv as kvstore
from trainer_core.optim.local import get_learner
from trainer_core.train.comm import KVCommunicator as Communicator
from trainer_core.train.comm import WorkerDescriptor, decode_host, encode_host, local_host_id
from trainer_core.train.learners import data_parallel_distributed_learner


def test_single_process_communicator() -> None:
    kv = kvstore.create("local")
    comm = Communicator(kv, host_id="alpha")
    assert (comm.rank(), comm.num_workers(), comm.is_main()) == (0, 1, True)
    assert comm.workers() == [WorkerDescriptor(0, "alpha")]
    assert comm.current_worker().global_rank == 0
    comm.barrier()
    comm.finalize()
    comm.finalize()  # idempotent


def test_workers_table_is_gathered_from_every_rank() -> None:
    hosts = ["node-a", "node-b", "node-a", "nöde-ç"]

    def worker(kv: FakeKV) -> tuple[list[WorkerDescriptor], WorkerDescriptor, bool, bool]:
        comm = Communicator(kv, host_id=hosts[kv.rank])
        comm.finalize()
        return comm.workers(), comm.current_worker(), comm.is_main(), kv.closed

    for rank, (workers, me, main, closed) in enumerate(run_workers(4, worker)):
        assert [(w.global_rank, w.host_id) for w in workers] == list(enumerate(hosts))
        assert me == WorkerDescriptor(rank, hosts[rank])
        assert main == (rank == 0)
        assert closed


def test_host_encoding_round_trip_and_truncation() -> None:
    assert decode_host(encode_host("gpu-17.example.org")) == "gpu-17.example.org"
    assert len(decode_host(encode_host("x" * 1000))) == 256
    assert encode_host("a").dtype == np.float32


def test_local_host_id_prefers_the_launcher_variable() -> None:
    assert local_host_id({"DMLC_NODE_HOST": "10.0.0.7"}) == "10.0.0.7"
    assert local_host_id({})


@pytest.mark.parametrize("n", [1, 3])
def test_learner_communicator(n: int) -> None:
    def worker(kv: FakeKV) -> tuple[int, int]:
        params = {"w": np.zeros(3)}
        dl = data_parallel_distributed_learner(get_learner("sgd", params, lr=0.1), kv=kv)
        comm = dl.communicator()
        assert dl.communicator() is comm
        return comm.rank(), comm.num_workers()

    assert run_workers(n, worker) == [(r, n) for r in range(n)]
