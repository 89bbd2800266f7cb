"""``launchkit kill`` with two ``LAUNCHKIT_HOME``s, real processes (issue 40): ``kill --all`` in
one home ends its own jobs and strays and leaves the other home's; every argument is checked
before anything is ended; ``--dry-run`` ends nothing; ``kill JOB`` of another home's job is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launchkit.procs import LAUNCHKIT, PROG, pids_with_job, run, wait_for_job, wait_until

PY = sys.executable


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "LAUNCHKIT_HOME": str(home)}


def launch_waiting(home: Path) -> tuple[subprocess.Popen[str], str]:
    """A running local job recorded in ``home`` (one worker that waits), once its worker runs."""
    proc = subprocess.Popen(
        [*LAUNCHKIT, "launch", "-n", "1", "-s", "0", PY, PROG, "wait"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=env_for(home),
    )
    job = wait_for_job(home)
    assert wait_until(lambda: len(pids_with_job(job)) == 1, 15), pids_with_job(job)
    return proc, job


@pytest.fixture
def two_homes(tmp_path: Path) -> Iterator[tuple[Path, str, Path, str]]:
    """Homes A and B, each with a running job: (A, its job, B, its job)."""
    started = []
    try:
        homes = []
        for name in ("a", "b"):
            home = tmp_path / name
            proc, job = launch_waiting(home)
            started.append(proc)
            homes += [home, job]
        yield homes[0], homes[1], homes[2], homes[3]
    finally:
        for p in started:
            if p.poll() is None:
                p.terminate()
            p.communicate(timeout=20)


def in_home(home: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return run(args, env=env_for(home))


def test_kill_all_ends_this_homes_job_and_leaves_the_others(two_homes) -> None:
    a, job_a, b, job_b = two_homes
    res = in_home(b, ["kill", "--all"])
    assert res.returncode == 0, res.stderr
    assert f"{job_b}: ended 1 process(es)" in res.stdout
    assert pids_with_job(job_b) == []
    assert len(pids_with_job(job_a)) == 1  # A's job runs on
    assert f"left {job_a} (1 process(es)): recorded in {os.path.realpath(a)}" in res.stdout
    assert job_a not in res.stdout.replace(f"left {job_a}", "")
    ps = in_home(a, ["ps", "--json"])
    assert '"shown_state": "running"' in ps.stdout


@pytest.mark.parametrize(
    "extra, said",
    [
        (["-H", "/nonexistent"], "/nonexistent: no such file"),
        (
            ["-H", "HOSTS", "-i", "/nonexistent-key"],
            "-i /nonexistent-key: cannot read the key file /nonexistent-key: no such file",
        ),
        (["-H", "HOSTS", "-i", ""], "Invalid value for '-i' / '--identity': '' is empty"),
    ],
)
def test_bad_arguments_end_nothing(two_homes, tmp_path: Path, extra: list[str], said: str) -> None:
    _a, job_a, b, job_b = two_homes
    (tmp_path / "hosts").write_text("127.0.0.1:1\n")
    args = [str(tmp_path / "hosts") if x == "HOSTS" else x for x in extra]
    res = in_home(b, ["kill", "--all", *args])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert said in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""  # nothing was ended, nor said to be
    assert len(pids_with_job(job_a)) == 1 and len(pids_with_job(job_b)) == 1


def test_dry_run_lists_and_ends_nothing(two_homes) -> None:
    a, job_a, b, job_b = two_homes
    for flag in ("--dry-run", "--list"):
        res = in_home(b, ["kill", "--all", flag])
        assert res.returncode == 0, res.stderr
        assert f"would end {job_b} (1 process(es) here): recorded here" in res.stdout
        assert f"would leave {job_a} (1 process(es)): recorded in {os.path.realpath(a)}" in res.stdout
        assert "ended nothing (--dry-run)" in res.stdout
    one = in_home(b, ["kill", job_b, "--dry-run"])
    assert one.returncode == 0 and f"would end {job_b} (1 process(es) here, running)" in one.stdout
    assert len(pids_with_job(job_a)) == 1 and len(pids_with_job(job_b)) == 1


def test_kill_of_another_homes_job_is_refused(two_homes) -> None:
    a, job_a, b, _job_b = two_homes
    res = in_home(b, ["kill", job_a])
    assert res.returncode == 2
    assert f"job {job_a} is not this home's: recorded in {os.path.realpath(a)}" in res.stderr
    assert len(pids_with_job(job_a)) == 1


def test_a_stray_is_ended_and_a_process_naming_no_home_is_left(tmp_path: Path) -> None:
    """A process whose home on this machine records nothing (the home was removed) is a stray;
    one started by hand with only LAUNCHKIT_JOB_ID may be another home's job: left, with why."""
    stray, bare = "1201-000000-57a7a7", "1201-000000-ba4eba"
    gone = f"{socket.gethostname()}:{tmp_path / 'removed-home'}"
    procs = [
        subprocess.Popen(
            ["sleep", "60"], env={**os.environ, "LAUNCHKIT_JOB_ID": stray, "LAUNCHKIT_JOB_HOME": gone}
        ),
        subprocess.Popen(["sleep", "60"], env={**os.environ, "LAUNCHKIT_JOB_ID": bare}),
    ]
    try:
        assert wait_until(lambda: pids_with_job(stray) and pids_with_job(bare), 10)
        res = in_home(tmp_path / "b", ["kill", "--all"])
        assert res.returncode == 0, res.stderr
        assert f"{stray}: ended 1 process(es)" in res.stdout
        assert f"left {bare} (1 process(es)): they name no home" in res.stdout
        assert pids_with_job(stray) == [] and len(pids_with_job(bare)) == 1
        by_id = in_home(tmp_path / "b", ["kill", bare])  # named by its id: ended
        assert by_id.returncode == 0 and pids_with_job(bare) == [], by_id.stderr
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("command", [["kill"], ["logs"], ["top", "--once"]])
def test_an_empty_job_id_is_said_to_be_empty(command: list[str]) -> None:
    res = run([command[0], "", *command[1:]])
    assert res.returncode == 2
    assert "Invalid value for 'job_id': '' is empty" in res.stderr, res.stderr


