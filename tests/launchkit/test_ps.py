"""``launchkit ps``'s state of a job, in process: a lost job of which nothing is left here shows
as ``ended (lost)`` (issue 40: it showed ``lost`` for ever after its reaper had ended everything)."""

from __future__ import annotations

from dataclasses import replace

from launchkit.cli.ps import ENDED_LOST, shown_state
from launchkit.jobs import records as jobs

JOB = "1201-000000-0a0b0c"
LOST = jobs.JobRecord(
    id=JOB,
    name="train",
    backend="local",
    hosts=("localhost",),
    command=("python", "train.py"),
    cwd="/tmp",
    launcher_pid=2**22 + 7,  # no such process: the launcher is gone
    launcher_start=1,
    started_at=1.0e9,
)


def test_a_lost_local_job_with_nothing_left_has_ended() -> None:
    assert LOST.shown_state == "lost"
    assert shown_state(LOST, live=()) == ENDED_LOST
    assert shown_state(LOST, live=(JOB,)) == "lost"  # a process of it is left here


def test_what_cannot_be_told_here_stays_as_it_was() -> None:
    assert shown_state(replace(LOST, backend="ssh"), live=()) == "lost"  # its hosts are not looked at
    assert shown_state(replace(LOST, state="failed"), live=()) == "failed"


def test_a_lost_job_its_reaper_recorded_as_cleaned_up_has_ended_on_any_backend() -> None:
    for backend in ("ssh", "slurm", "local"):
        reaped = replace(LOST, backend=backend, reaped_at=2.0e9)
        assert shown_state(reaped, live=()) == ENDED_LOST
    # a record that finished after all keeps its own state
    assert shown_state(replace(LOST, state="failed", reaped_at=2.0e9), live=()) == "failed"
