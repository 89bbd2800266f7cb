"""Faults around the launcher itself, under the local launcher: the launcher SIGKILLed (its reaper
must end the job), the scheduler's port held by another program, two jobs side by side."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from tests.faults.faultjob import Job, assert_nothing_left, launch_args, node_pids, trainer
from tests.launchkit.procs import pids_with_job, run, wait_until

TRAINING = trainer("--steps", "400", "--delay", "0.05")
CLEANUP_BOUND = 1 + 4  # the grace period, then the reaper's SIGKILL and a margin


def launcher_killed(job: Job) -> float:
    """SIGKILL the launcher; returns how long until nothing of the job was left."""
    job_id = job.job_id
    job.inject(job.proc.pid, signal.SIGKILL)
    job.proc.wait(5)
    assert wait_until(lambda: not pids_with_job(job_id), 20), "the reaper left processes running"
    return time.monotonic() - (job.fault_at or 0.0)


def test_launcher_sigkill_at_startup(launchkit_home: Path) -> None:
    """Killed as soon as the job has a process; the reaper ends what the launcher had started."""
    job = Job([*launch_args(), *TRAINING], launchkit_home)
    assert wait_until(lambda: bool(node_pids(job.job_id, "scheduler")), 10), job.out
    took = launcher_killed(job)
    assert "step 1" not in job.out
    assert took < CLEANUP_BOUND, took
    assert_nothing_left(job.job_id)


def test_launcher_sigkill_mid_training(launchkit_home: Path) -> None:
    job = Job([*launch_args(), *TRAINING], launchkit_home)
    job.wait_for("[worker 1] step 3")
    took = launcher_killed(job)
    assert took < CLEANUP_BOUND, took
    assert_nothing_left(job.job_id)


def test_scheduler_port_taken(launchkit_home: Path) -> None:
    """--scheduler-port names a port another program holds: the job does not wait for a scheduler
    that never comes up; the scheduler's bind error is the root cause. (A port is checked where
    the scheduler runs, which may be another host; launchkit does not choose another port behind
    the user's back, since the port was asked for.)"""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        job = Job([*launch_args("--scheduler-port", str(port)), *TRAINING], launchkit_home)
        code, took = job.finish(timeout=30)
    assert code == 1, job.out
    assert "failed: scheduler 0 on localhost exited with code 1" in job.out, job.out
    assert f"cannot bind tcp://*:{port}: Address already in use" in job.out, job.out
    assert took < 10, took
    assert_nothing_left(job.job_id)


def test_two_jobs_at_once_kill_of_one_leaves_the_other(tmp_path: Path, launchkit_home: Path) -> None:
    """Two jobs of the same user on the same machine: `launchkit kill` of one ends only that one;
    the other trains to the end with the right result."""
    first = Job([*launch_args("--job-name", "first"), *TRAINING], launchkit_home)
    first.wait_for("[worker 1] step 1")
    first_id = first.job_id
    go = tmp_path / "go"  # the second job ends only once the first's kill was seen to leave it
    second = Job(
        [
            *launch_args("--job-name", "second"),
            *trainer("--steps", "100", "--delay", "0.05", "--hold", str(go)),
        ],
        launchkit_home,
    )
    assert wait_until(lambda: len(list((launchkit_home / "jobs").glob("*.json"))) == 2, 10)
    second_id = next(p.stem for p in (launchkit_home / "jobs").glob("*.json") if p.stem != first_id)
    second.wait_for("[worker 1] step 3")
    killed = run(["kill", first_id, "--grace-period", "1"], timeout=30)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert second.proc.poll() is None and len(node_pids(second_id, "worker")) == 2, second.out
    go.touch()
    code, _ = first.finish(timeout=15)
    assert code == 128 + signal.SIGTERM, first.out
    assert_nothing_left(first_id)
    code, _ = second.finish(timeout=30)
    assert code == 0, second.out
    assert "[worker 0] done 0 200.0" in second.out and "[worker 1] done 1 200.0" in second.out, second.out
    assert_nothing_left(second_id)
