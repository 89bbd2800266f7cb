"""``launchkit hosts``: inspect hostfiles."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from launchkit import backends
from launchkit.backends.ssh import commands as ssh_commands
from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import get_app, path_option
from launchkit.cli.coercion import Command, Group
from launchkit.cli.sshargs import check_ssh_files
from launchkit.core.hostfile import (
    format_host,
    host_key,
    parse_host,
    parse_hostfile,
    parse_line,
    read_hostfile,
    read_text,
    unique_hosts,
)
from launchkit.core.spec import Host
from launchkit.errors import HostfileError, UsageError
from launchkit.hostside.netif import is_loopback

hosts_app = typer.Typer(cls=Group, help="Inspect and manage hostfiles.", no_args_is_help=True)


def listing() -> list[str]:
    """The backends whose engine gives a host list (``Capabilities.gives_hosts``): ``--from``."""
    return backends.taking(lambda caps: bool(caps.gives_hosts))


def given_hosts(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, list[Host]]:
    """``--from NAME``: where the hosts came from and the hosts, from the backend ``NAME``."""
    if name not in listing():
        raise UsageError(f"--from {name!r}: expected one of {', '.join(listing())}")
    return backends.backend_class(name).given_hosts(os.environ if environ is None else environ)


def _from_help() -> str:
    found = [f"{n} ({backends.capabilities(n).gives_hosts})" for n in listing()]
    return ", ".join(found[:-1]) + f" or {found[-1]}." if len(found) > 1 else "".join(found)


class ListCommand(Command):
    """``hosts list``: its help names the backends ``--from`` takes (their declarations) when it
    is printed, so that no other command imports every backend."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.params:
            if param.name == "engine":
                param.help = _from_help()  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)


