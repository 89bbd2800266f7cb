"""Checkpoints: round trips, resume equals an uninterrupted run, atomic writes, no pickle."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.test_learners import FakeKV, grad, make_params, run_workers
from trainer_core import kv as kvstore
from trainer_core.optim.local import get_learner
from trainer_core.train import atomicfile, checkpoint
from trainer_core.train.learners import block_momentum_distributed_learner, data_parallel_distributed_learner


def test_round_trip(tmp_path: Path) -> None:
    params = make_params(0)
    learner = get_learner("adam", params, lr=0.01)
    for s in range(3):
        learner.update(grad(0, s))
    residuals = {"W0": {"residual": np.arange(4, dtype=np.float32)}}
    path = checkpoint.save(
        tmp_path / "ck.npz",
        params=params,
        learner=learner,
        residuals=residuals,
        step=7,
        epoch=2,
        compression={"type": "1bit"},
        extra={"seed": 3},
        not_saved=["server optimizer state"],
    )
    ck = checkpoint.load(path)
    assert (ck.step, ck.epoch, ck.learner_name, ck.local_steps) == (7, 2, "adam", 3)
    assert ck.compression == {"type": "1bit"} and ck.extra == {"seed": 3}
    assert ck.not_saved == ["server optimizer state"]
    np.testing.assert_array_equal(ck.residuals["W0"]["residual"], residuals["W0"]["residual"])
    other = make_params(5)
    checkpoint.restore_params(other, ck)
    other_learner = get_learner("adam", other, lr=0.01)
    checkpoint.restore_learner(other_learner, ck)
    for k in params:
        np.testing.assert_array_equal(other[k], params[k])
        assert other_learner.state[k]["t"] == 3 and isinstance(other_learner.state[k]["t"], int)
        np.testing.assert_array_equal(other_learner.state[k]["m"], learner.state[k]["m"])
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def run_data_parallel(params: dict[str, Any], steps: range, ck: checkpoint.Checkpoint | None = None) -> Any:
    kv = kvstore.create("local")
    if ck is not None:
        checkpoint.restore_params(params, ck)
    dl = data_parallel_distributed_learner(get_learner("adam", params, lr=0.01), kv=kv)
    if ck is not None:
        checkpoint.restore_learner(dl, ck)
    for s in steps:
        dl.update(grad(0, s), 4)
    return dl


def test_resume_continues_where_it_stopped(tmp_path: Path) -> None:
    straight = make_params(0)
    run_data_parallel(straight, range(6))
    first = make_params(0)
    dl = run_data_parallel(first, range(3))
    checkpoint.save(tmp_path / "ck.npz", params=first, learner=dl, step=3)
    ck = checkpoint.load(tmp_path / "ck.npz")
    resumed = make_params(9)  # a fresh model: everything comes from the checkpoint
    dl2 = run_data_parallel(resumed, range(ck.step, 6), ck)
    assert dl2.total_number_of_samples_seen == 24
    for k in straight:
        np.testing.assert_array_equal(resumed[k], straight[k])


def test_block_momentum_resume_at_a_block_boundary(tmp_path: Path) -> None:
    path = tmp_path / "bm.npz"

    def train(kv: FakeKV, steps: range, save_at: int | None, resume: bool) -> dict[str, np.ndarray]:
        params = make_params(kv.rank)
        ck = checkpoint.load(path) if resume else None
        if ck is not None:
            checkpoint.restore_params(params, ck)
        local = get_learner("momentum", params, lr=0.1, momentum=0.5)
        dl = block_momentum_distributed_learner(local, 6, kv=kv)
        if ck is not None:
            checkpoint.restore_learner(dl, ck)
        for s in steps:
            dl.update(grad(kv.rank, s), 1)
            if s + 1 == save_at:
                # right after a block: every worker holds the same model and (reset) momentum,
                # so rank 0's checkpoint is everyone's state
                if kv.rank == 0:
                    checkpoint.save(path, params=params, learner=dl, step=s + 1)
                kv.barrier()
        dl.flush()
        return params

    straight = run_workers(2, lambda kv: train(kv, range(8), None, False))
    run_workers(2, lambda kv: train(kv, range(6), 6, False))
    ck = checkpoint.load(path)
    assert ck.dist["samples_since_sync"] == 0 and "prev/W" in ck.dist and "smoothed/W" in ck.dist
    resumed = run_workers(2, lambda kv: train(kv, range(ck.step, 8), None, True))
    for got in resumed:
        for k in got:
            np.testing.assert_allclose(got[k], straight[0][k], rtol=1e-12)


def test_failed_write_keeps_the_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoint.save(tmp_path / "ck.npz", params={"w": np.ones(3)}, step=1)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, params={"w": np.zeros(3)}, step=2)
    assert checkpoint.load(path).step == 1
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_write_is_reported_not_the_cleanups_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a read-only or full disk, removing the temporary file fails too: the write's error (naming
    the checkpoint) is the one raised, not the cleanup's."""
    target = tmp_path / "ck.npz"

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(np, "savez", full)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError) as told:
        checkpoint.save(target, params={"w": np.zeros(3)}, step=2)
    assert told.value.errno == errno.ENOSPC
    assert str(told.value) == f"[Errno 28] cannot write the checkpoint {target}: No space left on device"

    def no_write(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".ck.npz.x.tmp"))

    monkeypatch.setattr(atomicfile.tempfile, "mkstemp", no_write)
    with pytest.raises(PermissionError, match=f"cannot write the checkpoint {target}: Permission denied"):
        checkpoint.save(target, params={"w": np.zeros(3)}, step=2)


