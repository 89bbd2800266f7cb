"""Elastic jobs on the local backend, with real processes (``tests/launchkit/elasticprog.py``):
a worker that fails is a change of membership, not the job's end. Restart mode (the workers do
not handle a change themselves: torchrun's behaviour) stops the survivors and starts the group
again with dense RANK/WORLD_SIZE and TORCHELASTIC_RESTART_COUNT + 1; in-process mode (every worker
reported dmlc_env.ELASTIC_IN_PROCESS_FIGURE) keeps the survivors running; after the host's
cool-down the job grows back to MAX; fewer than MIN, or a scheduler that dies, ends the job with
its root cause, nothing left. The scheduler process runs trainer_core's scheduler (the program
never runs in that role), which launchkit stops once every worker has ended."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.launchkit.procs import pids_with_env, pids_with_job, record, run, start, wait_for_job, wait_until

PROG = str(Path(__file__).with_name("elasticprog.py"))
WAIT = 60.0  # seconds for an event under a loaded machine (the tests wait for events, never sleep)


def launch_args(out: Path, bounds: str, *flags: str, cool_down: float = 1) -> list[str]:
    launch = ["launch", "-n", bounds, "-s", "0", "--no-dashboard", "--grace-period", "2"]
    cooling = ["--blacklist-cooldown", str(cool_down)]
    return [*launch, *cooling, "--env", f"OUT:{out}", *flags, sys.executable, PROG]


def starts(out: Path) -> dict[int, tuple[int, dict]]:
    """worker index -> (pid, what it saw), from the files each worker wrote when it started."""
    found: dict[int, tuple[int, dict]] = {}
    for f in out.glob("start-worker-*"):
        _, _, index, pid = f.name.split("-")
        try:
            found[int(index)] = (int(pid), json.loads(f.read_text()))
        except ValueError:  # (being written)
            continue
    return found


@pytest.fixture
def out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def finish(proc, out: Path) -> str:
    """Tell every process to end; the launcher's stderr once it has exited."""
    (out / "stop").write_text("")
    try:
        _, stderr = proc.communicate(timeout=WAIT)
    except BaseException:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        raise
    return stderr


def test_restart_mode_restarts_every_worker_with_dense_ranks_then_grows_back(
    out: Path, launchkit_home: Path
) -> None:
    # (a cool-down past the grace period: the first restart is done before the host is back)
    proc = start(launch_args(out, "2:3", "--env", "FAIL:1", cool_down=5), cwd=out.parent)
    try:
        # worker 1 failed: workers 3 and 4 (new indices) replace 0 and 2, ranks 0 and 1 of 2
        assert wait_until(lambda: {3, 4} <= set(starts(out)), WAIT), starts(out)
        seen = starts(out)
        for index, rank in ((3, "0"), (4, "1")):
            env = seen[index][1]
            assert env["RANK"] == rank and env["WORLD_SIZE"] == "2" and env["DMLC_NUM_WORKER"] == "2", env
            assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["LAUNCHKIT_ELASTIC"] == "2:3"
        # the host's cool-down over, the job grows back to MAX: a second restart, at 3
        assert wait_until(lambda: {5, 6, 7} <= set(starts(out)), WAIT), starts(out)
        seen = starts(out)
        assert sorted(seen[i][1]["RANK"] for i in (5, 6, 7)) == ["0", "1", "2"]
        assert {seen[i][1]["WORLD_SIZE"] for i in (5, 6, 7)} == {"3"}
        assert {seen[i][1]["TORCHELASTIC_RESTART_COUNT"] for i in (5, 6, 7)} == {"2"}
        job = wait_for_job(launchkit_home)
    finally:
        stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    assert "epoch 1; left: worker 1 on localhost (exit 3); joined: worker 3" in stderr, stderr
    assert "restart 1 of the workers" in stderr and "restart 2 of the workers" in stderr
    assert "finished after 2 membership changes" in stderr
    rec = record(launchkit_home, job)
    assert [c["epoch"] for c in rec["changes"]] == [1, 2]
    ended = {p["rank"]: p["ended"] for p in rec["processes"] if p["role"] == "worker"}
    assert ended[1] == "exit 3" and "stopped for restart 1" in ended[0] and ended[7] == "exit 0"
    assert not pids_with_job(job)
    shown = run(["ps", job], cwd=out.parent)
    assert shown.returncode == 0 and "left: worker 1 on localhost (exit 3)" in shown.stdout, shown


def test_in_process_mode_keeps_the_survivors_and_a_new_worker_joins(out: Path, launchkit_home: Path) -> None:
    proc = start(launch_args(out, "2:3", "--env", "FAIL:1", "--env", "IN_PROCESS:1"), cwd=out.parent)
    try:
        assert wait_until(lambda: {0, 1, 2} <= set(starts(out)), WAIT), starts(out)
        first = starts(out)
        # after the cool-down, one new worker (index 3) joins; the survivors were never restarted
        assert wait_until(lambda: 3 in starts(out), WAIT), starts(out)
        seen = starts(out)
        assert set(seen) == {0, 1, 2, 3}
        assert seen[0][0] == first[0][0] and seen[2][0] == first[2][0]
        assert seen[3][1]["DMLC_NUM_WORKER"] == "3" and seen[3][1]["TORCHELASTIC_RESTART_COUNT"] == "0"
        job = wait_for_job(launchkit_home)
    finally:
        stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    assert "epoch 1; left: worker 1 on localhost (exit 3); in process" in stderr, stderr
    assert "epoch 2; joined: worker 3 on localhost" in stderr
    assert not pids_with_job(job)
    logs = run(["logs", job], cwd=out.parent)
    assert logs.returncode == 0 and "[worker 1] worker 1 fails" in logs.stderr, logs
    assert "[launchkit] epoch 1; left: worker 1 on localhost (exit 3); in process" in logs.stderr
    listed = run(["ps", "--all"], cwd=out.parent)
    assert "succeeded, epoch 2" in listed.stdout, listed.stdout


def test_fewer_than_min_fails_the_job_naming_the_worker(out: Path, launchkit_home: Path) -> None:
    res = run(launch_args(out, "3:3", "--env", "FAIL:1"), cwd=out.parent, timeout=WAIT)
    assert res.returncode == 3, res.stderr
    assert "failed: worker 1 on localhost exited with code 3" in res.stderr, res.stderr
    job = wait_for_job(launchkit_home)
    assert record(launchkit_home, job)["state"] == "failed"
    assert not pids_with_job(job)


def test_a_scheduler_that_dies_ends_the_job_with_nothing_left(out: Path, launchkit_home: Path) -> None:
    proc = start(launch_args(out, "1:2"), cwd=out.parent)
    try:
        assert wait_until(lambda: {0, 1} <= set(starts(out)), WAIT), starts(out)
        job = wait_for_job(launchkit_home)
        (scheduler,) = [p for p in pids_with_job(job) if p in pids_with_env("DMLC_ROLE=scheduler")]
        os.kill(scheduler, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.returncode is None:
            finish(proc, out)
    assert proc.returncode == 137, stderr
    assert "failed: scheduler 0 on localhost" in stderr and "signal 9" in stderr, stderr
    assert record(launchkit_home, job)["changes"] == []
    assert not pids_with_job(job)
    assert not list(out.glob("start-scheduler-*"))  # the command never ran as the scheduler
