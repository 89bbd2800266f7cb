"""The launcher's end of the pipe to its reaper, and what the reaper records of a lost job
(in-process); the reaper's sweeps themselves are tested on real jobs in tests/faults/, and of a
lost ssh job in tests/cluster/test_ssh_ends.py."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launchkit.jobs import records as jobs
from launchkit.jobs.reaper import CLOSED, Cleaned, Cleanups, record_reaped, run_cleanups

JOB = "1202-000000-0a0b0c"
LOST = jobs.JobRecord(
    id=JOB,
    name="train",
    backend="slurm",
    hosts=("node1",),
    command=("python", "train.py"),
    cwd="/tmp",
    launcher_pid=2**22 + 7,  # no such process: the launcher is gone
    launcher_start=1,
    started_at=1.0e9,
)


def test_cleanups_reach_the_pipe_until_it_is_closed_and_never_a_file_that_took_its_number(
    tmp_path: Path,
) -> None:
    r, w = os.pipe()
    cleanups = Cleanups(w)
    cleanups.add(["scancel", "42"], ends_job=True)
    cleanups.add(["rm", "-rf", "--", "/tmp/x"])
    assert os.read(r, 1000) == b'{"ends_job": ["scancel", "42"]}\n["rm", "-rf", "--", "/tmp/x"]\n'
    cleanups.close()
    assert os.read(r, 1000) == CLOSED + b"\n"  # the launcher ends the job itself: it did not die
    victim = tmp_path / "record.json"
    fd = os.open(victim, os.O_WRONLY | os.O_CREAT)  # takes the number the pipe gave back
    try:
        assert fd == w
        cleanups.add(["scancel", "43"])  # a late engine reader: dropped
        cleanups.close()  # twice: nothing
    finally:
        os.close(fd)
        os.close(r)
    assert victim.read_bytes() == b""


@pytest.mark.proc
def test_cleanups_say_whether_each_command_exited_0_and_whether_one_ended_the_job() -> None:
    ok = f'["{sys.executable}", "-c", "pass"]'.encode()
    bad = f'["{sys.executable}", "-c", "raise SystemExit(3)"]'.encode()
    assert run_cleanups(ok + b"\n" + CLOSED + b"\n") == Cleaned(ok=True, ended_job=False)
    assert run_cleanups(b'{"ends_job": ' + ok + b"}\n") == Cleaned(ok=True, ended_job=True)
    assert run_cleanups(ok + b"\n" + bad + b"\n") == Cleaned(ok=False, ended_job=False)
    assert run_cleanups(b'{"ends_job": ' + bad + b"}\n") == Cleaned(ok=False, ended_job=False)
    assert not run_cleanups(b'["/nonexistent/scancel", "1"]\n').ok


def test_a_lost_engine_job_is_recorded_as_reaped_only_once_the_engines_cancel_succeeded(
    launchkit_home: Path,
) -> None:
    jobs.save(LOST)  # a slurm job
    assert record_reaped(JOB, 1.0, Cleaned(ok=False, ended_job=True)) is None  # a command failed
    assert record_reaped(JOB, 1.0, Cleaned(ok=True, ended_job=False)) is None  # its id never known
    assert jobs.load(JOB).reaped_at is None  # type: ignore[union-attr]
    reaped = record_reaped(JOB, 1.0, Cleaned(ok=True, ended_job=True))
    assert reaped is not None and reaped.reaped_at is not None
    loaded = jobs.load(JOB)
    assert loaded is not None and loaded.reaped_at == reaped.reaped_at and loaded.state == "running"


def test_a_lost_job_here_needs_only_the_sweep_here_and_mpi_is_not_known(launchkit_home: Path) -> None:
    jobs.save(replace(LOST, backend="local"))
    assert record_reaped(JOB, 1.0, Cleaned()) is not None
    jobs.save(replace(LOST, backend="mpi"))  # its remote ranks are Open MPI's daemons' to end
    assert record_reaped(JOB, 1.0, Cleaned()) is None


def test_a_record_that_ended_or_is_missing_is_left_alone(launchkit_home: Path) -> None:
    assert record_reaped(JOB, 1.0, Cleaned(ended_job=True)) is None  # no record (the launcher died before it)
    jobs.save(replace(LOST, state="failed", exit_code=1))
    assert record_reaped(JOB, 1.0, Cleaned(ended_job=True)) is None
    assert jobs.load(JOB).reaped_at is None  # type: ignore[union-attr]
