"""``launchkit kill``: end a job's processes, found by the job id in their environment, on this
machine and on every host of the job (never by a name pattern)."""

from __future__ import annotations

from pathlib import Path

import typer

from launchkit.backends.ssh.commands import HostResult
from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import get_app
from launchkit.console import Ui
from launchkit.core.hostfile import read_hostfile
from launchkit.errors import UsageError
from launchkit.jobs import records as jobs
from launchkit.jobs.kill import StopResult, active_job_ids, stop_job, sweep_all


def _report_hosts(ui: Ui, results: tuple[HostResult, ...] | list[HostResult]) -> bool:
    """Print one line per host; True when every host was reached."""
    for r in results:
        if r.ok:
            ui.text(f"  {r.host}: ended {r.data.get('ended', 0)} process(es)")
        else:
            ui.error(f"{r.host}: unreachable: {r.error}")
    return all(r.ok for r in results)


def _said(res: StopResult) -> str:
    """What ``kill`` did to one job."""
    if res.cancelled:
        return f"{res.job_id}: cancelled {res.cancelled}"
    if res.lost:
        return (
            f"{res.job_id}: already lost (its launcher died without recording the end); "
            f"ended {res.ended} process(es) it left here; its record stays lost"
        )
    return f"{res.job_id}: ended {res.ended} process(es) here"


def register(app: typer.Typer) -> None:
    @app.command(help="End every process of a job (by job id) on every host, or of every job with --all.")
    def kill(
        ctx: typer.Context,
        job_id: str = typer.Argument(None, help="The job id (see launchkit ps)."),
        kill_all: bool = typer.Option(False, "--all", help="Every launchkit job of this user."),
        hostfile: Path = typer.Option(None, "-H", "--hostfile", help="With --all: also on these hosts."),
        identity: str = typer.Option(None, "-i", "--identity", help="ssh private key file."),
        ssh_port: int = typer.Option(None, "--ssh-port", help="ssh port for hosts that do not name one."),
        known_hosts: str = typer.Option(None, "--known-hosts", help="Known-hosts file."),
        grace: float = typer.Option(3.0, "--grace-period", help="Seconds between SIGTERM and SIGKILL."),
    ) -> None:
        ui = get_app(ctx).ui
        if bool(job_id) == kill_all:
            raise UsageError("give a JOB_ID or --all (not both)")
        if job_id and not jobs.JOB_ID_RE.match(job_id):
            raise UsageError(f"{job_id!r} is not a job id (see launchkit ps)")
        if hostfile and not kill_all:
            raise UsageError("-H goes with --all (a job's own hosts are in its record)")
        reached = True
        warn = jobs.skipping(ui.warn)
        if job_id:
            bad: list[jobs.BadRecord] = []
            if jobs.load(job_id, bad.append) is None and job_id not in active_job_ids():
                if bad:  # the same words as logs and top
                    raise UsageError(jobs.unreadable(bad[0]))
                raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
            if bad:  # its processes still run: they are found by the job id, without the record
                ui.warn(f"{jobs.unreadable(bad[0])}; ending the job's processes found by its id")
            res = stop_job(job_id, grace)
            ui.text(_said(res))
            reached = _report_hosts(ui, res.hosts)
        else:
            ids = active_job_ids(warn)
            total = 0
            for jid in ids:
                res = stop_job(jid, grace)
                total += res.ended
                ui.text(_said(res))
                reached = _report_hosts(ui, res.hosts) and reached
            ui.text(f"ended {total} process(es) in {len(ids)} job(s) here")
            if hostfile:
                opts = SshOptions(port=ssh_port, identity=identity, known_hosts=known_hosts)
                results = sweep_all(read_hostfile(hostfile, ui.warn), opts, grace)
                reached = _report_hosts(ui, results) and reached
        if not reached:
            raise typer.Exit(1)
