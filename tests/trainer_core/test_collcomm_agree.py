"""Job-wide settings agreed on the collective communicator (``train.collcomm``, ``-s 0`` jobs), as
the KV communicator agrees them at the scheduler: a setting that differs across workers is an
error on every worker naming each value and its workers, and the group stays usable. Before, a
learner with 1-bit quantization on one worker and 32-bit on another was not caught as such here
(the communicator had no ``agree``): the first step failed as allreduces of different kinds."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.trainer_core.cluster import run_job
from tests.trainer_core.test_collcomm import on_groups
from trainer_core.collective import CollectiveMismatch, Group
from trainer_core.train.collcomm import CollectiveCommunicator


def test_agree_returns_the_setting_every_rank_gave() -> None:
    def fn(group: Group) -> object:
        comm = CollectiveCommunicator(group, host_id="h")
        given = None if group.rank == 2 else {"type": "2bit", "threshold": 0.5}  # None: takes the others'
        return comm.agree("set_compression()", given)

    assert on_groups(3, fn) == [{"threshold": 0.5, "type": "2bit"}] * 3


@pytest.mark.parametrize("w", [2, 3])
def test_a_setting_that_differs_is_an_error_on_every_rank_naming_each_value(w: int) -> None:
    def fn(group: Group) -> tuple[str, float]:
        comm = CollectiveCommunicator(group, host_id="h")
        try:
            comm.agree("the compression", {"type": "1bit"} if group.rank == 0 else {"type": "none"})
            err = ""
        except CollectiveMismatch as exc:
            err = str(exc)
        return err, float(group.allreduce(np.ones(2))[0])  # the group goes on

    others = "worker 1" if w == 2 else "workers 1, 2"
    for err, total in on_groups(w, fn):
        assert err == (
            'the compression: the workers gave different settings, worker 0: {"type":"1bit"}; '
            f'{others}: {{"type":"none"}} (every worker must give the same; it is a setting of the whole job)'
        )
        assert total == w


def test_ranks_in_different_calls_are_told_who_is_where() -> None:
    def fn(group: Group) -> str:
        comm = CollectiveCommunicator(group, host_id="h")
        with pytest.raises(CollectiveMismatch) as err:
            comm.agree("set_optimizer()" if group.rank else "set_compression()", 1)
        return str(err.value)

    for err in on_groups(2, fn):
        assert "worker 0 in set_compression(); worker 1 in set_optimizer()" in err, err


def test_a_value_that_is_not_plain_data_is_refused_on_that_rank() -> None:
    comm = CollectiveCommunicator.__new__(CollectiveCommunicator)
    with pytest.raises(TypeError, match="plain data"):
        comm.agree("x", object())


LEARNER = """
import json, time
import numpy as np
from trainer_core.collective import join
from trainer_core.optim.local import get_learner
from trainer_core.train.collcomm import CollectiveCommunicator
from trainer_core.train.learners import data_parallel_distributed_learner
g = join()
comm = CollectiveCommunicator(g)
bits = 1 if g.rank == 0 else %(others)d
params = {'w': np.zeros(16, np.float32)}
started = time.monotonic()
try:  # (the learner agrees as it starts: at once, with distributed_after=0)
    learner = get_learner('sgd', params, lr=0.1)
    dl = data_parallel_distributed_learner(learner, num_quantization_bits=bits, communicator=comm)
    dl.update({'w': np.ones(16, np.float32)}, 1)
    out = {"error": None}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
out.update(rank=g.rank, seconds=time.monotonic() - started, next=float(g.allreduce(np.ones(3))[0]))
print("RESULT " + json.dumps(out), flush=True)
g.close()
"""


@pytest.mark.parametrize(("workers", "others", "said"), [(2, 32, '{"type":"none"}'), (3, 2, '"type":"2bit"')])
def test_a_learner_with_1_bit_on_one_worker_and_another_on_the_others_is_an_error_on_every_worker(
    workers: int, others: int, said: str
) -> None:
    """1 bit against 32 and against 2 bits: named as the learner starts, before any step (before,
    the first step's allreduces failed as different operations or ops, not naming the setting)."""
    started = time.monotonic()
    job = run_job(LEARNER % {"others": others}, workers, 0, timeout=60)
    for p in job.workers:
        assert p.popen.returncode == 0, job.outputs()
        (res,) = p.results()
        err = res["error"] or ""
        assert err.startswith(
            "CollectiveMismatch: the distributed learner's compression: the workers gave different"
        ), job.outputs()
        assert 'worker 0: {"type":"1bit"}' in err and said in err, err
        assert res["seconds"] < 2.0 and res["next"] == workers, res
    assert time.monotonic() - started < 50
