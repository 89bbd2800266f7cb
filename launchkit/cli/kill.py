"""``launchkit kill``: end a job's processes, found by the job id in their environment."""

from __future__ import annotations

import typer

from launchkit import jobs
from launchkit.cli.app import get_app
from launchkit.errors import UsageError
from launchkit.stop import active_job_ids, stop_job


def register(app: typer.Typer) -> None:
    @app.command(help="End every process of a job (by job id), or of every job of this user with --all.")
    def kill(
        ctx: typer.Context,
        job_id: str = typer.Argument(None, help="The job id (see launchkit ps)."),
        kill_all: bool = typer.Option(False, "--all", help="Every launchkit job of this user."),
        grace: float = typer.Option(3.0, "--grace-period", help="Seconds between SIGTERM and SIGKILL."),
    ) -> None:
        ui = get_app(ctx).ui
        if bool(job_id) == kill_all:
            raise UsageError("give a JOB_ID or --all (not both)")
        if job_id and not jobs.JOB_ID_RE.match(job_id):
            raise UsageError(f"{job_id!r} is not a job id (see launchkit ps)")
        ids = active_job_ids() if kill_all else [job_id]
        if kill_all and not ids:
            ui.text("no running launchkit jobs")
            return
        total = 0
        for jid in ids:
            if not kill_all and jobs.load(jid) is None and not active_job_ids().count(jid):
                raise UsageError(f"no job {jid!r} here (see launchkit ps --all)")
            res = stop_job(jid, grace)
            total += res.ended
            ui.text(f"{jid}: ended {res.ended} process(es)")
        if kill_all:
            ui.text(f"ended {total} process(es) in {len(ids)} job(s)")
