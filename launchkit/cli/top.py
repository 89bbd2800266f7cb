"""``launchkit top JOB_ID``: the dashboard of a job running elsewhere (e.g. another terminal)."""

from __future__ import annotations

import time

import typer

from launchkit.cli.app import get_app
from launchkit.dashboard import CpuMeter, DashboardState, ProcRow, render
from launchkit.errors import UsageError
from launchkit.hostside import procscan
from launchkit.jobs import detached
from launchkit.jobs import records as jobs


def state_of(record: jobs.JobRecord, meter: CpuMeter) -> DashboardState:
    record = detached.refresh(record)  # a batch job: its state from the engine
    pids = {p.pid for p in record.processes if p.pid and procscan.alive(p.pid)}
    usage = meter.sample(pids) if record.backend == "local" else {}
    rows = []
    for p in record.processes:
        live = p.pid in pids
        cpu, rss = usage.get(p.pid, (None, None)) if p.pid else (None, None)
        state = "running" if live else "ended"
        if record.detached:  # a batch job: what the engine says, for every process
            state = record.shown_state
        rows.append(ProcRow(p.role, p.rank, p.host, p.pid, state, "", cpu, rss))
    elapsed = (record.ended_at or time.time()) - record.started_at
    message = "" if record.shown_state == "running" else f"job {record.shown_state}"
    return DashboardState(record.id, record.name, record.backend, elapsed, tuple(rows), (), message)


def register(app: typer.Typer) -> None:
    @app.command(help="Show a live dashboard of a running job (its processes, CPU and memory).")
    def top(
        ctx: typer.Context,
        job_id: str = typer.Argument(..., help="The job id (see launchkit ps)."),
        once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    ) -> None:
        ui = get_app(ctx).ui
        record = jobs.load(job_id, jobs.refuse)
        if record is None:
            raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
        meter = CpuMeter()
        state_of(record, meter)  # first CPU sample
        if once:
            time.sleep(min(interval, 0.5))
            ui.out.print(render(state_of(jobs.load(job_id) or record, meter)))
            return
        from rich.live import Live

        with Live(render(state_of(record, meter)), console=ui.out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                record = jobs.load(job_id) or record
                live.update(render(state_of(record, meter)), refresh=True)
                if record.shown_state != "running":
                    break
