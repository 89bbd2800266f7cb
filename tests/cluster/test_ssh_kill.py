"""``launchkit kill`` of an ssh job on namespace hosts with real sshd: it logs in only to the hosts
whose watchdog did not confirm, with its ``bye``, that it had swept the job there (issue 28: at 128
hosts the sweep of every host again took kill 2 s more, for nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.test_ssh_sweep import logins, ssh_flags
from tests.launchkit.procs import record, run, start, wait_for_job, wait_until

# each worker leaves a process in a session of its own (setsid: its process group is not the
# worker's), which only a sweep by job id ends
WORKER = "setsid sleep 120 </dev/null >/dev/null 2>&1 & exec sleep 120"


def job_pids(h, job: str) -> list[int]:
    return h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}")


def launch(group, tmp_path: Path):
    hostfile = group.write_hostfile(tmp_path / "hosts", slots=1)
    args = [
        "launch",
        "-H",
        str(hostfile),
        *ssh_flags(group),
        "--grace-period",
        "1",
        "-n",
        "3",
        "-s",
        "0",
        "sh",
        "-c",
        WORKER,
    ]
    return start(args, cwd="/")


def test_kill_logs_in_to_no_host_whose_watchdog_said_bye(netns_hosts, tmp_path: Path, launchkit_home) -> None:
    """The launcher ends the job and each watchdog sweeps its host and says so: kill opens no ssh
    connection (it opened one to each of the 3), and reports each host; nothing is left."""
    group = netns_hosts(3)
    proc = launch(group, tmp_path)
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: all(len(job_pids(h, job)) >= 2 for h in group), 20)
        before = [logins(h) for h in group]
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        for h in group:
            assert f"{h.hostfile_line()}: ended 0 process(es)" in res.stdout, res.stdout
        assert [logins(h) for h in group] == before
        assert all(not job_pids(h, job) for h in group)
        assert proc.wait(timeout=15) == 143
        rec = record(launchkit_home, job)
        assert rec["state"] == "killed" and sorted(rec["remote"]["swept"]) == sorted(
            h.hostfile_line() for h in group
        )
    finally:
        proc.kill()
        proc.communicate()


def test_kill_sweeps_the_host_whose_watchdog_was_killed(netns_hosts, tmp_path: Path, launchkit_home) -> None:
    """SIGKILL of one host's watchdog: it says no bye, the launcher ends the job as that host's loss,
    and the processes there outlive it (the worker and what it left in its own session); kill logs
    in to that host only, and ends them."""
    group = netns_hosts(3)
    proc = launch(group, tmp_path)
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: all(len(job_pids(h, job)) >= 2 for h in group), 20)
        cut = group[2]
        pids = set(job_pids(cut, job))
        parents = {int(cut.run(f"ps -o ppid= -p {p}").stdout.strip() or 1) for p in pids}
        (watchdog,) = parents - pids - {1}
        cut.run(f"kill -KILL {watchdog}", check=True)
        assert proc.wait(timeout=30) != 0
        assert wait_until(lambda: not any(job_pids(h, job) for h in group[:2]), 10)
        left = job_pids(cut, job)  # the worker's sleep and the one in its own session
        assert left, "nothing outlived the watchdog: the test shows nothing"
        rec = record(launchkit_home, job)
        assert sorted(rec["remote"]["swept"]) == sorted(h.hostfile_line() for h in group[:2]), rec["remote"]
        before = [logins(h) for h in group]
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        assert [logins(h) - b for h, b in zip(group, before, strict=True)] == [0, 0, 1]
        assert f"{cut.hostfile_line()}: ended {len(left)} process(es)" in res.stdout, res.stdout
        assert not job_pids(cut, job)
    finally:
        proc.kill()
        proc.communicate()
