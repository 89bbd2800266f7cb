"""Faults of hosts and of the launcher over ssh, on network-namespace hosts (each its own process
table, /srv and /dev/shm): a host whose link goes down mid-training, a host unreachable at launch,
the launcher SIGKILLed during the rsync of --sync-dst-dir and during start-up.

The job is trainer_core's (tests/faults/trainprog.py) run by a venv of Debian's python3 that the
hosts share with this machine under /var/tmp; the scheduler runs here, servers and workers on
the hosts. Every case ends with nothing of the job on this machine or on any host: no process,
no rsync, no /dev/shm segment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.faultjob import FAST_LIVENESS, TRAINPROG, Job, assert_nothing_left
from tests.launchkit.procs import run, wait_until

ROOT = Path(__file__).resolve().parents[2]
DST = "/srv/lkfault"


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    """What --sync-dst-dir ships: the trainer program and the packages it imports."""
    d = tmp_path / "job"
    d.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):
        shutil.copytree(ROOT / pkg, d / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TRAINPROG, d / "trainprog.py")
    return d


def ssh_launch(group, hostfile: Path, python: str, *extra: str, steps: int = 400) -> list[str]:
    return [
        "launch",
        "-n",
        "2",
        "-s",
        "1",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--sync-dst-dir",
        DST,
        "--grace-period",
        "1",
        *FAST_LIVENESS,
        *extra,
        python,
        "trainprog.py",
        "--steps",
        str(steps),
        "--delay",
        "0.05",
    ]


def nothing_on_hosts(group, job_id: str | None, timeout: float = 10) -> None:
    """No process of the job, no rsync and no /dev/shm segment of the job on any live host."""

    def clean() -> bool:
        for h in group:
            if not h.alive():
                continue
            if job_id and h.pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}"):
                return False
            if h.run("pgrep -x rsync").stdout.strip():
                return False
        return True

    assert wait_until(clean, timeout, 0.2), {
        h.name: h.run("ps -eo pid,args").stdout for h in group if h.alive()
    }
    for h in group:
        if h.alive() and job_id:
            assert f"launchkit-{job_id}-" not in h.run("ls /dev/shm").stdout


@pytest.mark.timeout(120)
def test_link_down_mid_training(netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path) -> None:
    """The host of worker 1 loses its link: the launcher's heartbeat to that host's watchdog and the
    job's own heartbeats both go silent; the job ends non-zero naming the host, and the cut-off
    host's watchdog ends its processes on its own."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    job = Job(
        ssh_launch(group, hostfile, host_python, "--heartbeat-timeout", "2"), launchkit_home, cwd=jobdir
    )
    job.wait_for("[worker 1] step 3", timeout=60)
    cut = group[2]  # MXNet's placement: server 0 on host 1, worker 0 on host 2, worker 1 on host 3
    assert cut.pids_with_env(f"LAUNCHKIT_JOB_ID={job.job_id}")
    subprocess.run(["ip", "link", "set", cut.veth, "down"], check=True)
    job.fault_at = time.monotonic()
    code, took = job.finish(timeout=40)
    assert code != 0, job.out
    assert cut.address in job.out, job.out
    assert took < 2 + 1 + 6, took  # heartbeat timeout, grace, slack
    # the cut-off host is on its own: its watchdog ends the job's processes there
    assert wait_until(lambda: not cut.pids_with_env(f"LAUNCHKIT_JOB_ID={job.job_id}"), 10), (
        "cut host kept running"
    )
    assert_nothing_left(job.job_id)
    nothing_on_hosts(group, job.job_id)


@pytest.mark.timeout(120)
def test_host_unreachable_at_launch(
    netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path
) -> None:
    group = netns_hosts(3)
    subprocess.run(["ip", "link", "set", group[1].veth, "down"], check=True)  # up, but cut off
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    job = Job(ssh_launch(group, hostfile, host_python, "--connect-timeout", "2"), launchkit_home, cwd=jobdir)
    code, took = job.finish(timeout=30)
    assert code == 1, job.out
    assert f"1 of 3 host(s) unreachable, nothing started: {group[1].hostfile_line()}" in " ".join(
        job.out.split()
    )
    assert took < 2 + 4, took
    assert not list((launchkit_home / "jobs").glob("*.json")), "a job was recorded"
    nothing_on_hosts(group, None)
    assert all("lkfault" not in h.run("ls /srv").stdout for h in group), "synced anyway"


