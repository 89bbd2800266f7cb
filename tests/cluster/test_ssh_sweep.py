"""The sweeps of ssh hosts after a job (``commands.Reach``), on namespace hosts with real sshd: a
restart's check that the last attempt left nothing contacts only the hosts that ran a process of
it, and ``kill --all -H`` starts python3 only on a host where a launchkit process is left (issue 28):
there it scans (whose job each is), then sweeps the strays (issue 40)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.launchkit.procs import run, start, wait_for_job, wait_until

#: a python3 ahead of the real one on the ssh session's PATH, inside one host only (its mount
#: namespace is private): each start appends a line to the host's own /tmp
COUNTING_PYTHON3 = (
    "mount -t tmpfs lk-bin /usr/local/bin && "
    "printf '#!/bin/sh\\necho start >> /tmp/python3-starts\\nexec /usr/bin/python3 \"$@\"\\n'"
    " > /usr/local/bin/python3 && chmod +x /usr/local/bin/python3"
)


def ssh_flags(group) -> list[str]:
    return ["-i", str(group.identity), "--known-hosts", str(group.known_hosts)]


def logins(host) -> int:
    """How many ssh connections the host's sshd has accepted."""
    return host.log.read_text(errors="replace").count("Accepted publickey")


def python3_starts(host) -> int:
    return len(host.run("cat /tmp/python3-starts 2>/dev/null").stdout.split())


def test_a_restart_checks_only_the_hosts_that_ran_the_last_attempt(
    netns_hosts, tmp_path: Path, launchkit_home
) -> None:
    """3 hosts, 2 workers: before the second attempt, the check of what the first left goes to the
    hosts that ran a worker and whose watchdog did not confirm its sweep: none here (it went to
    every host of the hostfile, then to the 2 that ran a worker); the job then succeeds on its 2
    hosts."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(tmp_path / "hosts", slots=1)
    script = 'test "$LAUNCHKIT_RESTART_COUNT" -ge 1 || exit 3; echo "ran on $(hostname)"'
    res = run(
        [
            "launch",
            "-H",
            str(hostfile),
            *ssh_flags(group),
            "-n",
            "2",
            "-s",
            "0",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "0",
            "sh",
            "-c",
            script,
        ],
        cwd="/",
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "attempt 1 failed" in res.stderr and "could not check" not in res.stderr, res.stderr
    ran, idle = list(group)[:2], group[2]  # MXNet's placement with one slot a host: workers 0, 1
    assert res.stdout.count("ran on ") == 2 and idle.name not in res.stdout, res.stdout
    # each attempt connects to every host of the hostfile; between them no host is swept again:
    # every watchdog confirmed its own sweep with its bye (before that was recorded, one more
    # login to each of `ran`; before bb16823, to every host)
    assert logins(ran[0]) == logins(ran[1]) == logins(idle), [logins(h) for h in group]


def test_kill_all_on_hosts_starts_python_only_where_something_is_left(
    netns_hosts, tmp_path: Path, launchkit_home
) -> None:
    """``kill --all -H``: a shell's look first on each host; python3 (procscan's sweep) only on the
    host where a launchkit process is left (it started on every host: about 40 ms of CPU each)."""
    group = netns_hosts(2)
    for h in group:
        h.run(COUNTING_PYTHON3, check=True)
        assert h.ssh("command -v python3").stdout.strip() == "/usr/local/bin/python3"
    hostfile = group.write_hostfile(tmp_path / "hosts")
    empty, busy = group[0], group[1]
    stray = f"LAUNCHKIT_JOB_ID=orphan-9 LAUNCHKIT_JOB_HOME={socket.gethostname()}:/nonexistent-home"
    busy.run(f"{stray} setsid sleep 60 </dev/null >/dev/null 2>&1 &")
    assert wait_until(lambda: bool(busy.pids_with_env("LAUNCHKIT_JOB_ID=orphan-9")), 5)
    res = run(["kill", "--all", "-H", str(hostfile), *ssh_flags(group)])
    assert res.returncode == 0, res.stderr
    assert f"{empty.hostfile_line()}: ended 0 process(es)" in res.stdout
    assert f"{busy.hostfile_line()}: ended 1 process(es)" in res.stdout
    assert not busy.pids_with_env("LAUNCHKIT_JOB_ID=orphan-9")
    assert python3_starts(empty) == 0
    assert python3_starts(busy) == 2  # the scan (whose job is it: launchkit.jobs.owner), then the sweep


def test_kill_all_on_hosts_leaves_another_homes_job(netns_hosts, tmp_path: Path, launchkit_home) -> None:
    """A job launched over ssh from another LAUNCHKIT_HOME of this machine: ``kill --all -H`` in this
    one finds its process on the host, sees its home records it, and leaves it (issue 40)."""
    group = netns_hosts(1)
    hostfile = group.write_hostfile(tmp_path / "hosts")
    other = tmp_path / "other-home"
    launch = ["launch", "-H", str(hostfile), *ssh_flags(group), "-n", "1", "-s", "0", "sleep", "60"]
    proc = start(launch, cwd="/", env={**os.environ, "LAUNCHKIT_HOME": str(other)})
    try:
        job = wait_for_job(other, timeout=30)
        entry = f"LAUNCHKIT_JOB_ID={job}"
        assert wait_until(lambda: bool(group[0].pids_with_env(entry)), 15)
        res = run(["kill", "--all", "-H", str(hostfile), *ssh_flags(group)])
        assert res.returncode == 0, res.stderr
        assert f"{group[0].hostfile_line()}: ended 0 process(es)" in res.stdout
        assert f"{group[0].hostfile_line()}: left {job} (" in res.stdout, res.stdout
        assert f"recorded in {os.path.realpath(other)}" in res.stdout
        assert group[0].pids_with_env(entry)  # it runs on
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
