"""Tests of the real Grid Engine fixture (tests/cluster/sge.py): jobs run, arrays, qdel, environment."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest

from .sge import GridEngine


def _qsub(sge: GridEngine, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`qsub -terse` with the job's cwd, stdout and stderr in tmp_path; returns the job id."""
    r = sge.run(
        ["qsub", "-terse", "-wd", str(tmp_path), "-o", str(tmp_path), "-e", str(tmp_path), *args],
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(".")[0]


def _shell(line: str) -> list[str]:
    """argv for `qsub -b y` that runs `line` in sh: qsub joins its arguments into one shell line
    (and the job's shell parses that), so each argument is quoted."""
    return ["-b", "y", *(shlex.quote(a) for a in ["sh", "-c", line])]


@pytest.mark.timeout(30)
def test_sync_true_exits_0(sge_local: GridEngine, tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = sge_local.run(
        ["qsub", "-sync", "y", "-wd", str(tmp_path), "-j", "y", "-o", str(tmp_path), "-b", "y", "true"]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exited with exit code 0" in r.stdout
    assert time.monotonic() - t0 < 10
    sge_local.wait_idle()


@pytest.mark.timeout(30)
def test_exit_status_reaches_sync_and_qacct(sge_local: GridEngine, tmp_path: Path) -> None:
    r = sge_local.run(["qsub", "-sync", "y", "-terse", "-wd", str(tmp_path), *_shell("exit 3")])
    assert r.returncode == 3, r.stdout + r.stderr
    job = r.stdout.split()[0]
    acct = sge_local.run(["qacct", "-j", job])  # accounting is flushed at once
    assert acct.returncode == 0, acct.stderr
    fields = dict(line.split(None, 1) for line in acct.stdout.splitlines() if " " in line.strip())
    assert fields["exit_status"].split()[0] == "3"
    assert fields["failed"].split()[0] == "0"


@pytest.mark.timeout(30)
def test_array_job_sees_task_ids(sge_local: GridEngine, tmp_path: Path) -> None:
    job = _qsub(
        sge_local,
        tmp_path,
        "-sync",
        "y",
        "-t",
        "1-3",
        *_shell(f"echo $JOB_ID > {tmp_path}/task.$SGE_TASK_ID"),
    )
    written = {p.name: p.read_text().strip() for p in tmp_path.glob("task.*")}
    assert written == {f"task.{i}": job for i in (1, 2, 3)}
    sge_local.wait_idle()


@pytest.mark.timeout(30)
def test_five_tasks_run_at_once(sge_local: GridEngine, tmp_path: Path) -> None:
    """all.q has 8 slots on 2 cores: each task waits until all 5 have started."""
    line = (
        f"touch {tmp_path}/started.$SGE_TASK_ID; i=0; "
        f'while [ "$(ls {tmp_path} | grep -c started)" -lt 5 ]; do '
        "i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done"
    )
    r = sge_local.run(
        [
            "qsub",
            "-sync",
            "y",
            "-wd",
            str(tmp_path),
            "-j",
            "y",
            "-o",
            str(tmp_path),
            "-t",
            "1-5",
            *_shell(line),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list(tmp_path.glob("started.*"))) == 5


@pytest.mark.timeout(60)
def test_qdel_removes_running_job(sge_local: GridEngine, tmp_path: Path) -> None:
    job = _qsub(sge_local, tmp_path, "-b", "y", "sleep", "60")
    deadline = time.monotonic() + 10
    while " r " not in sge_local.run(["qstat", "-u", "*"]).stdout:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    r = sge_local.run(["qdel", job])
    assert r.returncode == 0, r.stderr
    # (a bound on the wait, not a speed: at load 14 and more the job stayed "dr", deleting, for
    # more than 5 s before execd's report reached qmaster)
    deadline = time.monotonic() + 20
    while job in sge_local.job_ids():
        assert time.monotonic() < deadline, sge_local.run(["qstat", "-f", "-u", "*"]).stdout
        time.sleep(0.1)
    assert sge_local.job_ids() == []
    acct = sge_local.run(["qacct", "-j", job])  # a killed job: failed 100, exit_status 137
    assert "137" in acct.stdout, acct.stdout + acct.stderr


@pytest.mark.timeout(30)
def test_variables_pass_by_name(sge_local: GridEngine, tmp_path: Path) -> None:
    """`-v NAME` (no value) and `-V` take values from qsub's environment, not from its command line;
    a variable neither names does not reach the job (the execd's environment is an init script's)."""
    secret = "s3cr3t value; $HOME 'q'"
    env = {"LK_SGE_SECRET": secret, "LK_SGE_OTHER": "other"}
    line = f'printf %s "$LK_SGE_SECRET" > {tmp_path}/secret; printf %s "${{LK_SGE_OTHER-unset}}" > {tmp_path}/other'
    _qsub(sge_local, tmp_path, "-sync", "y", "-v", "LK_SGE_SECRET", *_shell(line), env=env)
    assert (tmp_path / "secret").read_text() == secret
    assert (tmp_path / "other").read_text() == "unset"

    _qsub(sge_local, tmp_path, "-sync", "y", "-V", *_shell(line), env=env)
    assert (tmp_path / "secret").read_text() == secret
    assert (tmp_path / "other").read_text() == "other"
    sge_local.wait_idle()