def _rsyncs_of(launcher: int) -> list[int]:
    """This machine's rsync processes started by the launcher (and their ssh: same process group)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid=,comm="], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()]
    groups = {int(pgid) for pid, ppid, pgid, comm in rows if comm == "rsync" and int(ppid) == launcher}
    return [int(pid) for pid, ppid, pgid, comm in rows if int(pgid) in groups]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if Path(f"/proc/{pid}").exists()
        else "X"
    )
    return state not in ("Z", "X")


@pytest.mark.timeout(120)
def test_launcher_sigkill_during_rsync(
    netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path
) -> None:
    """SIGKILL of the launcher while --sync-dst-dir copies a large file over slow links: the rsyncs
    (each in a session of its own, so no terminal reaches them) must not go on without it."""
    group = netns_hosts(2)
    for h in group:  # 8 Mbit/s toward each host: 6 MB take about 6 s
        subprocess.run(
            [
                "tc",
                "qdisc",
                "add",
                "dev",
                h.veth,
                "root",
                "tbf",
                "rate",
                "8mbit",
                "burst",
                "32kb",
                "latency",
                "400ms",
            ],
            check=True,
        )
    (jobdir / "data.bin").write_bytes(os.urandom(6 << 20))
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    job = Job(ssh_launch(group, hostfile, host_python), launchkit_home, cwd=jobdir)
    rsyncs: set[int] = set()

    def copying() -> bool:
        rsyncs.update(_rsyncs_of(job.proc.pid))
        return len(rsyncs) >= 4  # an rsync and its ssh per host

    assert wait_until(copying, 20), job.out
    time.sleep(0.5)
    job.inject(job.proc.pid, signal.SIGKILL)
    job.proc.wait(5)
    # the rsyncs at once, and their ssh with them (not only once the far end has closed: seconds here)
    assert wait_until(lambda: not any(_alive(p) for p in rsyncs), 1.5), [
        Path(f"/proc/{p}/cmdline").read_bytes() for p in rsyncs if _alive(p)
    ]
    nothing_on_hosts(group, None)


@pytest.mark.timeout(120)
def test_launcher_sigkill_at_startup_over_ssh(
    netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path
) -> None:
    """SIGKILL of the launcher as the job's processes start on the hosts: each host's watchdog loses
    its ssh connection and ends what it started; the reaper ends the scheduler here."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    job = Job(ssh_launch(group, hostfile, host_python), launchkit_home, cwd=jobdir)
    job_id = job.job_id
    assert wait_until(lambda: any(h.pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}") for h in group), 30), job.out
    job.inject(job.proc.pid, signal.SIGKILL)
    job.proc.wait(5)
    assert "step 1" not in job.out, job.out
    assert_nothing_left(job_id)
    nothing_on_hosts(group, job_id)
    assert time.monotonic() - (job.fault_at or 0) < 10


@pytest.mark.slow  # about 15 s: the second job must outlive the first's kill
@pytest.mark.timeout(120)
def test_two_jobs_on_the_same_hosts(
    netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path
) -> None:
    """Two jobs on the same three hosts at once; `launchkit kill` of the first ends its processes on
    every host (swept by job id over ssh) and leaves the second to train to the end."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    first = Job(ssh_launch(group, hostfile, host_python, "--job-name", "first"), launchkit_home, cwd=jobdir)
    first.wait_for("[worker 1] step 1", timeout=60)
    first_id = first.job_id
    second = Job(
        ssh_launch(group, hostfile, host_python, "--job-name", "second", steps=120),
        launchkit_home,
        cwd=jobdir,
    )
    jobs_dir = launchkit_home / "jobs"
    assert wait_until(lambda: len(list(jobs_dir.glob("*.json"))) == 2, 30)
    second_id = next(p.stem for p in jobs_dir.glob("*.json") if p.stem != first_id)
    second.wait_for("[worker 1] step 3", timeout=60)
    killed = run(["kill", first_id, "--grace-period", "1"], timeout=60)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    # at once, before the second job can have finished on its own
    assert all(h.pids_with_env(f"LAUNCHKIT_JOB_ID={second_id}") for h in group), "the other job was hit"
    code, _ = first.finish(timeout=20)
    assert code == 128 + signal.SIGTERM, first.out
    assert_nothing_left(first_id)
    nothing_on_hosts(group, first_id)
    code, _ = second.finish(timeout=60)
    assert code == 0, second.out
    assert "[worker 0] done 0 240.0" in second.out and "[worker 1] done 1 240.0" in second.out, second.out
    assert_nothing_left(second_id)
    nothing_on_hosts(group, second_id)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", ["KILL", "STOP"])
def test_worker_on_a_host_killed_or_stopped(
    netns_hosts, host_python: str, jobdir: Path, launchkit_home: Path, sig: str
) -> None:
    """kill -9 or SIGSTOP of worker 1 on its namespace host (through the host's own process table):
    its watchdog reports the death, the heartbeats the hang; the job ends naming worker 1."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    job = Job(ssh_launch(group, hostfile, host_python), launchkit_home, cwd=jobdir)
    job.wait_for("[worker 1] step 3", timeout=60)
    host = group[2]  # worker 1's host (MXNet's placement)
    find = (
        "grep -lz '^LAUNCHKIT_ROLE_RANK=1$' $(grep -lz '^DMLC_ROLE=worker$' /proc/[0-9]*/environ) 2>/dev/null"
    )
    pids = {p.split("/")[2] for p in host.run(find).stdout.split()} & {
        str(p) for p in host.pids_with_env(f"LAUNCHKIT_JOB_ID={job.job_id}")
    }
    worker = min(pids, key=int)  # the program itself, not a child of it
    host.run(f"kill -{sig} {worker}", check=True)
    job.fault_at = time.monotonic()
    code, took = job.finish(timeout=40)
    if sig == "KILL":
        assert code == 137, job.out
        assert "failed: worker 1 on " in job.out and "was killed by signal 9" in job.out, job.out
        assert took < 5, took
    else:
        assert code == 1, job.out
        assert f"worker 1 (host {host.address}" in job.out and "sent no heartbeat for 2 s" in job.out, job.out
        assert took < 2 + 1 + 4, took
    assert_nothing_left(job.job_id)
    nothing_on_hosts(group, job.job_id)
