"""A full disk under --log-dir and under the checkpoint path (a small tmpfs): a clear error and
exit, never a checkpoint that loads half-written."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.faults.faultjob import Job, assert_nothing_left, launch_args, small_disk, trainer
from trainer_core.train import checkpoint


def test_log_dir_full_at_launch(tmp_path: Path, launchkit_home: Path) -> None:
    """Nothing starts: exit 2 naming the directory (the launcher writes a probe first)."""
    with small_disk(tmp_path / "logs", "4k") as logs:
        (logs / "filler").write_bytes(b"\0" * 4096)
        job = Job([*launch_args("--log-dir", str(logs)), *trainer("--steps", "3")], launchkit_home)
        code, took = job.finish(timeout=20)
    assert code == 2, job.out
    assert f"--log-dir {logs}: cannot write there: No space left on device" in job.out, job.out
    assert "step 1" not in job.out and took < 5
    assert not list((launchkit_home / "jobs").glob("*.json"))


def test_log_dir_fills_mid_job(tmp_path: Path, launchkit_home: Path) -> None:
    """The disk fills while the job runs: said once, the job goes on (its output still reaches the
    console) and ends with exit 74 (EX_IOERR) although every process succeeded."""
    with small_disk(tmp_path / "logs", "64k") as logs:
        job = Job(
            [
                *launch_args("--log-dir", str(logs)),
                *trainer("--steps", "30", "--delay", "0.01", "--chatter", "4000"),
            ],
            launchkit_home,
        )
        code, _ = job.finish(timeout=40)
    assert code == 74, job.out
    assert f"cannot write to --log-dir {logs}: No space left on device; the job goes on" in job.out, job.out
    assert job.out.count("cannot write to --log-dir") == 1
    assert "[worker 0] done 0 60.0" in job.out and "[worker 1] done 1 60.0" in job.out
    assert "incomplete" in job.out
    assert_nothing_left(job.job_id)


def test_checkpoint_disk_full(tmp_path: Path, launchkit_home: Path) -> None:
    """Room for one checkpoint, not for its successor beside it: rank 0's save fails with ENOSPC,
    the job ends naming worker 0 and the error; the last complete checkpoint is intact and
    resumes; no temporary file is left; a torn file is refused, never loaded."""
    size = 200_000  # float32: 800 kB per checkpoint
    with small_disk(tmp_path / "ck", "1200k") as ck:
        path = ck / "model.npz"
        job = Job(
            [*launch_args(), *trainer("--steps", "5", "--size", str(size), "--checkpoint", str(path))],
            launchkit_home,
        )
        code, took = job.finish(timeout=30)
        assert code == 1, job.out
        # worker 0's own exit or the scheduler's abort that names it, whichever the launcher saw first
        summary = job.out.partition("launchkit: error: ")[2]
        assert "[Errno 28] No space left on device" in summary, job.out
        assert "worker 0" in summary, job.out
        assert took < 15
        assert_nothing_left(job.job_id)
        assert sorted(p.name for p in ck.iterdir()) == ["model.npz"]  # no .tmp left behind
        saved = checkpoint.load(path)
        assert saved.step == 1 and float(saved.params["w"][0]) == 2.0
        # the surviving checkpoint resumes (on a disk with room)
        good = tmp_path / "model.npz"
        good.write_bytes(path.read_bytes())
    job = Job(
        [
            *launch_args(),
            *trainer("--steps", "3", "--size", str(size), "--checkpoint", str(good), "--resume"),
        ],
        launchkit_home,
    )
    code, _ = job.finish(timeout=30)
    assert code == 0, job.out
    assert "step 1" not in job.out and "[worker 0] done 0 6.0" in job.out, job.out
    # a file cut anywhere is refused (numpy's zip reader checks the directory and each CRC)
    data = good.read_bytes()
    torn = tmp_path / "torn.npz"
    for cut in (len(data) // 2, len(data) - 10, 100):
        torn.write_bytes(data[:cut])
        with pytest.raises((zipfile.BadZipFile, ValueError, OSError, EOFError)):
            checkpoint.load(torn)
