"""The ``launchkit`` command line: one module per command, registered on the root app."""

from __future__ import annotations

import os
import sys

from launchkit.cli import hosts, kill, launch, logs, ps, top
from launchkit.cli.app import app
from launchkit.console import Ui
from launchkit.errors import EXIT_INTERNAL, EXIT_SIGINT, LaunchkitError

for module in (launch, ps, kill, top, logs):
    module.register(app)
app.add_typer(hosts.hosts_app, name="hosts")


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one message and an exit code, never a traceback.
    (typer/click already turn bad flags into a usage message and exit code 2.)"""
    try:
        app(args=argv, prog_name="launchkit")
    except LaunchkitError as exc:
        Ui().error(exc.message)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_SIGINT)
    except Exception as exc:
        if os.environ.get("LAUNCHKIT_DEBUG"):
            raise
        Ui().error(f"internal error: {type(exc).__name__}: {exc} (set LAUNCHKIT_DEBUG=1 for a traceback)")
        sys.exit(EXIT_INTERNAL)
