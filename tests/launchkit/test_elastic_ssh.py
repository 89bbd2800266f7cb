"""An elastic job over ssh (a real sshd on loopback): the hostfile is read again while the job
runs, and the job grows to the slots it gains, up to MAX, a worker started on the host after the
job began (restart mode: the group restarts at the new size); a worker lost with workers that
handle a change themselves leaves the others running, and the job grows back after the cool-down."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.cluster.conftest import sshd_loopback  # noqa: F401
from tests.launchkit.procs import pids_with_job, record, start, wait_for_job, wait_until
from tests.launchkit.test_elastic_jobs import PROG, WAIT, finish, starts


def test_a_hostfile_that_gains_slots_grows_the_job(
    sshd_loopback,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{sshd_loopback.hostfile_line()} slots=1\n")
    args = ["launch", "-n", "1:3", "-s", "0", "-H", str(hostfile), "-i", str(sshd_loopback.identity)]
    args += ["--known-hosts", str(tmp_path / "known_hosts"), "--no-dashboard", "--grace-period", "2"]
    proc = start([*args, "--env", f"OUT:{out}", sys.executable, PROG], cwd=tmp_path)
    try:
        assert wait_until(lambda: 0 in starts(out), WAIT), starts(out)
        assert set(starts(out)) == {0}  # one slot: one worker
        hostfile.write_text(f"{sshd_loopback.hostfile_line()} slots=2\n")
        os.utime(hostfile, (1, 1))  # (a new time, whatever the clock's resolution)
        assert wait_until(lambda: {1, 2} <= set(starts(out)), WAIT), starts(out)
        seen = starts(out)
        assert sorted(seen[i][1]["RANK"] for i in (1, 2)) == ["0", "1"]
        assert {seen[i][1]["WORLD_SIZE"] for i in (1, 2)} == {"2"}
        assert {seen[i][1]["TORCHELASTIC_RESTART_COUNT"] for i in (1, 2)} == {"1"}
        job = wait_for_job(launchkit_home)
    finally:
        stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    assert "the job's hosts now: " in stderr and "epoch 1; joined: worker 1 on" in stderr, stderr
    assert [c["epoch"] for c in record(launchkit_home, job)["changes"]] == [1]
    assert not pids_with_job(job)


def test_a_worker_lost_over_ssh_leaves_the_others_running_in_process(
    sshd_loopback,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    """Shrink, then grow back after the cool-down, with workers that handle a change in their own
    process: the survivor keeps its pid, the new worker is started on the host by its watchdog."""
    out = tmp_path / "out"
    out.mkdir()
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{sshd_loopback.hostfile_line()} slots=2\n")
    args = ["launch", "-n", "1:2", "-s", "0", "-H", str(hostfile), "-i", str(sshd_loopback.identity)]
    args += ["--known-hosts", str(tmp_path / "known_hosts"), "--no-dashboard", "--blacklist-cooldown", "1"]
    args += ["--env", f"OUT:{out}", "--env", "FAIL:1", "--env", "IN_PROCESS:1", sys.executable, PROG]
    proc = start(args, cwd=tmp_path)
    try:
        assert wait_until(lambda: {0, 1} <= set(starts(out)), WAIT), starts(out)
        first = starts(out)[0][0]
        assert wait_until(lambda: 2 in starts(out), WAIT), starts(out)  # after the cool-down
        assert starts(out)[0][0] == first and set(starts(out)) == {0, 1, 2}
        job = wait_for_job(launchkit_home)
    finally:
        stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    assert "epoch 1; left: worker 1 on " in stderr and "(exit 3); in process" in stderr, stderr
    assert "epoch 2; joined: worker 2 on " in stderr
    assert not pids_with_job(job)
