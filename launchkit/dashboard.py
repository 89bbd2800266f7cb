"""The live terminal dashboard of a running job.

``render`` is pure: a ``DashboardState`` in, a rich renderable out (tested on its text).
``Dashboard`` is the effect around it: a ``rich.live.Live`` refreshed by the supervisor, plus
the CPU/memory sampling of the job's local processes.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launchkit.procstat import usage_by_group

STATE_STYLE = {
    "running": "green",
    "starting": "yellow",
    "ok": "bold green",
    "failed": "bold red",
    "ended": "dim",
}


@dataclass(frozen=True)
class ProcRow:
    role: str
    rank: int
    host: str
    pid: int | None
    state: str  # starting, running, ok, failed, ended
    detail: str = ""  # e.g. "exit 3", "signal 9"
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    last_line: str = ""


@dataclass(frozen=True)
class DashboardState:
    job_id: str
    name: str
    backend: str
    elapsed: float
    rows: tuple[ProcRow, ...]
    log: tuple[tuple[str, str], ...] = ()  # (label, line), newest last
    message: str = ""


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _mem(n: int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def render(state: DashboardState) -> RenderableType:
    counts: dict[str, int] = {}
    for r in state.rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    title = Text.assemble(
        ("launchkit ", "bold cyan"),
        (f"{state.name} ", "bold"),
        (f"{state.job_id}  {state.backend}  {_duration(state.elapsed)}  ", "dim"),
        (summary, ""),
    )
    table = Table(expand=True, show_edge=False, header_style="bold")
    for col, kw in (
        ("role", {}),
        ("rank", {"justify": "right"}),
        ("host", {}),
        ("pid", {"justify": "right"}),
        ("state", {}),
        ("cpu", {"justify": "right"}),
        ("mem", {"justify": "right"}),
        ("last line", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"}),
    ):
        table.add_column(col, **kw)
    for r in state.rows:
        st = Text(r.state + (f" ({r.detail})" if r.detail else ""), style=STATE_STYLE.get(r.state, ""))
        table.add_row(
            r.role,
            str(r.rank),
            r.host,
            "" if r.pid is None else str(r.pid),
            st,
            "" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%",
            _mem(r.rss_bytes),
            Text(r.last_line),
        )
    log = Text()
    for label, line in state.log:
        log.append(f"[{label}] ", style="dim")
        log.append(line + "\n")
    parts: list[RenderableType] = [table, Panel(log, title="output", title_align="left", border_style="dim")]
    if state.message:
        parts.append(Text(state.message, style="bold"))
    return Panel(Group(*parts), title=title, title_align="left")


class CpuMeter:
    """CPU percent per process group between two samples."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}

    def sample(self, groups: set[int]) -> dict[int, tuple[float | None, int]]:
        now = time.monotonic()
        out: dict[int, tuple[float | None, int]] = {}
        for g, u in usage_by_group(groups).items():
            prev = self._last.get(g)
            pct = (
                None
                if prev is None or now <= prev[0]
                else 100.0 * (u.cpu_seconds - prev[1]) / (now - prev[0])
            )
            self._last[g] = (now, u.cpu_seconds)
            out[g] = (pct, u.rss_bytes)
        return out


class Dashboard:
    """A Live view; ``update`` takes a state built by the caller, at most every ``interval``."""

    def __init__(self, console: Console, interval: float = 0.5, log_lines: int = 12) -> None:
        self.console = console
        self.interval = interval
        self.log: deque[tuple[str, str]] = deque(maxlen=log_lines)
        self.cpu = CpuMeter()
        self._live: Live | None = None
        self._next = 0.0

    def add_line(self, label: str, line: str) -> None:
        self.log.append((label, line))

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def update(self, state: DashboardState) -> None:
        self._next = time.monotonic() + self.interval
        if self._live is None:
            self._live = Live(render(state), console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        else:
            self._live.update(render(state), refresh=True)

    def stop(self, state: DashboardState | None = None) -> None:
        if self._live is not None:
            if state is not None:
                self._live.update(render(state), refresh=True)
            self._live.stop()
            self._live = None


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
