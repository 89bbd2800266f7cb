"""``launchkit ps``: the jobs recorded on this machine."""

from __future__ import annotations

import time
from collections.abc import Collection

import typer

from launchkit.cli.app import get_app
from launchkit.cli.coercion import Command
from launchkit.cli.top import runs_here
from launchkit.console import Ui
from launchkit.errors import UsageError
from launchkit.hostside import procscan
from launchkit.jobs import detached, live
from launchkit.jobs import records as jobs


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


#: the states ``ps`` lists without ``--all``
ACTIVE = ("running", "submitting", "lost")
COLUMNS = ("job id", "name", "launcher", "state", "attempt", "procs", "hosts", "started", "exit")


def shown_step_loss(figures: tuple[int | None, float | None] | None) -> tuple[str, str]:
    """A running job's latest step and loss, from its live file (blank when it reports none)."""
    step, loss = figures or (None, None)
    return ("" if step is None else str(step)), ("" if loss is None else f"{loss:.4g}")


#: a lost job (its launcher died without recording the end) of which nothing runs any more: its
#: reaper recorded that it ended everything (``reaped_at``: the sweep here, on each ssh host, the
#: engine's cancel), or it ran only on this machine and no process of it is left here
ENDED_LOST = "ended (lost)"


def shown_state(record: jobs.JobRecord, live: Collection[str]) -> str:
    """The state ``ps`` shows: the record's (``shown_state``), but ``ENDED_LOST`` for a lost job
    that its reaper recorded as cleaned up, or whose processes all ran here (its backend's) when
    none carrying its id (``live``) is left."""
    state = record.shown_state
    if state == "lost" and (
        record.reaped_at is not None or (runs_here(record.backend) and record.id not in live)
    ):
        return ENDED_LOST
    return state


def register(app: typer.Typer) -> None:
    @app.command(
        cls=Command,
        help="List launchkit jobs (a job whose launcher died shows as lost; as ended (lost) once nothing of it is left).",
    )
    def ps(
        ctx: typer.Context,
        job_id: str = typer.Argument(
            None, help="One job: its processes, and an elastic job's membership changes."
        ),
        show_all: bool = typer.Option(False, "-a", "--all", help="Include finished jobs."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    ) -> None:
        ui = get_app(ctx).ui
        if job_id is not None:
            show_job(ui, job_id, as_json)
            return
        records = [detached.refresh(r) for r in jobs.load_all(jobs.skipping(ui.warn))]
        here = set(procscan.scan()) if any(r.shown_state == "lost" for r in records) else set()
        states = {r.id: shown_state(r, here) for r in records}
        records = [r for r in records if show_all or states[r.id] in ACTIVE]
        training = {r.id: live.step_loss(r.id) for r in records if states[r.id] == "running"}
        if as_json:
            none = (None, None)
            ui.json(
                [
                    {
                        **r.to_json(),
                        "shown_state": states[r.id],
                        **dict(zip(("step", "loss"), training.get(r.id, none), strict=True)),
                    }
                    for r in records
                ]
            )
            return
        if not records:
            ui.text("no jobs" if show_all else "no running jobs (launchkit ps --all shows finished ones)")
            return
        ui.table(
            None,
            [*COLUMNS, "step", "loss"],
            [
                [
                    r.id,
                    r.name,
                    r.backend,
                    states[r.id] + (f", epoch {r.changes[-1].epoch}" if r.changes else ""),
                    f"{r.attempt + 1}/{r.max_restarts + 1}",  # 1-based: attempt 0 is the first
                    len(r.processes),
                    ",".join(r.hosts),
                    _when(r.started_at),
                    r.exit_code,
                    *shown_step_loss(training.get(r.id)),
                ]
                for r in records
            ],
        )


def show_job(ui: Ui, job_id: str, as_json: bool) -> None:
    """``ps JOB_ID``: every process the job ran (an elastic job's every worker, the epoch it
    joined and how it ended), then each membership change (epoch, who left and why, who joined)."""
    jobs.check_job_id(job_id)
    record = jobs.load(job_id, jobs.refuse)
    if record is None:
        raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
    if as_json:
        ui.json(record.to_json())
        return
    ui.table(
        f"job {record.id} ({record.name}): {record.shown_state}",
        ("role", "rank", "host", "pid", "epoch", "ended"),
        [
            (
                p.role,
                p.rank,
                p.host,
                "" if p.pid is None else p.pid,
                "" if p.epoch is None else p.epoch,
                p.ended or "",
            )
            for p in record.processes
        ],
    )
    for change in record.changes:
        ui.text(f"{_when(change.at)}  {change.line()}")
