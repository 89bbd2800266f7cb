"""launchkit.console: the merged output's writer when the machine refuses its writes (a full
disk, a reader that went away): the launcher keeps supervising, says it once, exits 74."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path

from launchkit.console import OutputWriter, refusal
from tests.launchkit.procs import LAUNCHKIT, pids_with_job


def test_a_refused_write_is_noted_and_the_writer_goes_on(capfd) -> None:
    """A write to /dev/full raised OSError out of the output thread (a traceback, and the job's
    pipes were never read again)."""
    with open("/dev/full", "wb") as full:
        fd = full.fileno()
        writer = OutputWriter(full, io.BytesIO())
        writer.write(b"[worker 0] ", b"hello\n", "out")
        writer.write(b"[worker 0] ", b"more\n", "out")  # dropped, silently
        error = refusal(full)
        assert error is not None and "No space left on device" in str(error)
        assert os.path.samestat(os.fstat(fd), os.stat(os.devnull))  # what is left goes nowhere
        full.write(b"x" * 100000)
        full.flush()
    err = capfd.readouterr().err
    assert err.count("cannot write the job's output to stdout: No space left on device") == 1, err


def test_a_launch_with_stdout_on_a_full_disk_says_so_once_and_exits_74(
    launchkit_home, tmp_path: Path
) -> None:
    """It printed a traceback from the output thread and exited 0."""
    jobs = {
        0: ["python3", "-c", "print('x' * 100000)\nfor i in range(200): print(i)"],
        3: ["sh", "-c", "seq 5000; exit 3"],
    }
    for code, cmd in jobs.items():
        argv = [*LAUNCHKIT, "launch", "-n", "2", "-s", "0", "--", *cmd]
        with open("/dev/full", "w") as full:
            res = subprocess.run(
                argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, cwd=tmp_path
            )
        assert res.returncode == (74 if code == 0 else 3), res.stderr
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
        assert res.stderr.count("cannot write the job's output to stdout: No space left on device") == 1
        job = re.search(r"job (\S+) \(", res.stderr)
        assert job is not None, res.stderr
        listed = subprocess.run(
            [*LAUNCHKIT, "ps", "--all", "--json"], capture_output=True, text=True, check=True
        )
        record = next(j for j in json.loads(listed.stdout) if j["id"] == job[1])
        assert record["state"] == ("succeeded" if code == 0 else "failed"), record
        assert pids_with_job(job[1]) == []
        logs = subprocess.run([*LAUNCHKIT, "logs", job[1], "--tail", "1"], capture_output=True, text=True)
        assert logs.returncode == 0 and logs.stdout.strip(), logs  # the output was kept


def test_a_reader_that_went_away_is_exit_74_without_a_word(launchkit_home, tmp_path: Path) -> None:
    """`launchkit logs JOB | head` (and every command whose output a pipe's reader left) exited 1
    without a word (rich's and typer's answer to EPIPE), where docs/exit-codes.md says 74."""
    (tmp_path / "hosts").write_text("".join(f"node{i}\n" for i in range(2000)))
    commands = [
        ["--version"],  # typer's echo
        ["hosts", "list", "-H", "hosts"],  # a rich table
        ["launch", "--dry-run", "-n", "3", "--", "true"],
        ["launch", "-n", "1", "-s", "0", "--", "seq", "20000"],  # the merged output
    ]
    for args in commands:
        r, w = os.pipe()
        os.close(r)
        try:
            res = subprocess.run(
                [*LAUNCHKIT, *args], stdout=w, stderr=subprocess.PIPE, text=True, timeout=60, cwd=tmp_path
            )
        finally:
            os.close(w)
        assert res.returncode == 74, (args, res.stderr)
        assert "error" not in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)


def test_an_error_that_cannot_be_written_is_exit_74(launchkit_home) -> None:
    """With stderr on a full disk, a refused command (`logs nojob`: exit 2) ended in a traceback
    nobody saw and exit 1, where a usage error of typer's and a failed job were exit 74."""
    for args in (["logs", "nojob"], ["hosts", "list", "-H", "/nonexistent/hosts"], ["launch", "--bogus"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run([*LAUNCHKIT, *args], stdout=subprocess.PIPE, stderr=full, timeout=30)
        assert res.returncode == 74, args
