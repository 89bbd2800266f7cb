"""trainer_core.torch.checkpoint with several ranks in one process (the in-process fabric of
test_torch_optimizer): save after some 1-bit steps, load into a fresh model and optimizer, and the
next steps equal those of the run that went on; the files' rules (one per rank, the epoch file,
older epochs removed, another worker count refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch extra: pip install -e '.[torch]'")

import trainer_core.torch as hvd  # noqa: E402
from tests.trainer_core.test_torch_optimizer import B, data, flat, make_model, on_ranks  # noqa: E402
from trainer_core.torch import checkpoint  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402

W = 2


def steps(r: int, m: torch.nn.Module, opt: Any, xs: torch.Tensor, ys: torch.Tensor) -> None:
    mine = slice(r * B, (r + 1) * B)
    for x, y in zip(xs, ys, strict=True):
        torch.nn.functional.mse_loss(m(x[mine]), y[mine]).backward()
        opt.step()
        opt.zero_grad()


def optimizer(m: torch.nn.Module, rt: Runtime) -> Any:
    return hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), compression=hvd.Compression.onebit,
        fusion_threshold=0, runtime=rt,
    )  # fmt: skip


def test_resumed_ranks_continue_as_the_unbroken_run(tmp_path: Path) -> None:
    xs, ys = data(6)
    ck = tmp_path / "ck"

    def run(r: int, rt: Runtime) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = make_model()
        opt = optimizer(m, rt)
        steps(r, m, opt, xs[:2], ys[:2])
        checkpoint.save(ck, 1, m, opt)
        steps(r, m, opt, xs[2:4], ys[2:4])
        checkpoint.save(ck, 2, m, opt)
        steps(r, m, opt, xs[4:], ys[4:])
        unbroken = flat(m)
        fresh = make_model()
        opt2 = optimizer(fresh, rt)
        got = checkpoint.load(ck, fresh, opt2)
        assert got is not None and got[0] == 2
        steps(r, fresh, opt2, xs[4:], ys[4:])
        # without the residuals: the same model and optimizer, but not the same steps
        bare = make_model()
        opt3 = optimizer(bare, rt)
        state = torch.load(ck.with_name(f"ck.2.rank{r}"), weights_only=True)
        bare.load_state_dict(state["model"])
        opt3.load_state_dict(state["optimizer"])
        steps(r, bare, opt3, xs[4:], ys[4:])
        return unbroken, flat(fresh), flat(bare)

    got = on_ranks(W, run)
    for unbroken, resumed, bare in got:
        assert torch.equal(resumed, unbroken)
        assert not torch.equal(bare, unbroken)
    assert json.loads(ck.read_text()) == {"epoch": 2, "size": W}
    assert sorted(p.name for p in tmp_path.glob("ck.*")) == ["ck.2.rank0", "ck.2.rank1"]


def test_no_checkpoint_and_another_worker_count(tmp_path: Path) -> None:
    ck = tmp_path / "ck"

    def run(r: int, rt: Runtime) -> Any:
        m = make_model()
        opt = optimizer(m, rt)
        assert checkpoint.load(ck, m, opt) is None
        return None

    on_ranks(W, run)
    ck.write_text(json.dumps({"epoch": 1, "size": 3}))

    def wrong(r: int, rt: Runtime) -> str:
        m = make_model()
        with pytest.raises(ValueError) as e:
            checkpoint.load(ck, m, optimizer(m, rt))
        return str(e.value)

    assert on_ranks(W, wrong)[0] == f"{ck}: a checkpoint of 3 workers, this job has 2"
    ck.write_text(json.dumps({"epoch": 1, "size": W}))
    assert on_ranks(W, wrong)[1] == f"{tmp_path / 'ck.1.rank1'}: worker 1's state of epoch 1 is missing"
