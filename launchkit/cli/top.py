"""``launchkit top JOB_ID``: the dashboard of a job running elsewhere (e.g. another terminal).

A job launched on this machine writes its live file (``launchkit.jobs.live``) as it runs: ``top``
renders the same view from it as the launching terminal shows (process rows with CPU and memory,
host figures, the training panel, the output pane, the root cause of a failure). A job without
one (a detached batch job, a job of an older launchkit) shows the rows its record holds."""

from __future__ import annotations

import dataclasses
import time

import typer
from rich.console import RenderableType

from launchkit import backends
from launchkit.cli.app import get_app
from launchkit.cli.coercion import Command
from launchkit.console import Ui
from launchkit.dashboard import DashboardState, ProcRow, fit, render
from launchkit.errors import UsageError
from launchkit.hostside import procscan
from launchkit.hostside.hoststat import GroupMeter
from launchkit.jobs import detached, live
from launchkit.jobs import records as jobs


def state_of(record: jobs.JobRecord, meter: GroupMeter) -> DashboardState:
    """The record-only view: the processes the record names, CPU and memory of local ones."""
    record = detached.refresh(record)  # a batch job: its state from the engine
    pids = {p.pid for p in record.processes if p.pid and procscan.alive(p.pid)}
    usage = meter.sample(pids) if runs_here(record.backend) else {}
    rows = []
    # a job that succeeded: every process exited 0 ("ok", as the live view says); otherwise a
    # process no longer alive ended, how the record does not say
    gone = "ok" if record.state == "succeeded" and record.exit_code == 0 else "ended"
    for p in record.processes:
        alive = p.pid in pids
        cpu, rss = usage.get(p.pid, (None, None)) if p.pid else (None, None)
        state = "running" if alive else gone
        if record.detached:  # a batch job: what the engine says, for every process
            state = record.shown_state
        rows.append(ProcRow(p.role, p.rank, p.host, p.pid, state, "", cpu, rss))
    elapsed = (record.ended_at or time.time()) - record.started_at
    return DashboardState(record.id, record.name, record.backend, elapsed, tuple(rows), (), ending(record))


def runs_here(backend: str) -> bool:
    """Whether a job on ``backend`` runs its processes on this machine, where their usage can be
    read (its declared capabilities; a name this launchkit does not know: no)."""
    return backend in backends.names() and backends.capabilities(backend).here


def ending(record: jobs.JobRecord) -> str:
    """The closing line of a job that no longer runs ("" while it runs)."""
    state = record.shown_state
    if state == "running":
        return ""
    code = f" (exit {record.exit_code})" if record.exit_code not in (None, 0) else ""
    return f"job {state}{code}"


def from_live(record: jobs.JobRecord, view: live.Live, now: float) -> DashboardState:
    """The live file's state, its elapsed time brought up to ``now`` while the job runs."""
    state = view.state
    running = record.shown_state == "running"
    elapsed = state.elapsed + max(0.0, now - view.written_at) if running else state.elapsed
    if not running and not state.finished:  # its launcher died mid-frame (lost): nothing is known since
        state = dataclasses.replace(state, rows=tuple(unknown(r) for r in state.rows))
    return dataclasses.replace(state, elapsed=elapsed, message=ending(record) or state.message)


def unknown(row: ProcRow) -> ProcRow:
    """A process whose launcher died while it ran: its state is unknown ("lost"), and the CPU and
    memory the launcher last sampled are not shown as if current."""
    if row.state not in ("running", "starting"):
        return row
    return dataclasses.replace(row, state="lost", detail="", cpu_percent=None, rss_bytes=None)


class Source:
    """Where ``top`` takes the job's state from, read again at each refresh."""

    def __init__(self, ui: Ui, job_id: str, record: jobs.JobRecord) -> None:
        self.ui = ui
        self.job_id = job_id
        self.record = record
        self.meter = GroupMeter()
        self._warned = ""

    def state(self) -> DashboardState:
        self.record = jobs.load(self.job_id) or self.record
        view, why = live.read(self.job_id)
        if why and why != self._warned:  # said once; the record-only view stands in
            self._warned = why
            self.ui.warn(f"cannot use the job's live file: {why}")
        if view is not None:
            return from_live(self.record, view, time.time())
        return state_of(self.record, self.meter)

    @property
    def running(self) -> bool:
        return self.record.shown_state == "running"


def frame(ui: Ui, state: DashboardState) -> RenderableType:
    if not ui.out.is_terminal:
        return render(state)
    width = ui.out.width
    return render(state, *fit(state, ui.out.height, width), width=width)


def register(app: typer.Typer) -> None:
    @app.command(cls=Command, help="Show the live dashboard of a job launched elsewhere on this machine.")
    def top(
        ctx: typer.Context,
        job_id: str = typer.Argument(..., help="The job id (see launchkit ps)."),
        once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    ) -> None:
        ui = get_app(ctx).ui
        jobs.check_job_id(job_id)
        record = jobs.load(job_id, jobs.refuse)
        if record is None:
            raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
        source = Source(ui, job_id, record)
        source.state()  # the first CPU sample of the record-only view
        if once:
            time.sleep(min(interval, 0.5))
            ui.out.print(frame(ui, source.state()))
            return
        if not ui.out.is_terminal:  # a pipe, TERM=dumb: one frame after another, as they come
            while True:
                ui.out.print(frame(ui, source.state()))
                if not source.running:
                    return
                time.sleep(interval)
        from rich.live import Live

        with Live(frame(ui, source.state()), console=ui.out, auto_refresh=False) as shown:
            while source.running:
                time.sleep(interval)
                shown.update(frame(ui, source.state()), refresh=True)
