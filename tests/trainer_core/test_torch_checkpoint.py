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
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        compression=hvd.Compression.onebit,
        fusion_threshold=0,
        runtime=rt,
    )


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
    assert json.loads(ck.read_text()) == {
        "format": 2,
        "epoch": 2,
        "size": W,
        "servers": 0,
        "files": ["ck.2.rank0", "ck.2.rank1"],
    }
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
    ck.write_text(json.dumps({"epoch": 1, "size": W}))  # the format of before the servers' file
    (tmp_path / "ck.1.rank0").write_bytes(b"")
    missing = f"{tmp_path / 'ck.1.rank1'}: worker 1's state of epoch 1 is missing"
    assert on_ranks(W, wrong) == [missing] * W  # every rank alike, before any loads


def solo(m: torch.nn.Module) -> Any:
    """A one-rank optimizer (no launcher: the ``Solo`` backend)."""
    rt = Runtime()
    rt.init(environ={})
    return hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), runtime=rt)


def test_the_manifest_is_written_last_and_a_save_cut_short_keeps_the_previous_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xs, ys = data(4)
    ck = tmp_path / "ck"
    m = make_model()
    opt = solo(m)
    steps(0, m, opt, xs[:2], ys[:2])
    renamed: list[str] = []
    real = checkpoint.os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst) == ck and renamed[-1] == "ck.2.rank0":  # the manifest of epoch 2: the save dies
            raise OSError(28, "No space left on device")
        renamed.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    checkpoint.save(ck, 1, m, opt)
    assert renamed == ["ck.1.rank0", "ck"]  # the manifest last
    saved = flat(m)
    steps(0, m, opt, xs[2:], ys[2:])
    with pytest.raises(OSError):
        checkpoint.save(ck, 2, m, opt)
    # the epoch-2 file is complete, but no manifest names it: the checkpoint is still epoch 1's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck.1.rank0", "ck.2.rank0"]  # no temp file
    fresh = make_model()
    assert checkpoint.load(ck, fresh, solo(fresh)) == (1, {})
    assert torch.equal(flat(fresh), saved)


def test_a_missing_directory_is_made_and_a_failed_write_is_reported_not_the_cleanups_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = make_model()
    opt = solo(m)
    ck = tmp_path / "no" / "such" / "run.ck"
    checkpoint.save(ck, 1, m, opt)  # not torch's "Parent directory ... does not exist"
    assert sorted(p.name for p in ck.parent.iterdir()) == ["run.ck", "run.ck.1.rank0"]

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise OSError(30, "Read-only file system", str(self))

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError) as told:
        checkpoint.save(ck, 2, m, opt)
    assert told.value.errno == 28
    assert f"cannot write the checkpoint {ck}.2.rank0: No space left on device" in str(told.value)


def test_a_checkpoint_of_another_shape_is_refused_before_anything_loads(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    m = make_model()
    opt = solo(m)
    checkpoint.save(ck, 1, m, opt)
    head = json.loads(ck.read_text())
    assert head == {"format": 2, "epoch": 1, "size": 1, "servers": 0, "files": ["ck.1.rank0"]}
    other = make_model()
    torch.nn.init.zeros_(other[0].weight)
    before = flat(other)

    def refused(manifest: dict[str, Any]) -> str:
        ck.write_text(json.dumps(manifest))
        with pytest.raises(ValueError) as e:
            checkpoint.load(ck, other, solo(other))
        assert torch.equal(flat(other), before)  # nothing was loaded
        return str(e.value)

    files = ["ck.1.rank0", "ck.1.server"]
    assert refused({**head, "servers": 1, "files": files}) == (
        f"{ck}: a checkpoint of a job with 1 servers, this job has 0 (a checkpoint resumes on the same path: -s 1)"
    )
    assert refused({**head, "files": ["ck.1.rank0", "ck.1.rank1"]}) == (
        f"{ck}: not a checkpoint of trainer_core.torch (its epoch, counts and files disagree)"
    )
    assert refused({**head, "format": 3}).endswith(
        "a checkpoint of format 3, newer than this trainer_core's (2)"
    )
    assert refused({"epoch": "one"}).startswith(f"{ck}: not a checkpoint of trainer_core.torch (ValueError")
    assert checkpoint.parse_manifest(ck, json.dumps({**head, "servers": 1, "files": files})).servers == 1
    with pytest.raises(
        ValueError, match="residuals of the parameter-server path, and this job runs on the allreduce path"
    ):
        checkpoint.load_residuals(opt, {"kv/0/0/residual": torch.zeros(3)})


def test_a_killed_saves_temporary_files_go_and_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    m = make_model()
    opt = solo(m)
    for stale in (".ck.1.rank0.tmp4242", ".ck.1.server.tmp4242", ".ck.tmp4242"):  # a save SIGKILLed mid-write
        (tmp_path / stale).write_bytes(b"half")
    checkpoint.save(ck, 2, m, opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck.2.rank0"]

    def refused() -> str:
        with pytest.raises(ValueError) as e:
            checkpoint.load(ck, m, opt)
        return str(e.value)

    rank_file = tmp_path / "ck.2.rank0"
    rank_file.write_bytes(b"")
    assert refused().startswith(f"{rank_file}: not a checkpoint file of trainer_core.torch (")
    torch.save({"model": {}, "epoch": 2}, rank_file)
    assert (
        refused()
        == f"{rank_file}: not a checkpoint file of trainer_core.torch (no optimizer, residuals, extra)"
    )
