"""The sweeps of ssh hosts after a job (``commands.Reach``), on namespace hosts with real sshd: a
restart's check that the last attempt left nothing contacts only the hosts that ran a process of
it, and ``kill --all -H`` starts python3 only on a host where a launchkit process is left (issue 28)."""

from __future__ import annotations

from pathlib import Path

from tests.launchkit.procs import run, wait_until

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
    busy.run("LAUNCHKIT_JOB_ID=orphan-9 setsid sleep 60 </dev/null >/dev/null 2>&1 &")
    assert wait_until(lambda: bool(busy.pids_with_env("LAUNCHKIT_JOB_ID=orphan-9")), 5)
    res = run(["kill", "--all", "-H", str(hostfile), *ssh_flags(group)])
    assert res.returncode == 0, res.stderr
    assert f"{empty.hostfile_line()}: ended 0 process(es)" in res.stdout
    assert f"{busy.hostfile_line()}: ended 1 process(es)" in res.stdout
    assert not busy.pids_with_env("LAUNCHKIT_JOB_ID=orphan-9")
    assert python3_starts(empty) == 0
    assert python3_starts(busy) == 1
