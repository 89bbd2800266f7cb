"""``render(state)``: the whole dashboard from a ``DashboardState``, pure (tested on its text).

From the top: the header (job, backend, elapsed, attempt, counts by state), the training panel
(when the job has telemetry), one row per process (at most ``max_rows``: the failed, starting
and slowest processes first, then one line per host, the rest summed up in one line: ``groups``), the root cause of a failure with its last
lines, the output pane, and a closing message."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launchkit.view import groups
from launchkit.view.panel import panel_lines, training_panel
from launchkit.view.state import DashboardState, ProcRow

STATE_STYLE = {
    "running": "green",
    "starting": "yellow",
    "ok": "bold green",
    "failed": "bold red",
    "ended": "dim",
    "lost": "yellow",  # its launcher died: nothing known since
}


def duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def mem(n: int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def counts(rows: tuple[ProcRow, ...]) -> str:
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(by_state.items()))


def header(state: DashboardState, width: int | None = None) -> Text:
    """The frame's title. In a narrow terminal the parts that matter least go first (the job's
    name, the backend, its id, the engine's status, the attempt, the word launchkit), so that the
    elapsed time and the counts by state always show."""
    parts: list[tuple[int, str, str]] = [  # (drop order: highest first, text, style)
        (1, "launchkit ", "bold cyan"),
        (6, f"{state.name} ", "bold"),
        (4, f"{state.job_id}  ", "dim"),
        (5, f"{state.backend}  ", "dim"),
        (0, f"{duration(state.elapsed)}  ", "dim"),
    ]
    if state.attempt is not None:
        of = f" of {state.attempts}" if state.attempts else ""
        parts.append((2, f"attempt {state.attempt}{of}  ", "bold yellow" if state.attempt > 1 else "dim"))
    parts.append((0, counts(state.rows), ""))
    if state.status and not state.finished:
        parts.append((3, f"  {state.status}", "yellow"))
    if width is not None:
        room = width - TITLE_MARGIN
        for drop in (7, 6, 5, 4, 3, 2, 1):
            if sum(cell_len(text) for _, text, _ in parts) <= room:
                break
            parts = [p for p in parts if p[0] < drop]
    return Text.assemble(*((text, style) for _, text, style in parts), no_wrap=True, overflow="ellipsis")


TITLE_MARGIN = 6  # a panel's title: the corner, a rule and a space either side


COLUMNS = ("role", "rank", "host", "pid", "state", "cpu", "mem", "last line")
_DROP = ("last line", "pid", "host", "mem", "cpu")  # in a narrow terminal, the first left out
LAST_LINE_MIN = 8


def _cells(r: ProcRow) -> dict[str, str]:
    return {
        "role": r.role,
        "rank": str(r.rank),
        "host": r.host,
        "pid": "" if r.pid is None else str(r.pid),
        "state": r.state + (f" ({r.detail})" if r.detail else ""),
        "cpu": "" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%",
        "mem": mem(r.rss_bytes),
        "last line": r.last_line,
    }


def columns(rows: list[ProcRow], width: int | None, extra: list[dict[str, str]] | None = None) -> list[str]:
    """The columns that fit ``width`` cells (None: all), each at its widest cell: a row is always
    one line, never wrapped. ``extra``: more rows' cells (a host's line)."""
    shown = list(COLUMNS)
    if width is None:
        return shown
    cells = [_cells(r) for r in rows] + (extra or [])

    def need(cols: list[str]) -> int:  # a space either side of each cell, a rule between
        widest = [
            max(cell_len(c), *(cell_len(x[c]) for x in cells)) if c != "last line" else LAST_LINE_MIN
            for c in cols
        ]
        return sum(w + 2 for w in widest) + len(cols) - 1

    for col in _DROP:
        if need(shown) <= width:
            break
        shown.remove(col)
    return shown


def process_table(state: DashboardState, max_rows: int | None, width: int | None = None) -> Table:
    table = Table(expand=True, show_edge=False, header_style="bold")
    lagging = state.training.lagging if state.training is not None else None
    chosen = groups.choose(state.rows, max_rows, (lagging.role, lagging.rank) if lagging else None)
    rows = chosen.rows
    lines = [_host_line(line) for line in chosen.hosts]
    shown = columns(rows, width, lines)
    for col in shown:
        kw: dict[str, object] = {"justify": "right"} if col in ("rank", "pid", "cpu", "mem") else {}
        if col == "last line":
            kw["ratio"] = 1
        table.add_column(col, no_wrap=True, overflow="ellipsis", **kw)  # type: ignore[arg-type]
    for r in rows:
        cells = _cells(r)
        table.add_row(
            *(
                Text(cells[c], style=STATE_STYLE.get(r.state, "")) if c == "state" else Text(cells[c])
                for c in shown
            )
        )
    for cells in lines:
        table.add_row(*(Text(cells[c], style="dim" if c == "role" else "") for c in shown))
    if chosen.left_out:
        hosts = f" on {len({r.host for r in chosen.left_out})} hosts" if chosen.hosts else ""
        table.caption = f"... and {len(chosen.left_out)} more processes{hosts}: {counts(chosen.left_out)}"
        table.caption_justify = "left"
    return table


def _host_line(line: groups.HostLine) -> dict[str, str]:
    """A host's processes in one row: how many, their states, mean CPU, total memory, roles."""
    cpu = line.cpu_percent
    n = len(line.rows)
    return {
        "role": f"{n} proc{'s' if n > 1 else ''}",
        "rank": "",
        "host": line.host,
        "pid": "",
        "state": line.states,
        "cpu": "" if cpu is None else f"{cpu:.0f}%",
        "mem": mem(line.rss_bytes),
        "last line": line.roles,
    }