@hosts_app.command(
    "list", cls=ListCommand, help="Print the parsed hosts of a hostfile, or those an engine gives (--from)."
)
def list_hosts(
    ctx: typer.Context,
    hostfile_arg: str = typer.Option(None, "-H", "--hostfile", help="The hostfile."),
    engine: str = typer.Option(None, "--from"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ui = get_app(ctx).ui
    hostfile = path_option("-H/--hostfile", hostfile_arg)
    if (hostfile is None) == (engine is None):
        both = "" if hostfile is None else ", not both"  # said only when both were given
        raise UsageError(f"give a hostfile (-H FILE) or an engine (--from {'|'.join(listing())}){both}")
    if engine is not None:
        source, hosts = given_hosts(engine)
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


@hosts_app.command(
    "check", cls=Command, help="Contact every host in parallel: reachability, latency, CPUs, memory, GPUs."
)
def check_hosts(
    ctx: typer.Context,
    hostfile_arg: str = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
    identity: str = typer.Option(None, "-i", "--identity", help="ssh private key file."),
    ssh_port: int = typer.Option(None, "--ssh-port", help="ssh port for hosts that do not name one."),
    known_hosts: str = typer.Option(None, "--known-hosts", help="Known-hosts file."),
    strict_host_keys: bool = typer.Option(False, "--strict-host-keys", help="Refuse unknown hosts."),
    connect_timeout: float = typer.Option(5.0, "--connect-timeout", help="Seconds to reach each host."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ui = get_app(ctx).ui
    hostfile = _required_path(hostfile_arg)
    if connect_timeout <= 0:
        raise UsageError(f"--connect-timeout must be more than 0, got {connect_timeout:g}")
    hosts = unique_hosts(read_hostfile(hostfile, ui.warn))
    opts = SshOptions(ssh_port, identity, known_hosts, strict_host_keys, connect_timeout)
    check_ssh_files(opts)  # before any host is contacted
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
    for line in loopback_names(results):
        ui.warn(line)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def loopback_names(results: list[ssh_commands.HostResult]) -> list[str]:
    """A line for each reached host whose own name resolves to a loopback address (Debian's
    127.0.1.1): what binds to its name's address (gloo, NCCL) is unreachable from other hosts."""
    return [
        f"{r.host}: its host name {r.data.get('hostname')} resolves to {r.data['name_address']} there, a "
        "loopback address: what binds to its name's address (gloo, NCCL) cannot be reached from other "
        "hosts (launchkit sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME in its workers); give the name the "
        "host's own address in its /etc/hosts"
        for r in results
        if r.ok and isinstance(r.data.get("name_address"), str) and is_loopback(r.data["name_address"])
    ]


_KINDS = {
    stat.S_IFIFO: "a fifo",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def _editable(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file that ``hosts add/remove`` rewrites for ``path``: the file itself or, for a link,
    the file it points to (the link stays a link); with its stat, None when it does not exist yet.
    UsageError naming ``path`` when it cannot be a hostfile: a directory, a fifo, a missing parent."""
    try:
        real = Path(os.path.realpath(path))
    except OSError:  # a relative path in a working directory that was removed
        raise HostfileError(str(path), None, "cannot find it (the current directory was removed)") from None
    try:
        info = real.stat()
    except FileNotFoundError:
        if not real.parent.is_dir():
            raise UsageError(
                f"{path}: no such file, and no directory {real.parent} to create it in"
            ) from None
        return real, None
    except OSError as exc:  # a file where a directory should be, a link loop
        raise HostfileError(str(path), None, f"cannot use it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise HostfileError(str(path), None, "is a directory, expected a hostfile")
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise HostfileError(str(path), None, f"is {kind}: hosts add and remove rewrite a regular file")
    return real, info


def _edit(path: Path, change: Callable[[list[str]], list[str]], *, create: bool = False) -> None:
    """Rewrite a hostfile at once, keeping every other line (comments included) as it was, and
    its line ends (CRLF stays CRLF):
    the new text goes to a temporary file in the target's own directory, with the target's mode
    (and owner, where we may), renamed over it. A file without hosts is refused unless
    ``create`` (``hosts add`` starts one)."""
    real, info = _editable(path)
    if info is None and not create:
        raise HostfileError(str(path), None, "no such file")
    text = read_text(path) if info is not None else ""
    parse_hostfile(text, str(path), allow_empty=create)  # never rewrite a file that does not parse
    eol = "\r\n" if "\n" in text and text.count("\r\n") == text.count("\n") else "\n"  # as the file has it
    body = text[: -len(eol)] if text.endswith(eol) else text
    # split at the file's line ends only: str.splitlines also splits at \x0c, \x1c, U+2028...
    new = "".join(line + eol for line in change(body.split(eol) if body else []))
    tmp = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
    mode = 0o666 if info is None else stat.S_IMODE(info.st_mode)  # 0o666: the umask applies
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w", encoding="utf-8") as f:
            f.write(new)
        if info is not None:
            os.chmod(tmp, mode)
            with contextlib.suppress(OSError):  # only root may give a file to another user
                os.chown(tmp, info.st_uid, info.st_gid)
        os.replace(tmp, real)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        where = f" (the file it links to, {real})" if path.is_symlink() else ""
        raise UsageError(f"{path}: cannot write{where}: {exc.strerror or exc}") from None


@hosts_app.command(
    "add", cls=Command, help="Add a host to a hostfile (created if missing), keeping its comments."
)
def add_host(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="host, host:port, user@host[:port] or [ipv6]:port"),
    hostfile_arg: str = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
    slots: int = typer.Option(None, "--slots", help="slots=N for this host."),
) -> None:
    ui = get_app(ctx).ui
    hostfile = _required_path(hostfile_arg)
    entry = _parse_arg(host, slots)

    def change(lines: list[str]) -> list[str]:
        existing = parse_hostfile("\n".join(lines), str(hostfile), allow_empty=True)
        if any(host_key(h) == host_key(entry) for h in existing):
            raise UsageError(f"{hostfile}: {host} is already there")
        return [*lines, format_host(entry)]

    _edit(hostfile, change, create=True)
    ui.text(f"added {format_host(entry)} to {hostfile}")


@hosts_app.command(
    "remove", cls=Command, help="Remove a host (every line naming it) from a hostfile, keeping comments."
)
def remove_host(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="The host as written in the file (host, host:port, user@host...)."),
    hostfile_arg: str = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
) -> None:
    ui = get_app(ctx).ui
    hostfile = _required_path(hostfile_arg)
    target = _parse_arg(host, None)
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
        if not removed:
            raise UsageError(f"{hostfile}: no line names {host}")
        return kept

    _edit(hostfile, change)
    ui.text(f"removed {len(removed)} line(s) from {hostfile}")


def _required_path(value: str) -> Path:
    """A required ``-H`` (an empty one is refused, not read as the current directory)."""
    path = path_option("-H/--hostfile", value)
    assert path is not None  # typer requires it
    return path


def _parse_arg(text: str, slots: int | None) -> Host:
    try:
        h = parse_host(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if slots is not None and slots < 1:
        raise UsageError(f"--slots must be at least 1, got {slots}")
    return Host(h.name, h.port, h.user, slots)
