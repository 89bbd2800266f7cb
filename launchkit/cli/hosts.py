"""``launchkit hosts``: inspect hostfiles."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import typer

from launchkit.backends.engine_hosts import engine_hosts
from launchkit.backends.ssh import commands as ssh_commands
from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import get_app
from launchkit.core.hostfile import format_host, host_key, parse_host, parse_line, read_hostfile, unique_hosts
from launchkit.core.spec import Host
from launchkit.errors import UsageError

hosts_app = typer.Typer(help="Inspect and manage hostfiles.", no_args_is_help=True)


@hosts_app.command("list", help="Print the parsed hosts of a hostfile, or those an engine gives (--from).")
def list_hosts(
    ctx: typer.Context,
    hostfile: Path = typer.Option(None, "-H", "--hostfile", help="The hostfile."),
    engine: str = typer.Option(
        None, "--from", help="slurm (the allocation), sge (PE_HOSTFILE) or mpi (the MPI hostfile)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ui = get_app(ctx).ui
    if (hostfile is None) == (engine is None):
        raise UsageError("give a hostfile (-H FILE) or an engine (--from slurm|sge|mpi), not both")
    if engine is not None:
        source, hosts = engine_hosts(engine)
    else:
        source, hosts = str(hostfile), read_hostfile(hostfile, ui.warn)
    if as_json:
        ui.json(
            [
                {"host": h.name, "user": h.user, "port": h.port, "slots": h.slots, "line": h.line}
                for h in hosts
            ]
        )
        return
    ui.table(
        f"{source}: {len(hosts)} host(s)",
        ["line", "host", "user", "port", "slots"],
        [[h.line, h.name, h.user or "", h.port or "", h.slots or ""] for h in hosts],
    )


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.1f} GiB"


@hosts_app.command("check", help="Contact every host in parallel: reachability, latency, CPUs, memory, GPUs.")
def check_hosts(
    ctx: typer.Context,
    hostfile: Path = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
    identity: str = typer.Option(None, "-i", "--identity", help="ssh private key file."),
    ssh_port: int = typer.Option(None, "--ssh-port", help="ssh port for hosts that do not name one."),
    known_hosts: str = typer.Option(None, "--known-hosts", help="Known-hosts file."),
    strict_host_keys: bool = typer.Option(False, "--strict-host-keys", help="Refuse unknown hosts."),
    connect_timeout: float = typer.Option(5.0, "--connect-timeout", help="Seconds to reach each host."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ui = get_app(ctx).ui
    hosts = unique_hosts(read_hostfile(hostfile, ui.warn))
    opts = SshOptions(ssh_port, identity, known_hosts, strict_host_keys, connect_timeout)
    results = ssh_commands.probe(hosts, opts)
    if as_json:
        ui.json(
            [
                {
                    "host": str(r.host),
                    "reachable": r.ok,
                    "error": r.error or None,
                    "connect_ms": r.latency_ms,
                    **r.data,
                }
                for r in results
            ]
        )
    else:
        ui.table(
            f"{hostfile}: {sum(r.ok for r in results)} of {len(results)} host(s) reachable",
            ["host", "status", "rtt", "hostname", "cpus", "memory", "gpus", "python", "launchkit"],
            [
                [
                    str(r.host),
                    "ok" if r.ok else f"unreachable: {r.error}",
                    f"{r.data['rtt_ms']:.1f} ms" if r.ok else "",
                    r.data.get("hostname", ""),
                    r.data.get("cpus", ""),
                    _gib(r.data.get("mem_bytes")),
                    ", ".join(r.data.get("gpus", [])) or ("none" if r.ok else ""),
                    r.data.get("python", ""),
                    r.data.get("launchkit") or ("-" if r.ok else ""),
                ]
                for r in results
            ],
        )
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def _edit(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    """Rewrite a hostfile atomically, keeping every other line (comments included) as it was."""
    text = path.read_text() if path.exists() else ""
    lines = change(text.splitlines())
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


@hosts_app.command("add", help="Add a host to a hostfile (created if missing), keeping its comments.")
def add_host(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="host, host:port, user@host[:port] or [ipv6]:port"),
    hostfile: Path = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
    slots: int = typer.Option(None, "--slots", help="slots=N for this host."),
) -> None:
    ui = get_app(ctx).ui
    entry = _parse_arg(host, slots)
    existing = read_hostfile(hostfile) if hostfile.exists() and hostfile.read_text().strip() else []
    if any(host_key(h) == host_key(entry) for h in existing):
        raise UsageError(f"{hostfile}: {host} is already there")
    _edit(hostfile, lambda lines: [*lines, format_host(entry)])
    ui.text(f"added {format_host(entry)} to {hostfile}")


@hosts_app.command("remove", help="Remove a host (every line naming it) from a hostfile, keeping comments.")
def remove_host(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="The host as written in the file (host, host:port, user@host...)."),
    hostfile: Path = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
) -> None:
    ui = get_app(ctx).ui
    target = _parse_arg(host, None)
    read_hostfile(hostfile)  # refuse to edit a file that does not parse
    removed: list[str] = []

    def change(lines: list[str]) -> list[str]:
        kept = []
        for line in lines:
            try:
                h = parse_line(line)
            except ValueError:
                h = None
            if h is not None and host_key(h) == host_key(target):
                removed.append(line)
            else:
                kept.append(line)
        return kept

    _edit(hostfile, change)
    if not removed:
        raise UsageError(f"{hostfile}: no line names {host}")
    ui.text(f"removed {len(removed)} line(s) from {hostfile}")


def _parse_arg(text: str, slots: int | None) -> Host:
    try:
        h = parse_host(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if slots is not None and slots < 1:
        raise UsageError(f"--slots must be at least 1, got {slots}")
    return Host(h.name, h.port, h.user, slots)
