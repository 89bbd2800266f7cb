"""Horovod's elastic API in process (trainer_core.torch.elastic, .elastic_sampler): the sampler's
dealing across a change of the workers, a state's save/restore/sync, and ``run``'s loop on a
lost worker (restore) and on added ones (keep), over one-rank runtimes that stand for a rank of a
job of any size."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

import trainer_core.torch as hvd  # noqa: E402
from trainer_core.torch.backend import Solo  # noqa: E402
from trainer_core.torch.elastic import HostsUpdatedInterrupt, TorchState, run  # noqa: E402
from trainer_core.torch.elastic_sampler import ElasticSampler  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402


class Rank(Solo):
    """One rank of a job of ``size`` (the sampler reads only rank and size)."""

    def __init__(self, rank: int, size: int, waiting: bool = False) -> None:
        self.rank, self.size, self._waiting = rank, size, waiting

    def workers_waiting(self) -> bool:
        return self._waiting


def runtime(backend: Solo) -> Runtime:
    rt = Runtime()
    rt.attach(backend)
    return rt


def samplers(n: int, size: int, **kw: Any) -> list[ElasticSampler]:
    return [ElasticSampler(range(n), runtime=runtime(Rank(r, size)), **kw) for r in range(size)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_resized_from_four_workers_to_three_neither_skips_nor_repeats(shuffle: bool) -> None:
    n = 40
    four = samplers(n, 4, shuffle=shuffle, seed=5)
    assert sorted(i for s in four for i in s) == list(range(n))  # 40 over 4: no padding
    assert all(len(s) == 10 for s in four)
    done: list[int] = []
    for b in range(2):  # two lockstep steps of 3 per worker
        for s in four:
            done += s.get_indices(b, 3)
            s.record_batch(b, 3)
    assert len(set(done)) == 24 and {s.processed_num for s in four} == {24}
    three = samplers(n, 3, shuffle=shuffle, seed=5)  # worker 3 left: what TorchState.sync does
    for s in three:
        s.load_state_dict(four[0].state_dict())
    rest = [i for s in three for i in s]
    assert set(rest) == set(range(n)) - set(done)  # whichever worker left
    assert len(rest) == 18 and len(set(rest)) == 16  # 16 left over 3 workers: 2 padded repeats
    assert all(len(s) == 6 for s in three)


def test_the_order_is_the_same_on_every_worker_and_changes_with_the_epoch() -> None:
    a, b = samplers(12, 2, seed=1)
    first = a.remaining_indices
    assert first == b.remaining_indices and sorted(first) == list(range(12))
    a.record_batch(0, 2)
    a.set_epoch(1)
    assert a.processed_num == 0
    assert a.remaining_indices != first and sorted(a.remaining_indices) == list(range(12))
    assert samplers(5, 8, shuffle=False)[7].indices == [2]  # fewer indices than workers: around again


def model_state(**extra: Any) -> tuple[TorchState, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    return TorchState(model, opt, runtime=runtime(Solo()), **extra), model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()


def test_a_failure_restores_the_last_commit_and_the_function_runs_again() -> None:
    state, model, opt = model_state(epoch=0, batch=0)
    calls: list[tuple[int, int]] = []
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @run
    def train(state: TorchState) -> str:
        calls.append((state.epoch, state.batch))
        if len(calls) == 1:
            step(model, opt)
            state.batch = 1
            state.commit()
            committed = [p.detach().clone() for p in model.parameters()]
            state.saved_weights = committed
            step(model, opt)
            state.batch = 2
            raise hvd.HorovodInternalError("a worker was lost")
        return "done"

    assert train(state) == "done"
    assert calls == [(0, 0), (0, 1)] and resets == [1]
    for p, q in zip(model.parameters(), state.saved_weights, strict=True):
        assert torch.equal(p, q)  # the second step was undone
    assert opt.state_dict()["state"][0]["momentum_buffer"] is not None
    assert state._runtime.backend().comm == "solo"  # left and joined again


def test_added_workers_interrupt_at_the_next_commit_and_keep_the_values() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    rt = runtime(Rank(0, 1, waiting=True))
    state = TorchState(model, None, runtime=rt, batch=0)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    calls: list[int] = []

    @run
    def train(state: TorchState) -> int:
        calls.append(state.batch)
        state.batch += 1
        if len(calls) == 1:
            state.commit()  # raises: workers are waiting
        return state.batch

    assert train(state) == 2  # the value reached before the interrupt is kept
    assert calls == [0, 1]


def test_a_state_refuses_what_broadcast_object_cannot_carry() -> None:
    state, _, _ = model_state(thing=object())
    with pytest.raises(TypeError):
        state.sync()