def test_load_refuses_pickled_arrays_and_foreign_files(tmp_path: Path) -> None:
    manifest = np.frombuffer(json.dumps({"format": checkpoint.FORMAT, "version": 1}).encode(), np.uint8)
    bad = tmp_path / "bad.npz"
    arrays: dict[str, Any] = {"manifest.json": manifest, "param/w": np.array([{"evil": 1}], dtype=object)}
    savez: Any = np.savez
    savez(bad, **arrays)
    with pytest.raises(ValueError, match="allow_pickle"):
        checkpoint.load(bad)
    plain = tmp_path / "plain.npz"
    np.savez(plain, w=np.ones(2))
    with pytest.raises(ValueError, match="not a trainer_core checkpoint"):
        checkpoint.load(plain)
    with pytest.raises(ValueError, match=r"end in \.npz"):
        checkpoint.save(tmp_path / "ck.pkl", params={"w": np.ones(2)})


def test_restore_checks_the_model(tmp_path: Path) -> None:
    ck = checkpoint.load(checkpoint.save(tmp_path / "ck.npz", params={"w": np.ones(3)}))
    with pytest.raises(ValueError, match="disagree"):
        checkpoint.restore_params({"v": np.ones(3)}, ck)
    with pytest.raises(ValueError, match="shape"):
        checkpoint.restore_params({"w": np.ones(4)}, ck)


def test_compression_residuals_round_trip_into_the_store(tmp_path: Path) -> None:
    params = {k: v.astype(np.float32) for k, v in make_params(0).items()}
    kv = kvstore.create("local")
    dl = data_parallel_distributed_learner(get_learner("sgd", params, lr=0.1), 0, 1, kv=kv)
    for s in range(3):
        dl.update({k: v.astype(np.float32) for k, v in grad(0, s).items()}, 4)
    state = kv.compression_state()
    assert sorted(state) == ["W/0", "b/0"]
    path = checkpoint.save(tmp_path / "ck.npz", params=params, learner=dl, residuals=state, step=3)
    ck = checkpoint.load(path)
    kv2 = kvstore.create("local")
    fresh = {k: v.astype(np.float32) for k, v in make_params(1).items()}
    checkpoint.restore_params(fresh, ck)
    dl2 = data_parallel_distributed_learner(get_learner("sgd", fresh, lr=0.1), 0, 1, kv=kv2)
    checkpoint.restore_learner(dl2, ck)
    kv2.load_compression_state(ck.residuals)
    for name, st in kv2.compression_state().items():
        np.testing.assert_array_equal(st["residual"], state[name]["residual"])


def test_momentum_checkpoints_in_the_old_velocity_form_resume(tmp_path: Path) -> None:
    """Checkpoints written before the learners shared optim.rules hold a velocity ``v`` (``v = mu v
    + g``, ``w -= lr v``); restored, the momentum goes on as ``mom = -lr v``."""
    lr, mu = 0.05, 0.8
    params = make_params(0)
    vel = {k: 0.5 * np.ones_like(v) for k, v in params.items()}
    old = get_learner("momentum", params, lr=lr, momentum=mu)
    old.state = {k: {"v": v.copy()} for k, v in vel.items()}  # what the old learner kept
    path = checkpoint.save(tmp_path / "ck.npz", params=params, learner=old, step=1)
    ck = checkpoint.load(path)
    restored = make_params(3)
    checkpoint.restore_params(restored, ck)
    learner = get_learner("momentum", restored, lr=lr, momentum=mu)
    checkpoint.restore_learner(learner, ck)
    want = {k: v.copy() for k, v in params.items()}
    for s in range(3):
        learner.update(grad(0, s))
        for k in want:
            vel[k] = mu * vel[k] + grad(0, s)[k]
            want[k] = want[k] - lr * vel[k]
    for k in want:
        np.testing.assert_allclose(restored[k], want[k], rtol=1e-12)