def root_cause_panel(state: DashboardState) -> RenderableType | None:
    rc = state.root_cause
    if rc is None:
        return None
    body = Text()
    body.append("\n".join(rc.lines))
    if not rc.lines:
        body.append("(no output)", style="dim")
    title = f"root cause: {rc.role} {rc.rank} on {rc.host} ({rc.detail}), its last lines"
    return Panel(body, title=title, title_align="left", border_style="red")


MIN_LOG = 3  # output lines kept when the process rows need the room


def fit(state: DashboardState, height: int, width: int | None = None) -> tuple[int, int]:
    """(process rows, output lines) that fit a terminal ``height`` lines high (and ``width``
    wide, which decides the training panel's layout) beside the other parts: every row when they
    fit with ``MIN_LOG`` output lines, the output pane the rest."""
    used = 4 + 2 + (1 if state.message else 0)  # the frame, the table's header, the output pane's box
    t = state.training
    if t is not None:
        used += panel_lines(t, state.finished, None if width is None else width - FRAME)
    if state.root_cause is not None:
        used += 2 + max(1, len(state.root_cause.lines))
    room = max(0, height - used)
    rows = len(state.rows) if len(state.rows) + MIN_LOG <= room else max(3, room - MIN_LOG)
    return rows, max(1, min(len(state.log), room - min(rows, len(state.rows)) - 1))


FRAME = 4  # the frame's border and padding, both sides


def render(
    state: DashboardState, max_rows: int | None = None, log_lines: int | None = None, width: int | None = None
) -> RenderableType:
    """The whole dashboard; ``width``: the terminal's, for a layout that never wraps a line (None:
    as wide as it takes, for a pipe)."""
    inner = None if width is None else width - FRAME
    parts: list[RenderableType] = []
    if state.training is not None:
        parts.append(training_panel(state.training, state.finished, inner))
    parts.append(process_table(state, max_rows, inner))
    cause = root_cause_panel(state)
    if cause is not None:
        parts.append(cause)
    log = Text(no_wrap=True, overflow="ellipsis")
    shown = state.log if log_lines is None else state.log[max(0, len(state.log) - log_lines) :]
    for i, (label, line) in enumerate(shown):
        log.append(("\n" if i else "") + f"[{label}] ", style="dim")
        log.append(line)
    parts.append(Panel(log, title="output", title_align="left", border_style="dim"))
    if state.message:
        parts.append(Text(state.message, style="bold", no_wrap=True, overflow="ellipsis"))
    return Panel(Group(*parts), title=header(state, width), title_align="left")
