"""``hvd.join()`` (trainer_core/torch/ops.py, backend.py) over in-process groups (one thread per
rank): uneven batches against a torch reference, a joined rank's zeros in its own place in Adasum,
a training loop whose ranks run out of data at different steps, and the parameter-server path's
refusal. Real processes: test_collective_joining_jobs.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

import trainer_core.torch as hvd  # noqa: E402
from tests.trainer_core.adasumref import adasum_reference  # noqa: E402
from tests.trainer_core.torchranks import on_ranks  # noqa: E402
from trainer_core.torch.backend import KV  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402


def steps(r: int) -> int:
    return 1 + r  # rank r has 1 + r batches


def batch(r: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)


@pytest.mark.parametrize("w", [2, 3, 4])
def test_average_and_sum_with_joined_ranks_match_a_reference(w: int) -> None:
    def run(r: int, rt: Runtime) -> tuple[list[list[float]], int]:
        got = []
        for s in range(steps(r)):
            x = torch.full((3,), float(r + 1 + s))
            got.append(hvd.allreduce(x, op=hvd.Average, name=f"avg.{s}", runtime=rt).tolist())
            got.append(hvd.allreduce(x, op=hvd.Sum, runtime=rt).tolist())
        return got, hvd.join(runtime=rt)

    out = on_ranks(w, run)
    for r, (got, last) in enumerate(out):
        assert last == w - 1
        for s in range(steps(r)):
            total = sum(float(q + 1 + s) for q in range(w) if s < steps(q))
            assert got[2 * s] == pytest.approx([total / w] * 3)  # divided by every rank, as Horovod's
            assert got[2 * s + 1] == pytest.approx([total] * 3)


def test_product_and_adasum_see_the_joined_ranks_zeros() -> None:
    def run(r: int, rt: Runtime) -> tuple[list[float], list[float], int]:
        if r == 0:
            return [], [], hvd.join(runtime=rt)
        x = torch.tensor([2.0, 3.0])
        prod = hvd.allreduce(x, op=hvd.Product, runtime=rt).tolist()
        ada = hvd.allreduce(x, op=hvd.Adasum, runtime=rt).tolist()
        return prod, ada, hvd.join(runtime=rt)

    out = on_ranks(2, run)
    assert out[1] == ([0.0, 0.0], [2.0, 3.0], 1)  # Adasum of x and zeros is x
    assert out[0][2] == 1


def test_a_joined_ranks_zeros_take_its_own_place_in_adasum() -> None:
    """4 ranks, rank 1 joined: Horovod's joined rank contributes zeros at its own rank, so the
    pairs are (x0, 0) and (x2, x3), not (x0, x2) and (x3, 0) as zeros appended at the end would
    give; Product sees the zeros too."""
    xs = {r: [float(r + 1), float(2 - r), float(r * r)] for r in range(4)}

    def run(r: int, rt: Runtime) -> tuple[list[float], list[float], int]:
        if r == 1:
            return [], [], hvd.join(runtime=rt)
        x = torch.tensor(xs[r], dtype=torch.float64)
        ada = hvd.allreduce(x, op=hvd.Adasum, runtime=rt).tolist()
        prod = hvd.allreduce(x, op=hvd.Product, runtime=rt).tolist()
        return ada, prod, hvd.join(runtime=rt)

    out = on_ranks(4, run)
    zero = [0.0, 0.0, 0.0]
    want = adasum_reference([xs[0], zero, xs[2], xs[3]])
    appended = adasum_reference([xs[0], xs[2], xs[3], zero])
    assert want != pytest.approx(appended)  # (the inputs tell the two places apart)
    for r in (0, 2, 3):
        np.testing.assert_allclose(out[r][0], want, rtol=1e-12)
        assert out[r][0] == out[0][0]  # the same bits on every rank
        assert out[r][1] == zero
    assert {last for _, _, last in out} == {3}  # rank 1 joined first; 0, 2 and 3 after it


def reference(w: int) -> torch.Tensor:
    """One process's SGD over the same batches: each step's gradient is the sum of the ranks
    that still have data, divided by ``w`` (the joined ranks' zeros)."""
    model = torch.nn.Linear(3, 1)
    torch.nn.init.constant_(model.weight, 0.5)
    torch.nn.init.constant_(model.bias, 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps(w - 1)):
        opt.zero_grad()
        for r in range(w):
            if s < steps(r):
                x, y = batch(r, s)
                (torch.nn.functional.mse_loss(model(x), y) / w).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("w", [2, 3])
def test_a_loop_with_uneven_data_ends_with_the_same_parameters_on_every_rank(w: int) -> None:
    def run(r: int, rt: Runtime) -> list[float]:
        model = torch.nn.Linear(3, 1)
        torch.nn.init.constant_(model.weight, 0.5)
        torch.nn.init.constant_(model.bias, 0.0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            runtime=rt,
        )
        for s in range(steps(r)):
            x, y = batch(r, s)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        last = hvd.join(runtime=rt)
        hvd.broadcast_parameters(model.state_dict(), root_rank=last, runtime=rt)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()

    out = on_ranks(w, run)
    want = reference(w).tolist()
    for got in out:
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_the_parameter_server_path_refuses_join_naming_the_path() -> None:
    assert KV.join(SimpleNamespace(size=1)) == 0  # type: ignore[arg-type]
    rt = Runtime()
    kv = KV.__new__(KV)  # (no store: the refusal asks nothing of it)
    kv.rank, kv.size = 0, 2
    rt.attach(kv)
    with pytest.raises(NotImplementedError, match=r"hvd\.join\(\) with more than one worker .*comm='ps'"):
        hvd.join(runtime=rt)
    with pytest.raises(
        NotImplementedError,
        match=r"collectives path \(comm='allreduce'.*-s 0\), not on the parameter-server path \(comm='ps'\): "
        r"there the workers' operations are paired by their order with no negotiation",
    ):
        KV.join(SimpleNamespace(size=2))  # type: ignore[arg-type]
