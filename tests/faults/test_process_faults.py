"""A scheduler, a server or a worker of a real trainer_core job killed (SIGKILL) or hung (SIGSTOP),
at start-up or mid-training, under the local launcher.

Every case: the launcher exits non-zero within a bound, its output names the process at fault
(and the signal, or the heartbeat it missed), and nothing of the job is left: no process carrying
its id, no /dev/shm segment. Liveness is short (heartbeats every 0.5 s, 2 s without one ends a
node) and the grace period 1 s, so each case takes a few seconds.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.faults.faultjob import Job, assert_nothing_left, launch_args, trainer

ROLES = [("worker", 1), ("server", 0), ("scheduler", 0)]
TRAINING = trainer("--steps", "400", "--delay", "0.05")


@pytest.mark.parametrize(("role", "rank"), ROLES)
def test_kill9_mid_training(role: str, rank: int, launchkit_home: Path) -> None:
    job = Job([*launch_args(), *TRAINING], launchkit_home)
    job.wait_for("[worker 1] step 3")
    job.inject(job.pid(role, rank), signal.SIGKILL)
    code, took = job.finish(timeout=20)
    assert code == 128 + signal.SIGKILL, job.out
    assert f"failed: {role} {rank} on localhost was killed by signal 9" in job.out
    assert took < 5, took
    assert_nothing_left(job.job_id)


@pytest.mark.parametrize(("role", "rank"), ROLES)
def test_kill9_at_startup(role: str, rank: int, launchkit_home: Path) -> None:
    """Killed as soon as it exists, before the job has assembled (no node has the address book)."""
    job = Job([*launch_args(), *TRAINING], launchkit_home)
    job.inject(job.pid(role, rank), signal.SIGKILL)
    code, took = job.finish(timeout=20)
    assert "step 1" not in job.out, job.out
    assert code == 128 + signal.SIGKILL, job.out
    assert f"failed: {role} {rank} on localhost was killed by signal 9" in job.out
    assert took < 5, took
    assert_nothing_left(job.job_id)


@pytest.mark.parametrize(("role", "rank"), ROLES)
def test_sigstop_mid_training(role: str, rank: int, launchkit_home: Path) -> None:
    """A hung process, not a dead one: the launcher sees nothing, the heartbeats must. The stopped
    process itself ends by SIGKILL after the grace period (SIGTERM does not reach it)."""
    job = Job([*launch_args(), *TRAINING], launchkit_home)
    job.wait_for("[worker 1] step 3")
    pid = job.pid(role, rank)
    job.inject(pid, signal.SIGSTOP)
    code, took = job.finish(timeout=30)
    assert code == 1, job.out
    if role == "scheduler":  # every other node misses the scheduler's answers
        assert "answered no heartbeat for 2 s: it died or stopped" in job.out, job.out
    else:  # the scheduler misses this node's heartbeats and names it
        assert f"aborting the job: {role} {rank} (host 127.0.0.1, pid {pid}) sent no heartbeat" in job.out
    # the root cause is the stopped node, not the one that noticed first (dmlc_env.ending)
    assert f"failed: {role} {rank} on localhost failed, as " in job.out, job.out
    assert took < 2 + 1 + 1 + 3, took  # heartbeat timeout + the wait for it (<= grace) + grace + slack
    assert_nothing_left(job.job_id)


@pytest.mark.parametrize(("role", "rank"), [("worker", 1), ("server", 0)])
def test_sigstop_at_startup(role: str, rank: int, launchkit_home: Path) -> None:
    """Stopped before it registered: no heartbeat is due yet, so the start-up bound
    (PS_START_TIMEOUT) ends the job, and the scheduler names the node that never registered."""
    job = Job([*launch_args("--env", "PS_START_TIMEOUT:3"), *TRAINING], launchkit_home)
    job.inject(job.pid(role, rank), signal.SIGSTOP)
    code, took = job.finish(timeout=30)
    assert code == 1, job.out
    # the node that never registered is the root cause, as the scheduler names it
    summary = job.out.partition("launchkit: error: ")[2]
    assert f"failed: {role} {rank} on localhost failed, as " in summary, job.out
    assert f"within 3 s (PS_START_TIMEOUT); missing: {role} {rank}" in summary, job.out
    assert took < 3 + 1 + 1 + 3, took
    assert_nothing_left(job.job_id)


def test_missing_nodes_named_by_rank_or_counted() -> None:
    """launchkit's nodes carry their rank (named); launch.py's do not (counted)."""
    from trainer_core.node.scheduler import NodeRecord, missing_nodes

    def rec(role: str, hint: int) -> NodeRecord:
        return NodeRecord(role, hint, "h", "", "", 1, "", "", peer=None)  # type: ignore[arg-type]

    expected = {"server": 1, "worker": 3}
    assert missing_nodes([rec("worker", 2), rec("worker", 0)], expected) == ["server 0", "worker 1"]
    assert missing_nodes([rec("server", -1), rec("worker", -1)], expected) == ["2 of 3 workers"]
    assert missing_nodes([rec("server", 0), *(rec("worker", i) for i in range(3))], expected) == []


def test_kill9_mid_training_with_a_restart(tmp_path: Path, launchkit_home: Path) -> None:
    """--max-restarts 1: the whole job starts again, resumes from rank 0's checkpoint and finishes."""
    ck = tmp_path / "model.npz"
    job = Job(
        [
            *launch_args("--max-restarts", "1", "--restart-backoff", "0.2"),
            *trainer("--steps", "60", "--delay", "0.05", "--checkpoint", str(ck), "--resume"),
        ],
        launchkit_home,
    )
    job.wait_for("[worker 1] step 5")
    job.inject(job.pid("worker", 1), signal.SIGKILL)
    code, _ = job.finish(timeout=60)
    assert code == 0, job.out
    assert "attempt 1 failed (worker 1 exit 137, signal 9); restarting" in job.out, job.out
    second = job.out.partition("(attempt 2 of 2)")[2]
    assert "] step 1\n" not in second, job.out  # resumed from the checkpoint, not from the start
    assert "[worker 0] done 0 120.0" in job.out and "[worker 1] done 1 120.0" in job.out, job.out
    assert_nothing_left(job.job_id)