def test_a_job_is_recorded_before_its_processes_start_and_they_name_its_home(tmp_path: Path) -> None:
    """Each process finds its job's record in the home its LAUNCHKIT_JOB_HOME names as it starts:
    before, the record was written once the processes had started, and a process in that window
    would have been a stray to ``kill --all`` in another home."""
    home = tmp_path / "h"
    check = 'p="${LAUNCHKIT_JOB_HOME#*:}"; test -n "$p" && test -e "$p/jobs/$LAUNCHKIT_JOB_ID.json" && echo "$LAUNCHKIT_JOB_HOME"'
    res = run(["launch", "-n", "2", "-s", "1", "sh", "-c", check], env=env_for(home))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"{socket.gethostname()}:{os.path.realpath(home)}") == 4, res.stdout


def test_ssh_files_are_checked_before_any_host_is_contacted(tmp_path: Path) -> None:
    """``hosts check -i MISSING`` said each host was unreachable (exit 1) after trying them all."""
    (tmp_path / "hosts").write_text("127.0.0.1:1\n")
    res = run(["hosts", "check", "-H", str(tmp_path / "hosts"), "-i", str(tmp_path / "no-key")])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert (
        f"-i {tmp_path / 'no-key'}: cannot read the key file {tmp_path / 'no-key'}: no such file"
        in res.stderr
    )
    assert "unreachable" not in res.stdout + res.stderr


@pytest.mark.parametrize("command", [["kill", "--all"], ["hosts", "list"], ["hosts", "check"]])
def test_an_empty_hostfile_option_is_said_to_be_empty(command: list[str]) -> None:
    res = run([*command, "-H", ""])  # it read as "." (the current directory)
    assert res.returncode == 2 and "Invalid value for '-H' / '--hostfile': '' is empty" in res.stderr, (
        res.stderr
    )
