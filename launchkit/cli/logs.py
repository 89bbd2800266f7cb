"""``launchkit logs JOB_ID``: a job's output, each line prefixed by its process, after the fact.

A detached batch job's output file is split back into processes; a job launched with
``--log-dir`` shows its per-process files."""

from __future__ import annotations

from pathlib import Path

import typer

from launchkit.cli.app import get_app
from launchkit.errors import UsageError
from launchkit.jobs import detached
from launchkit.jobs import records as jobs


def register(app: typer.Typer) -> None:
    @app.command(help="Print a job's output (a detached batch job's, or what --log-dir kept).")
    def logs(
        ctx: typer.Context,
        job_id: str = typer.Argument(..., help="The job id (see launchkit ps)."),
    ) -> None:
        ui = get_app(ctx).ui
        record = jobs.load(job_id, jobs.refuse)
        if record is None:
            raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
        if (record.remote or {}).get("output"):
            path = Path(record.remote["output"])  # type: ignore[index]
            if not path.exists():
                ui.text(f"no output yet ({path}); the job may still be waiting in the queue")
                return
            for label, _stream, text in detached.output_lines(record):
                ui.text(f"[{label}] {text}")
            return
        if record.log_dir:
            files = sorted(Path(record.log_dir).glob("*.std*"))
            for f in files:
                for text in f.read_text(errors="replace").splitlines():
                    ui.text(f"[{f.stem.replace('-', ' ')} {f.suffix[1:]}] {text}")
            if files:
                return
        raise UsageError(f"job {job_id} kept no logs: launch with --log-dir DIR to keep them")
