"""The parameters of ``launchkit launch``, as data: the flags every launch has (``common``: launch's
signature) and the engine flags the registered backends declare (``backends.engine_flags``),
rendered as typer options. ``LaunchCommand`` adds the engine flags when its parameters are first
asked for (parsing launch's arguments, its help), so that no other command imports every backend
for its declarations, and prints the help with them grouped by the backends that take them
(``backendflags.groups``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from launchkit import backends
from launchkit.cli.app import bound_numbers, check_number, refuse_empty
from launchkit.cli.backendflags import groups
from launchkit.cli.torchrunflags import TorchrunRefusals
from launchkit.core.elastic import parse_workers

#: launch's flags that say how to run the job, not what it is (no part of the spec)
RUN_FLAGS = ("detach", "dashboard", "dry_run", "as_json")


def _option(name: str, annotation: Any, default: Any, *decls: str, **kw: Any) -> inspect.Parameter:
    option = typer.Option(default, *decls, **kw)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def workers_option(ctx: Any, param: Any, value: str | None) -> int | tuple[int, int] | None:
    """``-n``: N, or MIN:MAX (an elastic job); each number as every count on the command line."""
    if value is None:
        return None
    try:
        count, bounds = parse_workers(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    check_number(list(bounds or (count,)))
    return count if bounds is None else bounds


def _either(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def common() -> list[inspect.Parameter]:
    """The flags of every launch, whichever backend runs it (their help naming backends in
    ``declared_help``)."""
    o = _option
    return [
        o(
            "num_workers",
            str,
            ...,
            "-n",
            "--num-workers",
            metavar="N|MIN:MAX",
            callback=workers_option,
            help="Number of worker processes; MIN:MAX for an elastic job (docs/elastic.md).",
        ),
        o("num_servers", int, None, "-s", "--num-servers", help="Number of servers (default: -n)."),
        o("hostfile", Path, None, "-H", "--hostfile", help="Hostfile: one host per line."),
        o(
            "launcher",
            str,
            None,
            "--launcher",
            help=f"{_either(backends.names())} (default: ssh with -H, else local).",
        ),
        o("sync_dst_dir", str, None, "--sync-dst-dir", help="rsync the current directory there."),
        o(
            "sync_dst_dir_force",
            bool,
            False,
            "--sync-dst-dir-force",
            help="Sync even into /, a top-level system directory or a home.",
        ),
        o("env", list[str], [], "--env", help="NAME:VALUE or NAME, for every process."),
        o("env_server", list[str], [], "--env-server", help="NAME:VALUE or NAME, for servers."),
        o("env_worker", list[str], [], "--env-worker", help="NAME:VALUE or NAME, for workers."),
        o("log_dir", str, None, "--log-dir", help="Write each process's stdout/stderr there too."),
        o("job_name", str, None, "--job-name", help="A name for the job (default: the script)."),
        o("gpus_per_worker", int, None, "--gpus-per-worker", help="CUDA_VISIBLE_DEVICES slice."),
        o("scheduler_ip", str, None, "--scheduler-ip", help="Address published for the scheduler."),
        o("scheduler_port", int, None, "--scheduler-port", help="Scheduler port (default: a free one)."),
        o(
            "master_port",
            int,
            None,
            "--master-port",
            help="torch's MASTER_PORT on worker 0's host (default: a free one).",
        ),
        o("interface", str, None, "--interface", help="Network interface (DMLC_INTERFACE)."),
        o("grace_period", float, 5.0, "--grace-period", help="Seconds between SIGTERM and SIGKILL."),
        o("time_limit", float, None, "--time-limit", help="End the job after this many seconds (exit 124)."),
        o(
            "max_restarts",
            int,
            0,
            "--max-restarts",
            help=None,  # declared_help
        ),
        o(
            "host_discovery_script",
            str,
            None,
            "--host-discovery-script",
            help="With -n MIN:MAX: a program printing host:slots lines, run every second.",
        ),
        o(
            "blacklist_cooldown",
            float,
            None,
            "--blacklist-cooldown",
            help="With -n MIN:MAX: seconds a host is not used after a worker failed there (default 10; doubling).",
        ),
        o("restart_backoff", float, 1.0, "--restart-backoff", help="Seconds to wait before each restart."),
        o(
            "sync_timeout",
            float,
            900.0,
            "--sync-timeout",
            help="Seconds each host's --sync-dst-dir rsync may take.",
        ),
        o("p3", bool, False, "--p3", help="MXNet's P3 van (DMLC_PS_VAN_TYPE=p3), as launch.py."),
        o("detach", bool, False, "--detach", help=None),
        o(
            "dashboard",
            bool,
            None,
            "--dashboard/--no-dashboard",
            help="A live dashboard of the job (default: when stdout is a terminal).",
        ),
        o("dry_run", bool, False, "--dry-run", help="Print the plan; start nothing."),
        o("as_json", bool, False, "--json", help="With --dry-run: the plan as JSON."),
    ]


def declared_help() -> dict[str, str]:
    """The help of the flags every launch has that only some backends act on, naming those."""
    restarts = ", ".join(backends.taking(lambda c: c.restarts))
    detaches = _either(backends.taking(lambda c: c.detaches))
    return {
        "max_restarts": f"Restart the whole job up to N times after a failure ({restarts}).",
        "detach": f"{detaches}: submit, print the job id, return.",
    }


def engine() -> list[inspect.Parameter]:
    """The backends' own flags, each with the title of its group in the help."""
    return [
        _option(
            flag.name,
            list[flag.type] if flag.multiple else flag.type,  # type: ignore[name-defined]  # (run time)
            [] if flag.multiple else flag.default,
            *flag.names,
            help=flag.help,
            rich_help_panel=title,
        )
        for title, flags in groups().items()
        for flag in flags
    ]


