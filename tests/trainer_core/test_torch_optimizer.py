"""trainer_core.torch's DistributedOptimizer and tensor operations with several ranks in one
process: each rank a thread with its own ``Runtime`` over an in-process collective group
(``collective.fabric``), as the worker processes of a ``-s 0`` job have over sockets."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

import trainer_core.torch as hvd  # noqa: E402
from tests.trainer_core.torchranks import on_ranks  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402

W, B, STEPS = 3, 4, 3


_SEEDED = threading.Lock()  # torch's global generator is shared by the ranks' threads


def make_model(dtype: Any = torch.float32) -> torch.nn.Module:
    with _SEEDED:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).to(dtype)


def data(steps: int = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(steps, W * B, 5, generator=g), torch.randn(steps, W * B, 3, generator=g)


def flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def reference(lr: float = 0.1, momentum: float = 0.9) -> torch.Tensor:
    """One process training on every rank's batch at once (the mean loss over W*B samples)."""
    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    xs, ys = data()
    for x, y in zip(xs, ys, strict=True):
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    return flat(m)


def train(r: int, rt: Runtime, passes: int = 1, dtype: Any = torch.float32, **kw: Any) -> torch.Tensor:
    """Rank ``r``'s share of ``reference``: its B samples per step (in ``passes`` accumulated parts)."""
    m = make_model(dtype)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        m.named_parameters(),
        runtime=rt,
        backward_passes_per_step=passes,
        average_aggregated_gradients=True,
        **kw,
    )
    xs, ys = data()
    for x, y in zip(xs, ys, strict=True):
        mine = slice(r * B, (r + 1) * B)
        for xp, yp in zip(x[mine].chunk(passes), y[mine].chunk(passes), strict=True):
            torch.nn.functional.mse_loss(m(xp.to(dtype)), yp.to(dtype)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return flat(m).float()


@pytest.mark.parametrize("fusion", [hvd.optimizer.FUSION_THRESHOLD, 64, 0])
def test_averaged_sgd_equals_one_process_on_the_concatenated_batch(fusion: int) -> None:
    got = on_ranks(W, lambda r, rt: train(r, rt, fusion_threshold=fusion))
    for g in got[1:]:
        assert torch.equal(g, got[0])  # every rank applies the same reduced gradients
    torch.testing.assert_close(got[0], reference(), rtol=1e-5, atol=1e-6)


def test_accumulation_over_backward_passes() -> None:
    got = on_ranks(W, lambda r, rt: train(r, rt, passes=2))
    assert all(torch.equal(g, got[0]) for g in got)
    torch.testing.assert_close(got[0], reference(), rtol=1e-5, atol=1e-6)


def test_fp16_compression_is_close() -> None:
    got = on_ranks(W, lambda r, rt: train(r, rt, compression=hvd.Compression.fp16))
    assert all(torch.equal(g, got[0]) for g in got)
    torch.testing.assert_close(got[0], reference(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients(dtype: Any) -> None:
    got = on_ranks(W, lambda r, rt: train(r, rt, dtype=dtype))
    assert all(torch.equal(g, got[0]) for g in got)
    torch.testing.assert_close(got[0], reference(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize(
    "comp", [hvd.Compression.onebit, hvd.Compression.twobit(0.05), hvd.Compression.topk(0.3), hvd.Compression.powersgd(1)]
)  # fmt: skip
def test_trainer_core_compressors_keep_ranks_identical(comp: Any) -> None:
    got = on_ranks(W, lambda r, rt: train(r, rt, compression=comp))
    assert all(torch.equal(g, got[0]) for g in got)
    start = flat(make_model())
    assert not torch.equal(got[0], start)  # it moved


def test_onebit_with_error_feedback_trains() -> None:
    """A regression task, 30 steps: 1-bit with error feedback reaches near the 32-bit loss."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(W * 16, 5, generator=g)
    y = x @ torch.randn(5, 3, generator=g)

    def run(r: int, rt: Runtime, comp: Any) -> float:
        m = make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05), compression=comp, runtime=rt)
        mine = slice(r * 16, (r + 1) * 16)
        for _ in range(60):
            torch.nn.functional.mse_loss(m(x[mine]), y[mine]).backward()
            opt.step()
            opt.zero_grad()
        return float(torch.nn.functional.mse_loss(m(x), y).detach())

    first = float(torch.nn.functional.mse_loss(make_model()(x), y).detach())
    full = on_ranks(W, lambda r, rt: run(r, rt, hvd.Compression.none))[0]
    onebit = on_ranks(W, lambda r, rt: run(r, rt, hvd.Compression.onebit))
    assert len(set(onebit)) == 1
    assert onebit[0] < 0.3 * first and onebit[0] < 2 * full, (first, full, onebit[0])


def test_unused_parameters_contribute_zeros_and_receive_the_others() -> None:
    """Rank 0 alone uses ``extra``; every rank still makes the same collectives and ends equal."""

    def run(r: int, rt: Runtime) -> torch.Tensor:
        with _SEEDED:
            torch.manual_seed(0)
            body, extra = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
        params = [*body.parameters(), *extra.parameters()]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.5), fusion_threshold=0, runtime=rt)
        x = torch.ones(1, 4) * (r + 1)
        out = body(x) + (extra(x) if r == 0 else 0)
        out.sum().backward()
        # an operation between backward and step comes after every rank's buckets, on every rank
        assert hvd.allreduce(out.sum().detach(), op=hvd.Sum, runtime=rt).numel() == 1
        opt.step()
        return torch.cat([p.detach().reshape(-1) for p in params])

    got = on_ranks(W, run)
    assert all(torch.equal(p, got[0]) for p in got)
    torch.manual_seed(0)
    _, extra = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    # rank 0's gradient of extra.weight is x = 1, averaged over W ranks
    torch.testing.assert_close(got[0][10:18].reshape(2, 4), extra.weight.detach() - 0.5 / W)


def test_tensor_operations() -> None:
    def run(r: int, rt: Runtime) -> dict[str, Any]:
        t = torch.full((2,), float(r + 1))
        h = hvd.allreduce_async(t, op=hvd.Sum, runtime=rt)
        out = {
            "mean": hvd.allreduce(t, runtime=rt),
            "max": hvd.allreduce(torch.tensor([r]), op=hvd.Max, runtime=rt),
            "gather": hvd.allgather(torch.full((r + 1, 2), r), runtime=rt),
            "bcast": hvd.broadcast(torch.tensor([10 * r], dtype=torch.bfloat16), 2, runtime=rt),
            "fp16": hvd.allreduce(t, compression=hvd.Compression.fp16, op=hvd.Sum, runtime=rt),
        }
        out["sum"] = hvd.synchronize(h)
        assert hvd.poll(h)
        inplace = torch.full((3,), float(r))
        hvd.broadcast_(inplace, 1, runtime=rt)
        out["inplace"] = inplace
        assert torch.equal(t, torch.full((2,), float(r + 1)))  # the input is not touched
        return out

    for got in on_ranks(W, run):
        assert torch.equal(got["sum"], torch.full((2,), 6.0))
        assert torch.equal(got["mean"], torch.full((2,), 2.0))
        assert torch.equal(got["max"], torch.tensor([2]))
        assert got["gather"].tolist() == [[0, 0], [1, 1], [1, 1], [2, 2], [2, 2], [2, 2]]
        assert got["bcast"].dtype == torch.bfloat16 and got["bcast"].item() == 20.0
        assert got["fp16"].dtype == torch.float32 and torch.equal(got["fp16"], torch.full((2,), 6.0))
        assert torch.equal(got["inplace"], torch.ones(3))


def test_broadcast_parameters_and_optimizer_state() -> None:
    def run(r: int, rt: Runtime) -> tuple[torch.Tensor, dict[str, Any]]:
        with _SEEDED:
            torch.manual_seed(r)  # every rank starts different
            m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
            x = torch.randn(5, 3)
        opt = torch.optim.Adam(m.parameters(), lr=0.01 * (r + 1))
        if r == 1:  # the root has state; the others none yet
            m(x).sum().backward()
            opt.step()
        hvd.broadcast_parameters(m.state_dict(), root_rank=1, runtime=rt)
        hvd.broadcast_optimizer_state(opt, root_rank=1, runtime=rt)
        sd = opt.state_dict()
        return torch.cat([t.reshape(-1).float() for t in m.state_dict().values()]), sd

    got = on_ranks(W, run)
    for params, sd in got:
        assert torch.equal(params, got[1][0])
        assert sd["param_groups"][0]["lr"] == pytest.approx(0.02)
        for k, st in sd["state"].items():
            for name, v in st.items():
                assert torch.equal(v, got[1][1]["state"][k][name]), name


def test_buckets_start_during_backward() -> None:
    """With one bucket per parameter, the last layer's exchange has started before autograd reaches
    the first layer (a tensor hook on the first layer's output gradient looks)."""

    def run(r: int, rt: Runtime) -> list[int]:
        m = make_model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), fusion_threshold=0, runtime=rt
        )
        seen: list[int] = []
        h = m[0](torch.ones(2, 5))
        h.register_hook(lambda g: seen.append(len(opt._pending)))  # runs before layer 0's gradients
        m[2](m[1](h)).sum().backward()
        seen.append(len(opt._pending))
        opt.step()
        return seen

    for seen in on_ranks(2, run):
        assert seen == [2, 4]  # the last layer's weight and bias were on their way; then all four
