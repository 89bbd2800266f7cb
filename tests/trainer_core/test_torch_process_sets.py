"""Horovod's process sets in trainer_core.torch, in process (ranks on threads over an in-memory
fabric): registration at init and after it, every family of operations among a set's ranks with
results equal to numpy's, and the errors Horovod gives (a rank outside the set, a set not
registered, adding without dynamic sets, a path without sets)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

import trainer_core.torch as hvd  # noqa: E402
from tests.trainer_core.adasumref import adasum_reference, adasum_step  # noqa: E402
from tests.trainer_core.torch_hvdjob import adasum_input, adasum_model, values  # noqa: E402
from tests.trainer_core.torchranks import on_ranks  # noqa: E402
from trainer_core.torch.backend import KV  # noqa: E402
from trainer_core.torch.process_sets import register_init_sets  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402


def value(r: int, n: int = 5) -> np.ndarray:
    return np.arange(n, dtype=np.float32) * (r + 1) + r


@pytest.mark.parametrize("w", [3, 4])
def test_every_family_of_operations_runs_among_a_static_sets_ranks(w: int) -> None:
    even, odd = list(range(0, w, 2)), list(range(1, w, 2))

    def run(r: int, rt: Runtime) -> dict[str, Any]:
        sets = [hvd.ProcessSet(even), hvd.ProcessSet(odd)]
        register_init_sets(sets, rt)
        ps = sets[0] if r in even else sets[1]
        members = ps.ranks
        assert members is not None
        t = torch.from_numpy(value(r))
        got: dict[str, Any] = {"ids": [s.process_set_id for s in sets]}
        h = hvd.allreduce_async(t, op=hvd.Sum, process_set=ps, runtime=rt)
        got["whole"] = hvd.allreduce(t, op=hvd.Sum, runtime=rt).tolist()  # alongside the set's
        got["sum"] = hvd.synchronize(h).tolist()
        got["mean"] = hvd.allreduce(t, process_set=ps, runtime=rt).tolist()
        got["grouped"] = [
            x.tolist() for x in hvd.grouped_allreduce([t, t * 2], op=hvd.Max, process_set=ps, runtime=rt)
        ]
        got["gather"] = hvd.allgather(torch.tensor([[r, r]]), process_set=ps, runtime=rt).tolist()
        got["bcast"] = hvd.broadcast(t, members[-1], process_set=ps, runtime=rt).tolist()
        got["a2a"] = hvd.alltoall(torch.arange(len(members)) + 10 * r, process_set=ps, runtime=rt).tolist()
        rows = torch.ones(len(members) * 2, 2) * r
        got["rs"] = hvd.reducescatter(rows, op=hvd.Sum, process_set=ps, runtime=rt).tolist()
        hvd.barrier(process_set=ps, runtime=rt)
        got["obj"] = hvd.broadcast_object({"from": r}, members[0], process_set=ps, runtime=rt)
        got["objs"] = hvd.allgather_object(r, process_set=ps, runtime=rt)
        return got

    out = on_ranks(w, run)
    for r, got in enumerate(out):
        members = even if r in even else odd
        total = sum(value(m) for m in members)
        assert got["ids"] == [1, 2]
        np.testing.assert_allclose(got["whole"], sum(value(m) for m in range(w)))
        np.testing.assert_allclose(got["sum"], total)
        np.testing.assert_allclose(got["mean"], total / len(members), rtol=1e-6)
        np.testing.assert_allclose(got["grouped"][0], np.max([value(m) for m in members], axis=0))
        np.testing.assert_allclose(got["grouped"][1], np.max([2 * value(m) for m in members], axis=0))
        assert got["gather"] == [[m, m] for m in members]
        np.testing.assert_allclose(got["bcast"], value(members[-1]))
        me = members.index(r)
        assert got["a2a"] == [10 * m + me for m in members]
        assert got["rs"] == [[float(sum(members))] * 2] * 2
        assert got["obj"] == {"from": members[0]}
        assert got["objs"] == members


def test_dynamic_sets_are_added_and_removed_and_outsiders_are_refused() -> None:
    def run(r: int, rt: Runtime) -> list[Any]:
        with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS=1"):
            hvd.add_process_set([0, 1], runtime=rt)
        register_init_sets("dynamic", rt)
        ps = hvd.add_process_set([0, 1], runtime=rt)
        other = hvd.add_process_set(hvd.ProcessSet([1, 2]), runtime=rt)
        got: list[Any] = [ps.process_set_id, other.process_set_id]
        t = torch.ones(3) * r
        if r == 2:
            with pytest.raises(ValueError, match="rank 2 is not in process set 1"):
                hvd.allreduce(t, process_set=ps, runtime=rt)
        else:
            got.append(hvd.allreduce(t, op=hvd.Sum, process_set=ps, runtime=rt).tolist())
        why = (
            "rank 0 is not in process set 2" if r == 0 else r"root_rank 0 is not in the process set \[1, 2\]"
        )
        with pytest.raises(ValueError, match=why):
            hvd.broadcast(t, 0, process_set=other, runtime=rt)
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set(ps, runtime=rt)
        assert hvd.remove_process_set(ps, runtime=rt) is True
        assert ps.process_set_id is None
        assert hvd.remove_process_set(hvd.global_process_set, runtime=rt) is False
        with pytest.raises(ValueError, match="is not registered"):
            hvd.allreduce(t, process_set=ps, runtime=rt)
        again = hvd.add_process_set([0, 2], runtime=rt)
        got.append(again.process_set_id)
        if r != 1:
            got.append(hvd.allgather(torch.tensor([r]), process_set=again, runtime=rt).tolist())
        # a set of every rank is the global one
        whole = hvd.allreduce(t, op=hvd.Sum, process_set=hvd.ProcessSet([0, 1, 2]), runtime=rt)
        got.append(whole.tolist())
        return got

    out = on_ranks(3, run)
    assert out[0] == [1, 2, [1.0] * 3, 1, [0, 2], [3.0] * 3]
    assert out[1] == [1, 2, [1.0] * 3, 1, [3.0] * 3]
    assert out[2] == [1, 2, 1, [0, 2], [3.0] * 3]


def test_distributed_optimizer_averages_the_gradients_of_its_sets_ranks() -> None:
    def run(r: int, rt: Runtime) -> list[float]:
        sets = [hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])]
        register_init_sets(sets, rt)
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            named_parameters=model.named_parameters(),
            process_set=sets[r % 2],
            runtime=rt,
        )
        model(torch.tensor([[float(r), 1.0]])).sum().backward()  # gradient: [r, 1]
        opt.step()
        return model.weight.detach().reshape(-1).tolist()

    out = on_ranks(4, run)
    assert out[0] == out[2] == [1.0 - 1.0, 0.0]  # the mean of [0, 1] and [2, 1]
    assert out[1] == out[3] == [1.0 - 2.0, 0.0]  # of [1, 1] and [3, 1]


def test_adasum_runs_among_a_sets_ranks_and_a_size_not_a_power_of_two_is_refused() -> None:
    """Sets [0, 2] and [1, 3] of 4 ranks: Adasum of the set's rows (and the Adasum optimizer's
    step) equals the reference, the same bits on both members; a set of 3 is refused at the call,
    naming it and its size."""

    start = adasum_model().state_dict()  # (made here: the ranks' threads share torch's generator)

    def run(r: int, rt: Runtime) -> tuple[list[float], list[float], list[float]]:
        sets = [hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3]), hvd.ProcessSet([0, 1, 2])]
        register_init_sets(sets, rt)
        x = torch.from_numpy(values(r)).double()
        got = hvd.allreduce(x, op=hvd.Adasum, process_set=sets[r % 2], runtime=rt).tolist()
        whole = hvd.allreduce(x, op=hvd.Adasum, runtime=rt).tolist()
        if r != 3:
            with pytest.raises(ValueError, match=r"power-of-two .*; process set \[0, 1, 2\] has 3"):
                hvd.allreduce(x, op=hvd.Adasum, process_set=sets[2], runtime=rt)
        lin = torch.nn.Linear(3, 2).double()
        lin.load_state_dict(start)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(lin.parameters(), lr=0.1), op=hvd.Adasum, process_set=sets[r % 2], runtime=rt
        )
        lin(torch.from_numpy(adasum_input(r))).pow(2).sum().backward()
        opt.step()
        return got, whole, [x for p in lin.parameters() for x in p.detach().reshape(-1).tolist()]

    out = on_ranks(4, run)
    for r, (got, whole, step) in enumerate(out):
        members = [r % 2, r % 2 + 2]
        want = adasum_reference([values(m).astype(float).tolist() for m in members])
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert got == out[members[0]][0]  # the same bits on every member
        np.testing.assert_allclose(
            whole, adasum_reference([values(m).astype(float).tolist() for m in range(4)])
        )
        np.testing.assert_allclose(step, adasum_step(members), rtol=1e-12)
        assert step == out[members[0]][2]


def test_gradients_flow_through_a_sets_operations() -> None:
    def run(r: int, rt: Runtime) -> list[list[float]]:
        sets = [hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])]
        register_init_sets(sets, rt)
        ps = sets[r % 2]
        x = torch.full((2,), float(r), requires_grad=True)
        (hvd.allreduce(x, op=hvd.Sum, process_set=ps, runtime=rt) * (r + 1)).sum().backward()
        y = torch.full((1,), float(r), requires_grad=True)
        (hvd.allgather(y, process_set=ps, runtime=rt) * torch.tensor([1.0, 3.0])).sum().backward()
        z = torch.ones(1, requires_grad=True)
        (hvd.broadcast(z, 2 + r % 2, process_set=ps, runtime=rt) * (r + 1)).sum().backward()
        assert x.grad is not None and y.grad is not None and z.grad is not None
        return [x.grad.tolist(), y.grad.tolist(), z.grad.tolist()]

    out = on_ranks(4, run)
    # allreduce: the sum over the set of each rank's (r + 1); allgather: the mean of the set's
    # gradients, this rank's row; broadcast: the mean on the root (the set's last rank), else 0
    assert out[0] == [[4.0, 4.0], [1.0], [0.0]] and out[2] == [[4.0, 4.0], [3.0], [2.0]]
    assert out[1] == [[6.0, 6.0], [1.0], [0.0]] and out[3] == [[6.0, 6.0], [3.0], [3.0]]


def test_process_set_queries_and_wrong_arguments() -> None:
    def run(r: int, rt: Runtime) -> tuple[int, int, bool]:
        ps = hvd.ProcessSet([1, 2])
        register_init_sets([ps], rt)
        ps._runtime = rt
        with pytest.raises(TypeError, match="must be a ProcessSet"):
            hvd.allreduce(torch.ones(1), process_set=[1, 2], runtime=rt)
        with pytest.raises(TypeError, match="list of ProcessSet or 'dynamic'"):
            register_init_sets("static", rt)
        return ps.rank(), ps.size(), ps.included()

    assert on_ranks(3, run) == [(-1, 2, False), (0, 2, True), (1, 2, True)]


def _ps_entry_points() -> dict[str, Any]:
    """Every entry point that takes a process set, as ``call(ps, rt)``."""
    t = torch.ones(2)

    def sparse() -> torch.Tensor:
        return torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1), (2,))

    def optimizer(**more: Any) -> Any:
        lin = torch.nn.Linear(2, 1)
        return lambda ps, rt: hvd.DistributedOptimizer(
            torch.optim.SGD(lin.parameters(), lr=0.1), process_set=ps, runtime=rt, **more
        )

    return {
        "allreduce": lambda ps, rt: hvd.allreduce(t, process_set=ps, runtime=rt),
        "allreduce_async": lambda ps, rt: hvd.allreduce_async(t, process_set=ps, runtime=rt),
        "allreduce_": lambda ps, rt: hvd.allreduce_(t.clone(), process_set=ps, runtime=rt),
        "allreduce_async_": lambda ps, rt: hvd.allreduce_async_(t.clone(), process_set=ps, runtime=rt),
        "grouped_allreduce": lambda ps, rt: hvd.grouped_allreduce([t], process_set=ps, runtime=rt),
        "grouped_allreduce_async": lambda ps, rt: hvd.grouped_allreduce_async(
            [t], process_set=ps, runtime=rt
        ),
        "grouped_allreduce_": lambda ps, rt: hvd.grouped_allreduce_([t.clone()], process_set=ps, runtime=rt),
        "grouped_allreduce_async_": lambda ps, rt: hvd.grouped_allreduce_async_(
            [t.clone()], process_set=ps, runtime=rt
        ),
        "sparse_allreduce_async": lambda ps, rt: hvd.sparse_allreduce_async(
            sparse(), "s", hvd.Sum, process_set=ps, runtime=rt
        ),
        "adasum": lambda ps, rt: hvd.allreduce(t, op=hvd.Adasum, process_set=ps, runtime=rt),
        "allgather": lambda ps, rt: hvd.allgather(t, process_set=ps, runtime=rt),
        "allgather_async": lambda ps, rt: hvd.allgather_async(t, process_set=ps, runtime=rt),
        "grouped_allgather": lambda ps, rt: hvd.grouped_allgather([t], process_set=ps, runtime=rt),
        "grouped_allgather_async": lambda ps, rt: hvd.grouped_allgather_async(
            [t], process_set=ps, runtime=rt
        ),
        "broadcast": lambda ps, rt: hvd.broadcast(t, 0, process_set=ps, runtime=rt),
        "broadcast_async": lambda ps, rt: hvd.broadcast_async(t, 0, process_set=ps, runtime=rt),
        "broadcast_": lambda ps, rt: hvd.broadcast_(t.clone(), 0, process_set=ps, runtime=rt),
        "broadcast_async_": lambda ps, rt: hvd.broadcast_async_(t.clone(), 0, process_set=ps, runtime=rt),
        "alltoall": lambda ps, rt: hvd.alltoall(t, process_set=ps, runtime=rt),
        "alltoall_async": lambda ps, rt: hvd.alltoall_async(t, process_set=ps, runtime=rt),
        "reducescatter": lambda ps, rt: hvd.reducescatter(t, process_set=ps, runtime=rt),
        "reducescatter_async": lambda ps, rt: hvd.reducescatter_async(t, process_set=ps, runtime=rt),
        "grouped_reducescatter": lambda ps, rt: hvd.grouped_reducescatter([t], process_set=ps, runtime=rt),
        "grouped_reducescatter_async": lambda ps, rt: hvd.grouped_reducescatter_async(
            [t], process_set=ps, runtime=rt
        ),
        "barrier": lambda ps, rt: hvd.barrier(process_set=ps, runtime=rt),
        "broadcast_object": lambda ps, rt: hvd.broadcast_object(1, 0, process_set=ps, runtime=rt),
        "allgather_object": lambda ps, rt: hvd.allgather_object(1, process_set=ps, runtime=rt),
        "DistributedOptimizer": optimizer(),
        "DistributedOptimizer(op=Adasum)": optimizer(op=hvd.Adasum),
        "init(process_sets=...)": lambda ps, rt: register_init_sets([ps], rt),
        "add_process_set": lambda ps, rt: hvd.add_process_set(ps, runtime=rt),
        "remove_process_set": lambda ps, rt: hvd.remove_process_set(ps, runtime=rt),
    }


def _ps_runtime(dynamic: bool = False) -> Runtime:
    rt = Runtime()
    kv = KV.__new__(KV)  # (no store: every refusal comes before the store is asked anything)
    kv.rank, kv.size = 0, 2
    rt.attach(kv)
    rt.dynamic_sets = dynamic
    return rt


@pytest.mark.parametrize("entry", sorted(_ps_entry_points()))
def test_the_parameter_servers_path_refuses_a_process_set_at_every_entry_point(entry: str) -> None:
    call = _ps_entry_points()[entry]
    for dynamic in (False, True):
        with pytest.raises(ValueError, match=PS_REFUSAL) as err:
            call(hvd.ProcessSet([0]), _ps_runtime(dynamic))
        assert "not registered" not in str(err.value) and "dynamic" not in str(err.value)


#: what the parameter servers' path says of a process set (the path, and why)
PS_REFUSAL = (
    r"process sets other than the global one run on the collectives' path \(-s 0\), not on this "
    r"worker's path \('ps'\): the parameter servers sum each key over every worker"
)


def test_the_parameter_servers_path_takes_the_global_set() -> None:
    rt = _ps_runtime(dynamic=True)
    assert hvd.remove_process_set(hvd.global_process_set, runtime=rt) is False  # Horovod's answer
    every = hvd.ProcessSet([0, 1])
    register_init_sets([every], rt)  # a set of every rank is the global one, on any path
    assert every.process_set_id == 0
