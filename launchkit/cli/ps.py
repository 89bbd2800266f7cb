"""``launchkit ps``: the jobs recorded on this machine."""

from __future__ import annotations

import time

import typer

from launchkit.cli.app import get_app
from launchkit.jobs import detached
from launchkit.jobs import records as jobs


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def register(app: typer.Typer) -> None:
    @app.command(help="List launchkit jobs (a job whose launcher died shows as lost).")
    def ps(
        ctx: typer.Context,
        show_all: bool = typer.Option(False, "-a", "--all", help="Include finished jobs."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    ) -> None:
        ui = get_app(ctx).ui
        records = [detached.refresh(r) for r in jobs.load_all(jobs.skipping(ui.warn))]
        records = [r for r in records if show_all or r.shown_state in ("running", "lost")]
        if as_json:
            ui.json([r.to_json() for r in records])
            return
        if not records:
            ui.text("no jobs" if show_all else "no running jobs (launchkit ps --all shows finished ones)")
            return
        ui.table(
            None,
            ["job id", "name", "launcher", "state", "attempt", "procs", "hosts", "started", "exit"],
            [
                [
                    r.id,
                    r.name,
                    r.backend,
                    r.shown_state,
                    f"{r.attempt + 1}/{r.max_restarts + 1}",  # 1-based: attempt 0 is the first
                    len(r.processes),
                    ",".join(r.hosts),
                    _when(r.started_at),
                    r.exit_code,
                ]
                for r in records
            ],
        )