def test_restore_refuses_state_the_learner_does_not_have(tmp_path: Path) -> None:
    params = make_params(0)
    adam = get_learner("adam", params, lr=0.01)
    adam.update(grad(0, 0))
    ck = checkpoint.load(checkpoint.save(tmp_path / "ck.npz", params=params, learner=adam))
    sgd = get_learner("sgd", make_params(1), lr=0.1)
    with pytest.raises(ValueError, match="adam"):
        checkpoint.restore_learner(sgd, ck)  # another learner's checkpoint
    ck.learner_name = ""  # even unnamed, its slots give it away
    with pytest.raises(ValueError, match="no slot"):
        checkpoint.restore_learner(sgd, ck)
    assert sgd.state == {}
    with pytest.raises(ValueError, match="not a parameter"):
        get_learner("adam", {"w": np.zeros(2)}, lr=0.1).load_state({"x": {"m": np.zeros(2)}})


def test_a_worker_file_keeps_the_previous_steps_residuals(tmp_path: Path) -> None:
    """A job killed after a worker wrote step N, before rank 0's checkpoint of step N, resumes from
    rank 0's step N - 1: the worker file still holds that step's residuals."""
    ck = tmp_path / "ck.npz"

    def residuals(v: float) -> dict[str, dict[str, np.ndarray]]:
        return {"3": {"residual": np.full(4, v, np.float32)}}

    checkpoint.save_worker(ck, 1, residuals(1.0), step=10)
    assert checkpoint.load_worker(ck, 1, step=10)["3"]["residual"][0] == 1.0
    with pytest.raises(ValueError, match=r"ck.worker1.npz is of step 10, the checkpoint of step 9"):
        checkpoint.load_worker(ck, 1, step=9)
    checkpoint.save_worker(ck, 1, residuals(2.0), step=20)
    assert checkpoint.load_worker(ck, 1, step=20)["3"]["residual"][0] == 2.0
    assert checkpoint.load_worker(ck, 1, step=10)["3"]["residual"][0] == 1.0
    assert checkpoint.load_worker(ck, 1)["3"]["residual"][0] == 2.0  # no step: the latest
    checkpoint.save_worker(ck, 1, residuals(3.0), step=30)  # only one step back is kept
    with pytest.raises(ValueError, match=r"is of steps 20 and 30, the checkpoint of step 10"):
        checkpoint.load_worker(ck, 1, step=10)
    assert checkpoint.load_worker(ck, 1, step=20)["3"]["residual"][0] == 2.0
    # writing the same step again (a resumed run repeating it) replaces it, keeping the one before
    checkpoint.save_worker(ck, 1, residuals(3.5), step=30)
    assert checkpoint.load_worker(ck, 1, step=30)["3"]["residual"][0] == 3.5
    assert checkpoint.load_worker(ck, 1, step=20)["3"]["residual"][0] == 2.0
    # an unreadable file in the way is replaced, with no previous step
    checkpoint.worker_path(ck, 2).write_bytes(b"not a checkpoint")
    checkpoint.save_worker(ck, 2, residuals(4.0), step=40)
    assert checkpoint.load(checkpoint.worker_path(ck, 2)).previous_step is None


def test_a_file_that_is_no_archive_is_not_called_pickled_data(tmp_path: Path) -> None:
    """numpy's np.load said "This file contains pickled (object) data ..." of a text file."""
    junk = tmp_path / "run.ck"
    junk.write_text("not a checkpoint\n")
    with pytest.raises(
        ValueError, match=r"run\.ck: not a trainer_core checkpoint \(not an \.npz archive"
    ) as info:
        checkpoint.load(junk)
    assert "pickle" not in str(info.value)


def test_params_that_are_not_a_dict_are_named(tmp_path: Path) -> None:
    """``save(params=[...])`` was an AttributeError on 'items'; nothing is written."""
    with pytest.raises(TypeError, match="params: expected a dict of the arrays by parameter name, got list"):
        checkpoint.save(tmp_path / "ck.npz", params=[np.zeros(2)])
    assert list(tmp_path.iterdir()) == []
