"""``launchkit launch``: a drop-in for MXNet's ``tools/launch.py``.

    launchkit launch -n 2 -s 2 --launcher local python train.py --kvstore dist_sync

Option parsing stops at the first word of the command, so the command keeps its own flags
(even ``-n``); ``--`` before the command is optional. See docs/launch.md.

This module turns the flags into a ``LaunchSpec`` (``launchspec``) and a backend, and prints; the
flags themselves are data (``launchoptions``: the common ones, and the engine flags each backend
declares); running the job (planning, contacting hosts, recording, supervising) is
``launchkit.launching``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import typer

from launchkit import backends
from launchkit.cli.app import get_app, local_path
from launchkit.cli.backendflags import check_detach, refuse_unused
from launchkit.cli.launchoptions import ENGINE_FLAGS, RUN_FLAGS, LaunchCommand, given, signature
from launchkit.cli.launchspec import build_spec
from launchkit.cli.planview import plan_to_json, show_plan
from launchkit.console import Ui
from launchkit.core.spec import JobResult, LaunchSpec
from launchkit.core.syncdest import check_sync_dst, known_homes
from launchkit.dashboard import Dashboard
from launchkit.fdlimit import raise_open_files
from launchkit.hints import hint
from launchkit.jobs import records


def launch(ctx: typer.Context, **flags: Any) -> None:
    """The ``launch`` command: its flags by name (``launchoptions.signature``), the engine flags'
    in ``ctx.meta`` (``LaunchCommand``)."""
    ui = get_app(ctx).ui
    run = {name: flags.pop(name) for name in RUN_FLAGS}
    force_sync = flags.pop("sync_dst_dir_force")
    engine = ctx.meta[ENGINE_FLAGS]
    for name in ("hostfile", "log_dir"):  # paths here: '~' is the home, quoted or not
        if flags[name]:
            flags[name] = type(flags[name])(local_path(str(flags[name])))
    spec = build_spec(**{**flags, "command": flags["command"] or []}, engine=engine, ui=ui)
    # a flag that sets what this backend does not take (its Capabilities): exit 2, not dropped
    refuse_unused(spec.backend, given(ctx))
    homes = known_homes((h.user for h in spec.hosts), os.path.expanduser("~"))
    check_sync_dst(spec.sync_dst_dir, force=force_sync, homes=homes)
    if run["detach"]:
        check_detach(spec.backend)
    backend = make_backend(spec, engine, ui)
    if run["dry_run"]:
        show_dry_run(spec, backend, ui, as_json=run["as_json"])
        return
    records.check_home()  # the job's record and kept output go there: before anything starts
    if run["detach"]:
        from launchkit.submitting import submit_detached  # (as launching, below)

        done = submit_detached(spec, backend, say=ui.info)
        ui.info(
            f"job {done.job_id} submitted as {backend.name} job {done.engine_job}; output in {done.output}"
        )
        ui.text(done.job_id)
        raise typer.Exit(0)
    raise typer.Exit(run_job(spec, backend, ui, dashboard=run["dashboard"]))


def register(app: typer.Typer) -> None:
    launch.__signature__ = signature()  # type: ignore[attr-defined]
    app.command(
        "launch",
        cls=LaunchCommand,
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
        help="Launch a distributed job: a scheduler, servers and workers running COMMAND.",
    )(launch)


def make_backend(spec: LaunchSpec, engine: Mapping[str, Any], ui: Ui) -> backends.Backend:
    """One backend, built the same way for --dry-run as for the launch, so the plan shows the
    exact command lines (ssh options included) and bad options fail the same way: the options
    its engine flags give (``flag_options``, checked), and the console where it takes one."""
    cls = backends.backend_class(spec.backend)
    options = {"console": ui.err, **cls.flag_options(engine, spec)}
    takes = cls.capabilities.options
    return backends.get_backend(spec.backend, **{k: v for k, v in options.items() if k in takes})


def show_dry_run(spec: LaunchSpec, backend: backends.Backend, ui: Ui, *, as_json: bool) -> None:
    # launching (the supervisor, the metrics endpoint, elastic jobs) is imported where a launch
    # uses it: every other command imports this module to register launch, and did not need it
    from launchkit import launching

    data = plan_to_json(
        launching.dry_run_plan(spec, backend),
        backend,
        spec.scheduler_port is not None,
        max_restarts=spec.max_restarts,
        restart_backoff=spec.restart_backoff,
    )
    if as_json:
        ui.json(data)
    else:
        show_plan(ui, data)


def run_job(spec: LaunchSpec, backend: backends.Backend, ui: Ui, *, dashboard: bool | None = None) -> int:
    board: Dashboard | None = None
    if dashboard is None:  # neither --dashboard nor --no-dashboard: on in a terminal
        board = Dashboard(ui.out) if ui.out.is_terminal else None
    elif dashboard:
        if ui.out.is_terminal:
            board = Dashboard(ui.out)
        else:
            ui.warn(f"--dashboard {ui.why_no_view()}; showing the plain merged output instead")
    raise_open_files()  # several descriptors per process: a soft limit of 1024 held ~250
    from launchkit import launching  # (as in show_dry_run)

    result = launching.run_job(spec, backend, ui, dashboard=board)
    report(ui, result)
    return result.exit_code


def report(ui: Ui, result: JobResult) -> None:
    if result.strays_killed:
        ui.warn(f"ended {result.strays_killed} leftover process(es) that the job had started")
    root = result.root_cause
    if root is not None:
        t = root.task
        how = f"was killed by signal {root.signal}" if root.signal else f"exited with code {root.exit_code}"
        by = result.named_by
        if by is not None and root.ok:  # it left early, while the others still needed it
            waited = result.waited_by or f"{by.task.role} {by.task.rank} still needed it"
            how = f"exited 0 while {waited} (as {by.task.role} {by.task.rank} reported, exit {by.exit_code})"
        elif by is not None:  # it failed first, but another process said so before it ended
            if root.killed_by_launcher and root.signal:
                how = f"did not end by itself: the launcher ended it (signal {root.signal})"
            else:
                how = f"it {how}"
            how = f"failed, as {by.task.role} {by.task.rank} reported (exit {by.exit_code}); {how}"
            if result.waited_by:
                how += f"; {result.waited_by}"
        elif result.waited_by:  # it failed on its own while others waited for it in an operation
            how += f" while {result.waited_by}"
        ui.error(f"job {result.job_id} failed{_after(result)}: {t.role} {t.rank} on {root.where} {how}")
        for r in (root, by) if by is not None else (root,):
            if r.tail:
                ui.err.print(f"  last lines of {r.task.role} {r.task.rank}:", style="dim")
                ui.lines(r.tail if r is root else r.tail[-5:])
        said = hint(t.role, root.tail)
        if said is not None:
            ui.info(f"hint: {said}")
        others = [r for r in result.results if r.killed_by_launcher]
        if others:
            ui.info(f"ended the other {len(others)} process(es) of the job")
    elif result.timed_out:
        ui.error(f"job {result.job_id} reached its time limit; every process ended (exit 124)")
    elif result.interrupted_by is not None:
        ui.error(f"job {result.job_id} interrupted; every process ended (exit {result.exit_code})")
    elif result.exit_code == 0 and result.changes:  # an elastic job: some workers left on the way
        last = [r for r in result.results if r.ok]
        ui.info(
            f"job {result.job_id} finished after {_count(result.changes, 'membership change')}: "
            f"its last {len(last)} processes succeeded (each worker's end: launchkit ps {result.job_id})"
        )
    elif result.exit_code == 0:
        ui.info(
            f"job {result.job_id} finished{_after(result)}: all {len(result.results)} processes succeeded"
        )


def _after(result: JobResult) -> str:
    return f" (attempt {result.attempt + 1}, after {_restarts(result.attempt)})" if result.attempt else ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _restarts(n: int) -> str:
    return f"{n} restart" + ("" if n == 1 else "s")
