"""The one place that writes to the terminal.

Library code never prints: it returns values or raises ``LaunchkitError``; the CLI and the
supervisor call the helpers here. Messages go to stderr (so a job's own stdout stays clean
for pipes); the job's merged output goes to stdout/stderr through ``OutputWriter``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

from rich.console import Console
from rich.table import Table


def _no_color() -> bool:
    return "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb"


class Ui:
    """Holds the consoles; one per CLI invocation, passed down (no global singleton)."""

    def __init__(self, out: Console | None = None, err: Console | None = None) -> None:
        self.out = out or Console(no_color=_no_color(), soft_wrap=True, highlight=False)
        self.err = err or Console(stderr=True, no_color=_no_color(), soft_wrap=True, highlight=False)
        if not self.out.is_terminal:  # pipes and files: never truncate ids or paths
            self.out.width = max(self.out.width, 200)

    # -- messages -------------------------------------------------------------------------
    def info(self, message: str) -> None:
        self.err.print(f"[bold cyan]launchkit[/]: {message}", markup=True)

    def warn(self, message: str) -> None:
        self.err.print("[bold yellow]launchkit: warning:[/] ", end="")
        self.err.print(message, markup=False)

    def error(self, message: str) -> None:
        self.err.print("[bold red]launchkit: error:[/] ", end="")
        self.err.print(message, markup=False)

    def lines(self, lines: Iterable[str], style: str = "dim") -> None:
        for line in lines:
            self.err.print(f"    {line}", style=style, markup=False)

    # -- structured output (stdout) ---------------------------------------------------------
    def table(self, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        t = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
        for c in columns:
            t.add_column(c)
        for row in rows:
            t.add_row(*("" if v is None else str(v) for v in row))
        self.out.print(t)

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()

    def text(self, message: str) -> None:
        self.out.print(message, markup=False)


_ROLE_COLORS = {"scheduler": "35", "server": "34", "worker": "32"}


class OutputWriter:
    """Merges the output of many processes, line by line, each line prefixed ``[role rank]``.

    Lines are written as bytes (no decoding, no markup) under one lock so lines never
    interleave; stdout lines go to stdout and stderr lines to stderr.
    """

    def __init__(self, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> None:
        self._out = stdout or sys.stdout.buffer
        self._err = stderr or sys.stderr.buffer
        self._lock = threading.Lock()
        self._color = {
            "out": not _no_color() and self._isatty(self._out),
            "err": not _no_color() and self._isatty(self._err),
        }

    @staticmethod
    def _isatty(f: BinaryIO) -> bool:
        try:
            return f.isatty()
        except (AttributeError, ValueError):
            return False

    def prefix(self, role: str, rank: int, stream: str) -> bytes:
        label = f"[{role} {rank}]"
        if self._color[stream]:
            return f"\x1b[{_ROLE_COLORS.get(role, '0')}m{label}\x1b[0m ".encode()
        return (label + " ").encode()

    def write(self, prefix: bytes, line: bytes, stream: str) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        target = self._out if stream == "out" else self._err
        with self._lock:
            try:
                target.write(prefix + line)
                target.flush()
            except (BrokenPipeError, ValueError):
                pass  # our reader went away (e.g. `| head`); keep supervising the job
