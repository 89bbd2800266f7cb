"""--log-dir (launchkit.logdir): what is not a directory says so, and a directory a running launch
writes to is refused to a second one (exit 2) until the first ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from launchkit.errors import UsageError
from launchkit.logdir import check_log_dir, hold_log_dir, holder_pid
from tests.launchkit.procs import pids_with_job, run, start, wait_for_job, wait_until


def refusal(log_dir: Path) -> str:
    with pytest.raises(UsageError) as info:
        check_log_dir(log_dir)
    assert info.value.exit_code == 2
    return info.value.message


def test_what_is_not_a_directory_says_what_it_is(tmp_path: Path) -> None:
    """/dev/null said 'cannot write there: File exists'."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    assert (
        refusal(Path("/dev/null")) == "--log-dir /dev/null: /dev/null is a character device, not a directory"
    )
    assert (
        refusal(tmp_path / "file") == f"--log-dir {tmp_path}/file: {tmp_path}/file is a file, not a directory"
    )
    assert refusal(Path("/dev/null/x/y")) == (
        "--log-dir /dev/null/x/y: /dev/null is a character device (in the path of /dev/null/x/y), not a directory"
    )
    assert refusal(tmp_path / "dangling") == (
        f"--log-dir {tmp_path}/dangling: {tmp_path}/dangling is a symbolic link to nothing, not a directory"
    )
    assert not (tmp_path / "nothing").exists()


def test_a_directory_that_takes_no_file_says_so() -> None:
    """/proc/1 said only 'No such file or directory'."""
    assert refusal(Path("/proc/1")) == (
        "--log-dir /proc/1: cannot write there: No such file or directory (that directory takes no new file)"
    )


def test_a_missing_directory_is_made_and_a_link_to_one_is_taken(tmp_path: Path) -> None:
    check_log_dir(tmp_path / "a" / "b")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    check_log_dir(tmp_path / "link")
    assert os.listdir(tmp_path / "a" / "b") == []  # the probe is gone


def test_a_held_directory_is_refused_until_released(tmp_path: Path) -> None:
    held = hold_log_dir(tmp_path / "logs")
    with pytest.raises(UsageError) as info:
        hold_log_dir(tmp_path / "logs")
    assert info.value.message.startswith(
        f"--log-dir {tmp_path}/logs is in use by another launch (pid {os.getpid()}), still running: "
    )
    assert "give another --log-dir, or wait for that job to end" in info.value.message
    held.release()
    held.release()  # once is enough
    hold_log_dir(tmp_path / "logs").release()
    assert os.listdir(tmp_path / "logs") == []  # nothing left in it


def test_the_holder_is_read_from_proc_locks() -> None:
    st = os.stat_result((0o40755, 2188115, os.makedev(0xFE, 0), 2, 0, 0, 4096, 0, 0, 0))
    locks = (
        "1: POSIX  ADVISORY  WRITE 11 fe:00:2188115 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 4242 fe:00:2188115 0 EOF\n"
        "3: FLOCK  ADVISORY  WRITE 5 fe:00:21881150 0 EOF\n"
    )
    assert holder_pid(st, locks) == 4242
    assert holder_pid(st, locks.splitlines()[0]) is None


def test_two_launches_at_once_with_one_log_dir(tmp_path: Path) -> None:
    """The second appended into the first one's worker-0.stdout without a word; now it is refused
    while the first runs, and taken once it has ended."""
    logs, marker = tmp_path / "logs", tmp_path / "started"
    first = start(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--log-dir",
            str(logs),
            "sh",
            "-c",
            f"touch {marker}; exec sleep 60",
        ],
        cwd=tmp_path,
    )
    try:
        assert wait_until(marker.exists, 20), first.stderr and first.stderr.read()
        res = run(["launch", "-n", "1", "-s", "0", "--log-dir", str(logs), "echo", "second"], cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert f"--log-dir {logs} is in use by another launch (pid {first.pid}), still running" in res.stderr
        assert (logs / "worker-0.stdout").read_text() == ""
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=30)
    res = run(["launch", "-n", "1", "-s", "0", "--log-dir", str(logs), "echo", "second"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (logs / "worker-0.stdout").read_text() == "second\n"


def test_a_killed_launcher_lets_the_directory_go(tmp_path: Path, launchkit_home: Path) -> None:
    """The kernel lets the hold go however the launcher ends (SIGKILL too)."""
    logs, marker = tmp_path / "logs", tmp_path / "started"
    first = start(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--log-dir",
            str(logs),
            "sh",
            "-c",
            f"touch {marker}; exec sleep 60",
        ],
        cwd=tmp_path,
    )
    assert wait_until(marker.exists, 20)
    job = wait_for_job(launchkit_home)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    try:
        res = run(["launch", "-n", "1", "-s", "0", "--log-dir", str(logs), "true"], cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    finally:  # the launcher's reaper ends its job
        assert wait_until(lambda: pids_with_job(job) == [], 20), pids_with_job(job)
