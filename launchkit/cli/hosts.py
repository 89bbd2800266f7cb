"""``launchkit hosts``: inspect hostfiles."""

from __future__ import annotations

from pathlib import Path

import typer

from launchkit.cli.app import get_app
from launchkit.hostfile import read_hostfile

hosts_app = typer.Typer(help="Inspect and manage hostfiles.", no_args_is_help=True)


@hosts_app.command("list", help="Print the parsed hosts of a hostfile.")
def list_hosts(
    ctx: typer.Context,
    hostfile: Path = typer.Option(..., "-H", "--hostfile", help="The hostfile."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ui = get_app(ctx).ui
    hosts = read_hostfile(hostfile)
    if as_json:
        ui.json(
            [
                {"host": h.name, "user": h.user, "port": h.port, "slots": h.slots, "line": h.line}
                for h in hosts
            ]
        )
        return
    ui.table(
        f"{hostfile}: {len(hosts)} host(s)",
        ["line", "host", "user", "port", "slots"],
        [[h.line, h.name, h.user or "", h.port or "", h.slots or ""] for h in hosts],
    )
