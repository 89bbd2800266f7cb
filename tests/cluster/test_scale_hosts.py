"""A launch at CI size across 16 namespace hosts (each its own sshd and process table), 4
processes on each: every process runs, ``launchkit kill`` ends them all on every host, and one
failing process ends the job naming it with nothing left (docs/scale.md has the bench at 128)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.launchkit.procs import LAUNCHKIT, job_ids, record, run, start, wait_for_job, wait_until

HOSTS, PER_HOST = 16, 4
N = HOSTS * PER_HOST
UP = "LK_SCALE_TEST_UP=1"  # in the environment of the test's sleeping processes only


def argv(group, tmp_path: Path, *command: str) -> list[str]:
    hostfile = group.write_hostfile(tmp_path / "hosts", slots=PER_HOST)
    return [
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "-n",
        str(N),
        "-s",
        "0",
        "--grace-period",
        "2",
        "--",
        *command,
    ]


def running(group) -> int:
    return sum(len(h.pids_with_env(UP)) for h in group)


def left(group, job: str) -> int:
    return sum(len(h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}")) for h in group)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sixteen_hosts_of_four_run_are_killed_and_fail_leaving_nothing(
    netns_hosts,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(HOSTS)

    # every process runs, once, on its host
    res = run(argv(group, tmp_path, "sh", "-c", "echo ran on $(hostname)"), cwd="/", timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if re.match(r"\[worker \d+\] ran on ", ln)]
    assert sorted(int(ln.split()[1].rstrip("]")) for ln in lines) == list(range(N)), res.stdout[-3000:]
    assert len({ln.rsplit(" ", 1)[1] for ln in lines}) == HOSTS  # each host its own (UTS namespace)
    first = wait_for_job(launchkit_home)
    assert wait_until(lambda: left(group, first) == 0, 10)

    # launchkit kill ends every process on every host
    proc = start(argv(group, tmp_path, "sh", "-c", f"exec env {UP} sleep 600"), cwd="/")
    try:
        assert wait_until(lambda: running(group) == N, 60, interval=0.2), running(group)
        job = [j for j in job_ids(launchkit_home) if j != first][-1]
        # the record lists every process's pid (the ssh backend asks every host at once, then
        # waits for the pids before the record is written: they were missing, all None)
        assert wait_until(lambda: all(p["pid"] for p in record(launchkit_home, job)["processes"]), 10)
        assert len(record(launchkit_home, job)["processes"]) == N
        t0 = time.monotonic()
        killed = subprocess.run([*LAUNCHKIT, "kill", job], capture_output=True, text=True, timeout=60)
        assert killed.returncode == 0, killed.stderr
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert wait_until(lambda: left(group, job) == 0, 10), left(group, job)
        assert time.monotonic() - t0 < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    # one failing process ends the job, named, and nothing is left
    script = f'if [ "$RANK" = 37 ]; then exit 3; fi; exec env {UP} sleep 600'
    res = run(argv(group, tmp_path, "sh", "-c", script), cwd="/", timeout=120)
    assert res.returncode == 3, res.stderr[-3000:]
    on_a_host = rf"root@{re.escape(group.subnet.prefix)}\.\d+:22"
    assert re.search(rf"failed: worker 37 on {on_a_host} exited with code 3", res.stderr), res.stderr[-3000:]
    last = wait_for_job(launchkit_home)
    assert wait_until(lambda: left(group, last) == 0, 10) and running(group) == 0
