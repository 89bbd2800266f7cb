"""``launchkit ps``: the jobs recorded on this machine."""

from __future__ import annotations

import time

import typer

from launchkit.cli.app import get_app
from launchkit.jobs import detached, live
from launchkit.jobs import records as jobs


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


COLUMNS = ("job id", "name", "launcher", "state", "attempt", "procs", "hosts", "started", "exit")


def shown_step_loss(figures: tuple[int | None, float | None] | None) -> tuple[str, str]:
    """A running job's latest step and loss, from its live file (blank when it reports none)."""
    step, loss = figures or (None, None)
    return ("" if step is None else str(step)), ("" if loss is None else f"{loss:.4g}")


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
        training = {r.id: live.step_loss(r.id) for r in records if r.shown_state == "running"}
        if as_json:
            none = (None, None)
            ui.json(
                [
                    {**r.to_json(), **dict(zip(("step", "loss"), training.get(r.id, none), strict=True))}
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
                    r.shown_state,
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
