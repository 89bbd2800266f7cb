"""``launchkit kill``: end a job's processes, found by the job id in their environment, on this
machine and on every host of the job (never by a name pattern); with ``--all``, the jobs of this
``LAUNCHKIT_HOME`` and strays (``launchkit.jobs.owner``). Every argument is checked (exit 2)
before anything is ended; ``--dry-run`` says what would be ended and ends nothing."""

from __future__ import annotations

from pathlib import Path

import typer

from launchkit.backends.ssh import commands as ssh_commands
from launchkit.backends.ssh.commands import HostResult
from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import get_app, path_option
from launchkit.cli.coercion import Command
from launchkit.cli.sshargs import check_ssh_files
from launchkit.console import Ui
from launchkit.core.hostfile import read_hostfile
from launchkit.core.spec import Host
from launchkit.errors import UsageError
from launchkit.hostside import procscan
from launchkit.jobs import owner
from launchkit.jobs import records as jobs
from launchkit.jobs.kill import (
    SWEEP_BOUND,
    StopResult,
    active_job_ids,
    elsewhere,
    plan_all,
    scan_hosts,
    stop_job,
    sweep_chosen,
)


def _report_hosts(ui: Ui, results: tuple[HostResult, ...] | list[HostResult]) -> bool:
    """Print one line per host (and, after ``kill --all -H``, each job it left there); True when
    every host was reached."""
    for r in results:
        if r.ok:
            ui.text(f"  {r.host}: ended {r.data.get('ended', 0)} process(es)")
            for v in r.data.get("verdicts", ()):
                if not v.end:
                    ui.text(f"  {r.host}: {_would(v, 'left')}")
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


def _would(v: owner.Verdict, where: str = "") -> str:
    """One job's verdict, as ``--dry-run`` says it (and ``kill --all`` of what it leaves)."""
    verb = ("would end" if v.end else "would leave") if where != "left" else "left"
    return f"{verb} {v.job_id} ({v.count} process(es)): {v.why}"


def _hosts_of(
    ui: Ui, hostfile: Path | None, identity: str | None, port: int | None, known: str | None
) -> tuple[list[Host], SshOptions] | None:
    """-H's hosts and the ssh options, checked (exit 2) before anything is ended."""
    if hostfile is None:
        return None
    hosts = read_hostfile(hostfile, ui.warn)
    opts = SshOptions(port=port, identity=identity, known_hosts=known)
    check_ssh_files(opts)
    return hosts, opts


def register(app: typer.Typer) -> None:
    @app.command(
        cls=Command,
        help="End every process of a job (by job id) on every host, or every job of this LAUNCHKIT_HOME with --all.",
    )
    def kill(
        ctx: typer.Context,
        job_id: str = typer.Argument(None, help="The job id (see launchkit ps)."),
        kill_all: bool = typer.Option(
            False, "--all", help="Every job launchkit ps lists here, and strays (processes no home records)."
        ),
        hostfile_arg: str = typer.Option(None, "-H", "--hostfile", help="With --all: also on these hosts."),
        identity: str = typer.Option(None, "-i", "--identity", help="ssh private key file."),
        ssh_port: int = typer.Option(None, "--ssh-port", help="ssh port for hosts that do not name one."),
        known_hosts: str = typer.Option(None, "--known-hosts", help="Known-hosts file."),
        grace: float = typer.Option(3.0, "--grace-period", help="Seconds between SIGTERM and SIGKILL."),
        dry_run: bool = typer.Option(
            False, "--dry-run", "--list", help="Say what would be ended (and left), and end nothing."
        ),
    ) -> None:
        ui = get_app(ctx).ui
        # every argument is checked before anything is ended
        if (job_id is not None) == kill_all:
            raise UsageError("give a JOB_ID or --all (not both)" if kill_all else "give a JOB_ID or --all")
        if job_id is not None:
            jobs.check_job_id(job_id)
        hostfile = path_option("-H/--hostfile", hostfile_arg)
        if hostfile is not None and not kill_all:
            raise UsageError("-H goes with --all (a job's own hosts are in its record)")
        if hostfile is None and (identity, ssh_port, known_hosts) != (None, None, None):
            raise UsageError(
                "-i, --ssh-port and --known-hosts go with --all -H (kill JOB_ID reaches the job's hosts "
                "as its record says)"
            )
        jobs.check_readable()
        remote = _hosts_of(ui, hostfile, identity, ssh_port, known_hosts)
        reached = _kill_one(ui, job_id, grace, dry_run) if job_id else _kill_all(ui, remote, grace, dry_run)
        if not reached:
            raise typer.Exit(1)


def _kill_one(ui: Ui, job_id: str, grace: float, dry_run: bool) -> bool:
    bad: list[jobs.BadRecord] = []
    record = jobs.load(job_id, bad.append)
    if record is None and not bad:
        other = elsewhere(job_id)
        if other is not None:  # its processes here are another home's job
            raise UsageError(f"job {job_id} is not this home's: {other} (run kill with that LAUNCHKIT_HOME)")
        if job_id not in active_job_ids():
            raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
    if record is None and bad and job_id not in active_job_ids():
        raise UsageError(jobs.unreadable(bad[0]))  # the same words as logs and top
    if bad:  # its processes still run: they are found by the job id, without the record
        ui.warn(f"{jobs.unreadable(bad[0])}; ending the job's processes found by its id")
    if dry_run:
        found = len(procscan.find_job_pids(job_id))
        state = f", {record.shown_state}" if record is not None else ""
        ui.text(f"would end {job_id} ({found} process(es) here{state})")
        return True
    res = stop_job(job_id, grace)
    ui.text(_said(res))
    return _report_hosts(ui, res.hosts)


def _kill_all(ui: Ui, remote: tuple[list[Host], SshOptions] | None, grace: float, dry_run: bool) -> bool:
    plan = plan_all(jobs.skipping(ui.warn))
    reach = scanned = None
    if remote is not None and dry_run:
        reach, scanned = scan_hosts(*remote)
        reach.close()
    if dry_run:
        counts = {v.job_id: v.count for v in plan.here}
        for jid in plan.to_end():
            why = next((v.why for v in plan.here if v.job_id == jid), "recorded here")
            ui.text(f"would end {jid} ({counts.get(jid, 0)} process(es) here): {why}")
        for v in plan.here:
            if not v.end:
                ui.text(_would(v))
        for r in scanned or []:
            if not r.ok:
                ui.error(f"{r.host}: unreachable: {r.error}")
                continue
            for v in plan.on_host(r.data.get("jobs", {})):
                ui.text(f"  {r.host}: {_would(v)}")
        ui.text(f"would end {len(plan.to_end())} job(s) here; ended nothing (--dry-run)")
        return scanned is None or all(r.ok for r in scanned)
    if remote is not None:  # the hosts' connections open while this machine's jobs end
        reach = ssh_commands.Reach(*remote)
    reached = True
    total = 0
    try:
        ids = plan.to_end()
        for jid in ids:
            res = stop_job(jid, grace)
            total += res.ended
            ui.text(_said(res))
            reached = _report_hosts(ui, res.hosts) and reached
        for v in plan.here:
            if not v.end:
                ui.text(_would(v, "left"))
        ui.text(f"ended {total} process(es) in {len(ids)} job(s) here")
        if reach is not None:
            scanned = reach.scan(SWEEP_BOUND)
            results = sweep_chosen(reach, plan, scanned, grace)
            reached = _report_hosts(ui, results) and reached
    finally:
        if reach is not None:
            reach.close()
    return reached
