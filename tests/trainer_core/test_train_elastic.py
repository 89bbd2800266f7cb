"""``train.elastic``: the learners' state in an elastic job (commit, rank 0's commit on every rank
through a collective communicator, in-process fabric groups) and ``run``'s retries around a
change of the workers (a fake group and reform)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.trainer_core.test_collcomm import on_groups
from trainer_core.collective import Group, LinkError
from trainer_core.errors import MembershipChanged
from trainer_core.optim.local import get_learner
from trainer_core.train.collcomm import CollectiveCommunicator
from trainer_core.train.elastic import LearnerState, load, rejoin, run, snapshot
from trainer_core.train.learners import (
    block_momentum_distributed_learner,
    data_parallel_distributed_learner,
)


def params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }


def grads(seed: int) -> dict[str, np.ndarray]:
    return params(1000 + seed)


def bmuf(comm: Any, p: dict[str, np.ndarray], optimizer: str = "momentum") -> Any:
    kw = {"momentum": 0.9} if optimizer == "momentum" else {}
    local = get_learner(optimizer, p, lr=0.05, **kw)
    return block_momentum_distributed_learner(local, 2 * comm.num_workers(), communicator=comm)


def everything(learner: Any) -> dict[str, Any]:
    """The learner's whole state as plain values, to compare two learners."""
    c = snapshot(learner, {})
    return {k: np.asarray(v).tolist() for k, v in [*c.arrays.items(), *c.scalars.items()]}


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_commit_loads_into_a_fresh_learner(optimizer: str) -> None:
    """What ``snapshot`` keeps is the whole state: loaded into a learner made afresh, every
    parameter, slot, step count and block state is the committed one."""

    def fn(group: Group) -> tuple[dict[str, Any], dict[str, Any]]:
        comm = CollectiveCommunicator(group)
        learner = bmuf(comm, params(0), optimizer)
        for step in range(3):
            learner.update(grads(10 * step + group.rank), 1)
        commit = snapshot(learner, {"epoch": 2})
        fresh = bmuf(comm, params(7), optimizer)
        load(fresh, commit)
        return everything(learner), everything(fresh)

    for want, got in on_groups(2, fn):
        assert got == want
        assert "dist/smoothed/w" in got and "local_steps" in got


def test_sync_gives_every_rank_rank_0s_last_commit() -> None:
    """Rank 0 committed after its steps and then went on (a change not committed); rank 1
    committed its own state and values; rank 2 never committed (as a newcomer). After ``sync``
    on a new communicator every rank holds rank 0's commit: parameters, learner state and
    values; rank 0's change after its commit is undone."""

    def fn(group: Group) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        comm = CollectiveCommunicator(group)
        p = params(group.rank)
        learner = bmuf(comm, p)
        state = LearnerState(epoch=0, processed=0)
        for step in range(3):  # (in lockstep: the block ends are collective)
            learner.update(grads(10 * step + group.rank), 1)
        if group.rank < 2:
            state.values.update(epoch=1 + group.rank, processed=16 * group.rank)
            state.commit(learner)
        want = everything(learner) if group.rank == 0 else {}
        if group.rank == 0:
            p["w"] += 1.0  # after the commit: undone by the sync
            state.values["epoch"] = 9
        again = CollectiveCommunicator(group)
        fresh = bmuf(again, p)  # the learner built again on the group of the new epoch
        state.sync(again, fresh)
        return want, everything(fresh), dict(state.values)

    out = on_groups(3, fn)
    want = out[0][0]
    for _, got, values in out:
        assert got == want
        assert values == {"epoch": 1, "processed": 0}


def test_sync_at_the_start_makes_every_rank_start_alike() -> None:
    """Nobody committed yet (the job's start): every rank takes rank 0's starting state."""

    def fn(group: Group) -> dict[str, Any]:
        comm = CollectiveCommunicator(group)
        local = get_learner("sgd", params(group.rank), lr=0.1)
        learner = data_parallel_distributed_learner(local, communicator=comm)
        state = LearnerState(epoch=group.rank)
        state.sync(comm, learner)
        return {**everything(learner), **state.values}

    out = on_groups(3, fn)
    assert out[0]["epoch"] == 0 and out[0] == out[1] == out[2]


class FakeGroup:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


def test_run_trains_again_on_the_group_of_the_new_epoch() -> None:
    """A change of the workers (``MembershipChanged`` from an operation, or a lost link) sends
    ``run`` to ``reform`` and then to ``train`` with the new group; ``MembershipChanged`` from
    ``reform`` itself (the workers changed again meanwhile) is retried; ``train``'s value is
    ``run``'s; another error is not caught."""
    seen: list[int] = []
    reforms: list[int] = []

    def reform(group: FakeGroup) -> FakeGroup:
        reforms.append(group.epoch)
        if len(reforms) == 2:
            raise MembershipChanged("again", epoch=3, left=("worker 1",))
        return FakeGroup(group.epoch + 1)

    def train(group: FakeGroup) -> str:
        seen.append(group.epoch)
        if group.epoch == 0:
            raise MembershipChanged("worker 2 left", epoch=1, left=("worker 2",))
        if group.epoch == 1:
            raise LinkError("peer gone", 2)
        return f"done at {group.epoch}"

    assert run(train, FakeGroup(0), reform) == "done at 2"
    assert seen == [0, 1, 2] and reforms == [0, 1, 1]

    def broken(group: FakeGroup) -> None:
        raise ValueError("a bug, not a change")

    with pytest.raises(ValueError, match="a bug"):
        run(broken, FakeGroup(0), reform)


def test_rejoin_retries_until_the_group_forms() -> None:
    calls = []

    def reform(group: FakeGroup) -> FakeGroup:
        calls.append(group.epoch)
        if len(calls) < 3:
            raise MembershipChanged("changed again", epoch=len(calls))
        return FakeGroup(5)

    assert rejoin(FakeGroup(1), reform).epoch == 5 and calls == [1, 1, 1]