def signature() -> inspect.Signature:
    """``launch(ctx, **flags)``'s signature as typer reads it: the common flags, the command."""
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    command = inspect.Parameter(
        "command",
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Argument(None, metavar="COMMAND [ARGS]...", help="The command to run."),
        annotation=list[str],
    )
    return inspect.Signature([ctx, *common(), command])


def engine_params() -> list[Any]:
    """The engine flags as the command line's parameters (typer makes them from a signature)."""

    def holder(**_: Any) -> None: ...

    holder.__signature__ = inspect.Signature(engine())  # type: ignore[attr-defined]
    app = typer.Typer(add_completion=False)
    app.command()(holder)
    return list(typer.main.get_command(app).params)


def given(ctx: typer.Context) -> list[str]:
    """The parameters that were on the command line (not their defaults)."""
    names = [p.name for p in ctx.command.params if p.name]
    return [p for p in names if (s := ctx.get_parameter_source(p)) is not None and s.name != "DEFAULT"]


ENGINE_FLAGS = "launchkit.engine_flags"  # ctx.meta: the engine flags' values, by name


class LaunchCommand(TorchrunRefusals):
    """``launch``: its engine flags join its parameters when first asked for; their values go to
    ``ctx.meta[ENGINE_FLAGS]`` (the callback takes launch's own signature). Its help: the
    arguments, the options every launch has, then one section for each group of engine flags
    (``rich_help_panel``: the backends that take them)."""

    engine_added = False

    def get_params(self, ctx: Any) -> list[Any]:
        if not self.engine_added:
            self.engine_added = True
            self.params[-1:-1] = engine_params()  # before the command
            named = declared_help()
            for param in self.params:
                param.help = named.get(param.name or "", param.help)  # type: ignore[attr-defined]
            bound_numbers(self)  # as the root did for the others
            refuse_empty(self)
        return list(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        ctx.meta[ENGINE_FLAGS] = {flag.name: ctx.params.pop(flag.name) for flag in backends.engine_flags()}
        return super().invoke(ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                title = "Arguments" if param.param_type_name == "argument" else "Options"
                sections.setdefault(getattr(param, "rich_help_panel", None) or title, []).append(record)
        for title in sorted(sections, key=lambda t: (t != "Arguments", t != "Options")):  # stable
            with formatter.section(title):
                formatter.write_dl(sections[title])
