"""``launchkit launch``: a drop-in for MXNet's ``tools/launch.py``.

    launchkit launch -n 2 -s 2 --launcher local python train.py --kvstore dist_sync

Option parsing stops at the first word of the command, so the command keeps its own flags
(even ``-n``); ``--`` before the command is optional. See docs/launch.md.

This module turns the flags into a ``LaunchSpec`` and a backend, and prints; running the job
(planning, contacting hosts, recording, supervising) is ``launchkit.launching``'s.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import typer

import dmlc_env
from launchkit import backends, launching
from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import get_app
from launchkit.cli.backendflags import FLAGS, check_detach, refuse_unused
from launchkit.cli.engines import EngineFlags, engine_backend_options, engine_hosts
from launchkit.cli.launchargs import check_not_owned, check_restarts, parse_env_items, working_directory
from launchkit.cli.planview import plan_to_json, show_plan
from launchkit.console import Ui
from launchkit.core.hostfile import read_hostfile
from launchkit.core.placement import assign_hosts
from launchkit.core.plan import split_assignments
from launchkit.core.spec import LOCALHOST, JobResult, LaunchSpec
from launchkit.dashboard import Dashboard
from launchkit.errors import UsageError
from launchkit.fdlimit import raise_open_files
from launchkit.jobs import records
from launchkit.netutil import check_address

# launch.py's --p3: MXNet's P3 van (priority-based parameter propagation), for every process.
P3_ENV = (("DMLC_PS_VAN_TYPE", "p3"), ("DMLC_PS_WATER_MARK", "10"))


def build_spec(
    *,
    num_workers: int,
    num_servers: int | None,
    hostfile: Path | None,
    launcher: str | None,
    sync_dst_dir: str | None,
    env: list[str],
    env_server: list[str],
    env_worker: list[str],
    log_dir: str | None,
    job_name: str | None,
    gpus_per_worker: int | None,
    scheduler_ip: str | None,
    scheduler_port: int | None,
    interface: str | None,
    grace_period: float,
    command: list[str],
    time_limit: float | None = None,
    p3: bool = False,
    slurm_nodes: int | None = None,
    sync_timeout: float = 900.0,
    max_restarts: int = 0,
    restart_backoff: float = 1.0,
    ui: Ui,
) -> LaunchSpec:
    if not command:
        raise UsageError("no command given: expected `launchkit launch -n N [options] COMMAND [ARGS...]`")
    check_command(command)
    backend = launcher or ("ssh" if hostfile else "local")
    if backend not in backends.names():
        raise UsageError(f"--launcher {backend!r}: expected one of {', '.join(backends.names())}")
    caps = backends.capabilities(backend)
    hosts = tuple(read_hostfile(hostfile, ui.warn)) if hostfile else (LOCALHOST,)
    placed = engine_hosts(backend, num_workers, num_servers, slurm_nodes, bool(hostfile), ui)
    if placed is not None:
        hosts = placed
    if caps.needs_hostfile and not hostfile:
        raise UsageError(f"--launcher {backend} needs a hostfile: -H FILE")
    if sync_dst_dir:
        refuse_unused(backend, ["sync_dst_dir"])
    if scheduler_ip is not None:
        check_address("--scheduler-ip", scheduler_ip, resolve=caps.connects, here=caps.here)
    if time_limit == 0:  # the ranges of the command line (app.RANGES) have held every other bound
        raise UsageError("--time-limit must be more than 0, got 0")
    if sync_timeout <= 0:
        raise UsageError(f"--sync-timeout must be more than 0, got {sync_timeout:g}")
    check_restarts(backend, caps, max_restarts, restart_backoff)
    environ = dict(os.environ)
    ns = num_workers if num_servers is None else num_servers
    assign_hosts(num_workers, ns, hosts)  # placement errors before anything else happens
    flags = {"--env": env, "--env-server": env_server, "--env-worker": env_worker}
    for warning in check_not_owned(flags, split_assignments(command)[0], gpus_per_worker):
        ui.warn(warning)  # one per variable the docs let --env set (DMLC_INTERFACE)
    return LaunchSpec(
        num_workers=num_workers,
        num_servers=ns,
        command=tuple(command),
        backend=backend,
        hosts=hosts,
        env=parse_env_items(env, "--env", environ) + (P3_ENV if p3 else ()),
        env_server=parse_env_items(env_server, "--env-server", environ),
        env_worker=parse_env_items(env_worker, "--env-worker", environ),
        job_name=job_name,
        log_dir=log_dir,
        sync_dst_dir=sync_dst_dir,
        sync_timeout=sync_timeout,
        gpus_per_worker=gpus_per_worker,
        scheduler_ip=scheduler_ip,
        scheduler_port=scheduler_port,
        interface=interface or os.environ.get(dmlc_env.DMLC_INTERFACE) or None,
        grace_period=grace_period,
        time_limit=time_limit,
        cwd=working_directory(),
        max_restarts=max_restarts,
        restart_backoff=restart_backoff,
    )


def check_command(command: list[str]) -> None:
    """The program to run must be a word: ``''`` or ``' '`` (an empty quoted command) is a
    usage error, not a process that cannot start or an ``sh -c ' '`` that does nothing; so is a
    command of only ``NAME=VALUE`` words (``A=1``), which the shell runs as no program at all."""
    if any("\0" in word for word in command):
        bad = next(word for word in command if "\0" in word)
        raise UsageError(f"command word {bad!r} holds a NUL byte, which no program argument or variable can")
    _, words = split_assignments(command)
    last = words[-1] if words else ""
    if len(words) == 1 and split_assignments([last, "x"])[0] and not any(c.isspace() for c in last):
        # NAME=VALUE words and nothing after them (one word with spaces runs under sh -c)
        raise UsageError(
            f"no command after {shlex.join(command)}: NAME=VALUE words set variables for a program, "
            "expected one after them, e.g. `launchkit launch -n 2 PS_VERBOSE=1 python train.py`"
        )
    if not words or not words[0].strip():
        raise UsageError(
            f"empty command {shlex.join(command)}: expected a program to run, "
            "e.g. `launchkit launch -n 2 python train.py`"
        )


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
        help="Launch a distributed job: a scheduler, servers and workers running COMMAND.",
    )
    def launch(
        ctx: typer.Context,
        num_workers: int = typer.Option(..., "-n", "--num-workers", help="Number of worker processes."),
        num_servers: int = typer.Option(None, "-s", "--num-servers", help="Number of servers (default: -n)."),
        hostfile: Path = typer.Option(None, "-H", "--hostfile", help="Hostfile: one host per line."),
        launcher: str = typer.Option(
            None, "--launcher", help="local, ssh, mpi, sge, slurm or yarn (default: ssh with -H, else local)."
        ),
        sync_dst_dir: str = typer.Option(None, "--sync-dst-dir", help="rsync the current directory there."),
        env: list[str] = typer.Option([], "--env", help="NAME:VALUE or NAME, for every process."),
        env_server: list[str] = typer.Option([], "--env-server", help="NAME:VALUE or NAME, for servers."),
        env_worker: list[str] = typer.Option([], "--env-worker", help="NAME:VALUE or NAME, for workers."),
        log_dir: str = typer.Option(None, "--log-dir", help="Write each process's stdout/stderr there too."),
        job_name: str = typer.Option(None, "--job-name", help="A name for the job (default: the script)."),
        gpus_per_worker: int = typer.Option(None, "--gpus-per-worker", help="CUDA_VISIBLE_DEVICES slice."),
        scheduler_ip: str = typer.Option(None, "--scheduler-ip", help="Address published for the scheduler."),
        scheduler_port: int = typer.Option(
            None, "--scheduler-port", help="Scheduler port (default: a free one)."
        ),
        interface: str = typer.Option(None, "--interface", help="Network interface (DMLC_INTERFACE)."),
        grace_period: float = typer.Option(
            5.0, "--grace-period", help="Seconds between SIGTERM and SIGKILL."
        ),
        time_limit: float = typer.Option(
            None, "--time-limit", help="End the job after this many seconds (exit 124)."
        ),
        max_restarts: int = typer.Option(
            0, "--max-restarts", help="Restart the whole job up to N times after a failure (local, ssh)."
        ),
        restart_backoff: float = typer.Option(
            1.0, "--restart-backoff", help="Seconds to wait before each restart."
        ),
        ssh_port: int = typer.Option(None, "--ssh-port", help="ssh port for hosts that do not name one."),
        identity: str = typer.Option(None, "-i", "--identity", help="ssh private key file."),
        known_hosts: str = typer.Option(
            None, "--known-hosts", help="Known-hosts file (default ~/.ssh/known_hosts)."
        ),
        strict_host_keys: bool = typer.Option(
            False, "--strict-host-keys", help="Refuse hosts not in known_hosts."
        ),
        sync_exclude: list[str] = typer.Option(
            [], "--sync-exclude", help="rsync exclude pattern (repeatable)."
        ),
        sync_timeout: float = typer.Option(
            900.0, "--sync-timeout", help="Seconds each host's --sync-dst-dir rsync may take."
        ),
        heartbeat_timeout: float = typer.Option(
            10.0, "--heartbeat-timeout", help="Seconds of silence that end a host."
        ),
        connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to reach each host."),
        p3: bool = typer.Option(False, "--p3", help="MXNet's P3 van (DMLC_PS_VAN_TYPE=p3), as launch.py."),
        mpirun: str = typer.Option("mpirun", "--mpirun", help="mpi: the mpirun to use."),
        mpi_args: str = typer.Option("", "--mpi-args", help="mpi: extra mpirun flags, one string."),
        node_python: str = typer.Option(
            None, "--node-python", help="mpi/slurm: Python on the nodes (default: this one)."
        ),
        partition: str = typer.Option(None, "--partition", help="slurm: partition (-p)."),
        slurm_time: str = typer.Option(None, "--time", help="slurm: time limit of the batch job (-t)."),
        nodes: int = typer.Option(None, "--nodes", help="slurm: number of nodes (default: all / 1)."),
        account: str = typer.Option(None, "--account", help="slurm: account to charge."),
        qos: str = typer.Option(None, "--qos", help="slurm: quality of service."),
        constraint: str = typer.Option(None, "--constraint", help="slurm: node features."),
        cpus_per_task: int = typer.Option(None, "--cpus-per-task", help="slurm: CPUs of every task."),
        cpus_per_server: int = typer.Option(None, "--cpus-per-server", help="slurm: CPUs of a server."),
        cpus_per_worker: int = typer.Option(None, "--cpus-per-worker", help="slurm: CPUs of a worker."),
        mem: str = typer.Option(None, "--mem", help="slurm: memory of every task (e.g. 4G)."),
        mem_per_server: str = typer.Option(None, "--mem-per-server", help="slurm: memory of a server."),
        mem_per_worker: str = typer.Option(None, "--mem-per-worker", help="slurm: memory of a worker."),
        slurm_args: str = typer.Option("", "--slurm-args", help="slurm: extra sbatch flags, one string."),
        queue: str = typer.Option(None, "--queue", help="sge, yarn: the queue."),
        pe: str = typer.Option(None, "--pe", help="sge: parallel environment per task, NAME[:SLOTS]."),
        sge_resource: list[str] = typer.Option(
            [], "--sge-resource", help="sge: a resource (-l), repeatable."
        ),
        sge_args: str = typer.Option("", "--sge-args", help="sge: extra qsub flags, one string."),
        yarn_rm: str = typer.Option(None, "--yarn-rm", help="yarn: the ResourceManager's URL."),
        yarn_user: str = typer.Option(None, "--yarn-user", help="yarn: user.name (simple auth)."),
        yarn_domain: str = typer.Option(None, "--yarn-domain", help="yarn: the Registry DNS domain."),
        yarn_file: list[str] = typer.Option(
            [], "--yarn-file", help="yarn: SRC[#NAME] on HDFS, shipped to every container (repeatable)."
        ),
        detach: bool = typer.Option(False, "--detach", help="slurm, sge: submit, print the job id, return."),
        dashboard: bool = typer.Option(
            None,
            "--dashboard/--no-dashboard",
            help="A live dashboard of the job (default: when stdout is a terminal).",
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
        as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
        command: list[str] = typer.Argument(None, metavar="COMMAND [ARGS]...", help="The command to run."),
    ) -> None:
        ui = get_app(ctx).ui
        spec = build_spec(
            num_workers=num_workers,
            num_servers=num_servers,
            hostfile=hostfile,
            launcher=launcher,
            sync_dst_dir=sync_dst_dir,
            env=env,
            env_server=env_server,
            env_worker=env_worker,
            log_dir=log_dir,
            job_name=job_name,
            gpus_per_worker=gpus_per_worker,
            scheduler_ip=scheduler_ip,
            scheduler_port=scheduler_port,
            interface=interface,
            grace_period=grace_period,
            time_limit=time_limit,
            p3=p3,
            slurm_nodes=nodes,
            sync_timeout=sync_timeout,
            max_restarts=max_restarts,
            restart_backoff=restart_backoff,
            command=command or [],
            ui=ui,
        )
        # a flag that sets what this backend does not take (its Capabilities): exit 2, not dropped
        refuse_unused(spec.backend, [p for p in FLAGS if given(ctx, p)])
        if detach:
            check_detach(spec.backend)
        engine_options = engine_backend_options(
            spec,
            EngineFlags(
                mpirun=mpirun,
                mpi_args=mpi_args,
                node_python=node_python,
                partition=partition,
                slurm_time=slurm_time,
                nodes=nodes,
                account=account,
                qos=qos,
                constraint=constraint,
                cpus_per_task=cpus_per_task,
                cpus_per_server=cpus_per_server,
                cpus_per_worker=cpus_per_worker,
                mem=mem,
                mem_per_server=mem_per_server,
                mem_per_worker=mem_per_worker,
                slurm_args=slurm_args,
                queue=queue,
                pe=pe,
                sge_resource=tuple(sge_resource),
                sge_args=sge_args,
                yarn_rm=yarn_rm,
                yarn_user=yarn_user,
                yarn_domain=yarn_domain,
                yarn_file=tuple(yarn_file),
            ),
        )
        if heartbeat_timeout <= 0 or connect_timeout <= 0:
            raise UsageError("--heartbeat-timeout and --connect-timeout must be more than 0")
        # one backend, built the same way for --dry-run as for the launch, so the plan shows the
        # exact command lines (ssh options included) and bad options fail the same way
        available = {
            "options": SshOptions(
                port=ssh_port,
                identity=identity,
                known_hosts=known_hosts,
                strict_host_keys=strict_host_keys,
                connect_timeout=connect_timeout,
            ),
            "heartbeat_timeout": heartbeat_timeout,
            "heartbeat_interval": min(1.0, heartbeat_timeout / 3),
            "sync_excludes": sync_exclude,
            "console": ui.err,
            **engine_options,
        }  # each backend takes those it declares; a flag for another was refused above
        takes = backends.capabilities(spec.backend).options
        backend = backends.get_backend(spec.backend, **{k: v for k, v in available.items() if k in takes})
        if dry_run:
            show_dry_run(spec, backend, ui, as_json=as_json)
            return
        records.check_home()  # the job's record and kept output go there: before anything starts
        if detach:
            done = launching.submit_detached(spec, backend)
            ui.info(
                f"job {done.job_id} submitted as {backend.name} job {done.engine_job}; output in {done.output}"
            )
            ui.text(done.job_id)
            raise typer.Exit(0)
        raise typer.Exit(run_job(spec, backend, ui, dashboard=dashboard))


def given(ctx: typer.Context, param: str) -> bool:
    """Whether ``param`` was on the command line (not its default)."""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name != "DEFAULT"


def show_dry_run(spec: LaunchSpec, backend: backends.Backend, ui: Ui, *, as_json: bool) -> None:
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
            ui.warn("--dashboard needs a terminal; showing the plain merged output instead")
    raise_open_files()  # several descriptors per process: a soft limit of 1024 held ~250
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
        ui.error(f"job {result.job_id} failed{_after(result)}: {t.role} {t.rank} on {root.where} {how}")
        for r in (root, by) if by is not None else (root,):
            if r.tail:
                ui.err.print(f"  last lines of {r.task.role} {r.task.rank}:", style="dim")
                ui.lines(r.tail if r is root else r.tail[-5:])
        others = [r for r in result.results if r.killed_by_launcher]
        if others:
            ui.info(f"ended the other {len(others)} process(es) of the job")
    elif result.timed_out:
        ui.error(f"job {result.job_id} reached its time limit; every process ended (exit 124)")
    elif result.interrupted_by is not None:
        ui.error(f"job {result.job_id} interrupted; every process ended (exit {result.exit_code})")
    elif result.exit_code == 0:
        ui.info(
            f"job {result.job_id} finished{_after(result)}: all {len(result.results)} processes succeeded"
        )


def _after(result: JobResult) -> str:
    return f" (attempt {result.attempt + 1}, after {_restarts(result.attempt)})" if result.attempt else ""


def _restarts(n: int) -> str:
    return f"{n} restart" + ("" if n == 1 else "s")
