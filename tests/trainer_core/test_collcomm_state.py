"""Checkpoints of the collective path (``CollectiveCommunicator.compression_state`` and the worker
files of ``train.checkpoint``) on in-process fabric links: every worker's compressed allreduce
residuals and local learner state come back equal to what was saved, and a job resumed from the
checkpoint continues bit for bit as the uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.test_collcomm import grads_of, on_groups, params_of
from trainer_core.collective import Group
from trainer_core.optim.local import get_learner
from trainer_core.train import checkpoint
from trainer_core.train.collcomm import CollectiveCommunicator
from trainer_core.train.learners import data_parallel_distributed_learner, model_averaging_distributed_learner

WORKERS = 3
COMPRESSION = {"1bit": {"type": "1bit"}, "2bit": {"type": "2bit", "threshold": 0.5}, "topk": {"type": "topk", "ratio": 0.3}}  # fmt: skip


def make(name: str, comm: CollectiveCommunicator, params: dict[str, np.ndarray], compression: str) -> Any:
    local = get_learner("momentum", params, lr=0.05, momentum=0.9)
    if name == "model_averaging":  # keeps each worker's own momentum (no reset)
        return model_averaging_distributed_learner(
            local, 8, communicator=comm, compression=COMPRESSION[compression]
        )
    return data_parallel_distributed_learner(local, communicator=comm, compression=COMPRESSION[compression])


def snapshot(state: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A copy of a local learner's state (its arrays change in place as it trains)."""
    return {
        p: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()} for p, s in state.items()
    }


def train(dl: Any, rank: int, steps: range) -> None:
    for step in steps:
        dl.update(grads_of(rank, step), 4)
    dl.flush()


def save(
    path: Path, comm: CollectiveCommunicator, dl: Any, params: dict[str, Any], step: int
) -> dict[str, Any]:
    """The example's order: the other workers' files, a barrier, rank 0's checkpoint, a barrier."""
    residuals = comm.compression_state()
    if comm.rank() != 0:
        checkpoint.save_worker(path, comm.rank(), residuals, step=step, learner=dl)
    comm.barrier()
    if comm.rank() == 0:
        checkpoint.save(path, params=params, learner=dl, residuals=residuals, step=step, compression={})
    comm.barrier()
    return residuals


def resume(
    path: Path, comm: CollectiveCommunicator, params: dict[str, Any], name: str, compression: str
) -> Any:
    ck = checkpoint.load(path)
    checkpoint.restore_params(params, ck)
    dl = make(name, comm, params, compression)
    checkpoint.restore_learner(dl, ck)
    mine = ck
    if comm.rank() != 0:
        mine = checkpoint.load_worker_state(path, comm.rank(), step=ck.step)
        checkpoint.restore_local_learner(dl, mine)
    comm.load_compression_state(mine.residuals)
    return dl


def same_state(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert sorted(a[key]) == sorted(b[key]), key
        for name in a[key]:
            assert np.asarray(a[key][name]).dtype == np.asarray(b[key][name]).dtype
            assert np.array_equal(a[key][name], b[key][name]), (key, name)


@pytest.mark.parametrize("compression", sorted(COMPRESSION))
@pytest.mark.parametrize("name", ["data_parallel", "model_averaging"])
def test_resumed_job_restores_every_workers_state_and_continues_bit_for_bit(
    tmp_path: Path, name: str, compression: str
) -> None:
    path = tmp_path / "ck.npz"

    def straight(group: Group) -> dict[str, np.ndarray]:
        params = params_of(group.rank)
        dl = make(name, CollectiveCommunicator(group), params, compression)
        train(dl, group.rank, range(0, 10))
        train(dl, group.rank, range(10, 20))
        return params

    def first(group: Group) -> tuple[dict[str, Any], dict[str, Any]]:
        params = params_of(group.rank)
        comm = CollectiveCommunicator(group)
        dl = make(name, comm, params, compression)
        train(dl, group.rank, range(0, 10))
        saved = save(path, comm, dl, params, 10)
        return saved, snapshot(dl.learner.state)

    def second(group: Group) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
        params = params_of(group.rank + 7)  # anything: the checkpoint overwrites it
        comm = CollectiveCommunicator(group)
        dl = resume(path, comm, params, name, compression)
        restored = comm.compression_state(), snapshot(dl.learner.state)
        train(dl, group.rank, range(10, 20))
        return (*restored, params)

    expected = on_groups(WORKERS, straight)
    saved = on_groups(WORKERS, first)
    resumed = on_groups(WORKERS, second)
    for rank in range(WORKERS):
        residuals, local = saved[rank]
        assert residuals and all("residual" in s for s in residuals.values())
        same_state(resumed[rank][0], residuals)  # every worker's own residuals, not rank 0's
        same_state(resumed[rank][1], local)  # and its own momentum
        for k, v in expected[rank].items():
            assert np.array_equal(resumed[rank][2][k], v), (rank, k)
    if name == "model_averaging":  # the workers' momenta differ: one rank's file would not do
        assert not np.array_equal(saved[1][1]["w"]["mom"], saved[0][1]["w"]["mom"])
    assert not np.array_equal(saved[1][0]["w/worker0"]["residual"], saved[0][0]["w/worker0"]["residual"])


def test_compression_state_names_each_chunks_residual_and_refuses_another_shape() -> None:
    def fn(group: Group) -> None:
        comm = CollectiveCommunicator(group)
        assert comm.compression_state() == {}
        comm.set_compression({"type": "1bit"})
        out = [np.empty(7, np.float32)]
        comm.aggregate(["k"], [np.arange(7, dtype=np.float32) / 3], out)
        state = comm.compression_state()
        assert sorted(state) == ["k/server", "k/worker0", "k/worker1"]
        with pytest.raises(ValueError, match=r"'k/worker5': no such part in a job of 2 workers"):
            comm.load_compression_state({"k/worker5": state["k/worker0"]})
        plain = CollectiveCommunicator(group)
        with pytest.raises(ValueError, match="does not compress"):
            plain.load_compression_state(state)

    on_groups(2, fn)


def test_worker_file_keeps_the_step_before_with_its_local_state(tmp_path: Path) -> None:
    """A job killed after a worker wrote step N but before rank 0 wrote step N resumes from N - 1:
    the worker file still holds N - 1's residuals and local learner state."""
    path = tmp_path / "ck.npz"
    params = params_of(1)
    local = get_learner("momentum", params, lr=0.05, momentum=0.9)
    states = []
    for step in (1, 2):
        local.update(grads_of(1, step))
        states.append(({"w/worker0": {"residual": np.full(3, step, np.float32)}}, snapshot(local.state)))
        checkpoint.save_worker(path, 1, states[-1][0], step=step, learner=local)
    for step, (residuals, state) in zip((1, 2), states, strict=True):
        ws = checkpoint.load_worker_state(path, 1, step=step)
        same_state(ws.residuals, residuals)
        same_state(ws.local, state)
        assert ws.local_steps == step and ws.learner_name == "momentum"
    with pytest.raises(ValueError, match="is of steps 1 and 2, the checkpoint of step 0"):
        checkpoint.load_worker_state(path, 1, step=0)
    with pytest.raises(ValueError, match=r"worker 2's state of checkpoint .* is missing"):
        checkpoint.load_worker_state(path, 2, step=2)
