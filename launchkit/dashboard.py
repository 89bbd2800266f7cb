"""The live terminal dashboard of a running job.

``launchkit.view.render.render`` is pure: a ``DashboardState`` in, a rich renderable out (tested
on its text). ``Dashboard`` is the effect around it: a ``rich.live.Live`` refreshed from the
supervisor's loop (``launchkit.watch``, which also samples the job's local processes), sized to
the terminal, and the sinks that keep the newest output lines for it (``TailSink``, ``LineSink``).
"""

from __future__ import annotations

import contextlib
import os
import termios
import time
from collections import deque
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.live import Live

from launchkit.merger import Sink, clip
from launchkit.view.render import fit, render
from launchkit.view.state import DashboardState, ProcRow, RootCause

__all__ = [
    "Dashboard",
    "DashboardState",
    "LineSink",
    "ProcRow",
    "RootCause",
    "TailSink",
    "fit",
    "render",
]


class Dashboard:
    """A Live view; ``update`` takes a state built by the caller, at most every ``interval``."""

    def __init__(self, console: Console, interval: float = 1.0, log_lines: int = 12) -> None:
        self.console = console
        self.interval = interval
        self.log: deque[tuple[str, str]] = deque(maxlen=log_lines)
        self._live: Live | None = None
        self._next = 0.0
        self._restore: Callable[[], None] | None = None

    def add_line(self, label: str, line: str) -> None:
        self.log.append((label, line))

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def update(self, state: DashboardState) -> None:
        self._next = time.monotonic() + self.interval
        if self._live is None:
            self._restore = quiet_echo(self.console)
            self._live = Live(self.view(state), console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        else:
            self._live.update(self.view(state), refresh=True)

    def view(self, state: DashboardState) -> RenderableType:
        width = self.console.width
        return render(state, *fit(state, self.console.height, width), width=width)

    def stop(self, state: DashboardState | None = None) -> None:
        if self._live is not None:
            if state is not None:
                self._live.update(self.view(state), refresh=True)
            self._live.stop()
            self._live = None
        if self._restore is not None:
            self._restore()
            self._restore = None


def quiet_echo(console: Console) -> Callable[[], None] | None:
    """Turn the terminal's echo off while the view is shown: a key typed or a Ctrl-C (``^C``) was
    echoed at the end of the frame, moved the cursor a line down, and every frame after it was
    drawn a line too low, leaving the top line of the one before on the screen. Returns what puts
    the echo back; None where there is nothing to do (not a terminal, a job in the background)."""
    try:
        fd = console.file.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return None
        before = termios.tcgetattr(fd)
        quiet = termios.tcgetattr(fd)
        quiet[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    except (OSError, ValueError, termios.error):  # io.UnsupportedOperation is an OSError
        return None

    def restore() -> None:
        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, before)

    return restore


class TailSink:
    """Passes the output on to ``inner`` (the console writer) and keeps its last lines, labelled
    ``role rank``, in ``log`` (for the live file when no dashboard is shown)."""

    def __init__(self, inner: Sink, log: deque[tuple[str, str]]) -> None:
        self.inner = inner
        self.log = log
        self.labels: dict[bytes, str] = {}

    def prefix(self, role: str, rank: int, stream: str) -> bytes:
        p = self.inner.prefix(role, rank, stream)
        self.labels[p] = f"{role} {rank}"
        return p

    def add(self, prefix: bytes, lines: bytes, stream: str) -> None:
        self.inner.add(prefix, lines, stream)
        n = self.log.maxlen or 0
        label = self.labels.get(prefix, "?")
        for line in lines.rsplit(b"\n", n + 1)[-n - 1 : -1]:
            self.log.append((label, clip(line)))

    def flush(self) -> None:
        self.inner.flush()


class LineSink:
    """Stands in for ``OutputWriter`` while the dashboard is shown: lines go to its log panel."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def prefix(self, role: str, rank: int, stream: str) -> bytes:
        return f"{role} {rank}".encode()

    def write(self, prefix: bytes, line: bytes, stream: str) -> None:
        self.dashboard.add_line(prefix.decode(), line.decode(errors="replace").rstrip("\n"))

    def add(self, prefix: bytes, lines: bytes, stream: str) -> None:
        label = prefix.decode()
        for line in lines.decode(errors="replace").splitlines()[-200:]:
            self.dashboard.add_line(label, line)

    def flush(self) -> None:
        """Lines are shown as they are added."""
