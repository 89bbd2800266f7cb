"""``render(state)``: the whole dashboard from a ``DashboardState``, pure (tested on its text).

From the top: the header (job, backend, elapsed, attempt, counts by state), the training panel
(when the job has telemetry), one row per process (at most ``max_rows``: failed and starting
processes first, the rest summed up in one line), the root cause of a failure with its last
lines, the output pane, and a closing message."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launchkit.view.panel import training_panel
from launchkit.view.state import DashboardState, ProcRow

STATE_STYLE = {
    "running": "green",
    "starting": "yellow",
    "ok": "bold green",
    "failed": "bold red",
    "ended": "dim",
}
_FIRST = {"failed": 0, "starting": 1}  # shown first when not every row fits


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


def header(state: DashboardState) -> Text:
    title = Text.assemble(
        ("launchkit ", "bold cyan"),
        (f"{state.name} ", "bold"),
        (f"{state.job_id}  {state.backend}  {duration(state.elapsed)}  ", "dim"),
    )
    if state.attempt is not None:
        of = f" of {state.attempts}" if state.attempts else ""
        title.append(f"attempt {state.attempt}{of}  ", style="bold yellow" if state.attempt > 1 else "dim")
    title.append(counts(state.rows))
    if state.status and not state.finished:
        title.append(f"  {state.status}", style="yellow")
    return title


def shown_rows(rows: tuple[ProcRow, ...], max_rows: int | None) -> tuple[list[ProcRow], int]:
    """The rows that fit in ``max_rows`` (failed and starting first, then in order), and how
    many are left out."""
    if max_rows is None or len(rows) <= max_rows:
        return list(rows), 0
    keep = max(1, max_rows - 1)  # one line says what is left out
    order = sorted(range(len(rows)), key=lambda i: (_FIRST.get(rows[i].state, 2), i))
    chosen = sorted(order[:keep])
    return [rows[i] for i in chosen], len(rows) - keep


def process_table(state: DashboardState, max_rows: int | None) -> Table:
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
    rows, left_out = shown_rows(state.rows, max_rows)
    for r in rows:
        st = Text(r.state + (f" ({r.detail})" if r.detail else ""), style=STATE_STYLE.get(r.state, ""))
        table.add_row(
            r.role,
            str(r.rank),
            r.host,
            "" if r.pid is None else str(r.pid),
            st,
            "" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%",
            mem(r.rss_bytes),
            Text(r.last_line),
        )
    if left_out:
        hidden = tuple(r for r in state.rows if r not in rows)
        table.caption = f"... and {left_out} more processes: {counts(hidden)}"
        table.caption_justify = "left"
    return table


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


def fit(state: DashboardState, height: int) -> tuple[int, int]:
    """(process rows, output lines) that fit a terminal ``height`` lines high beside the other
    parts: every row when they fit with ``MIN_LOG`` output lines, the output pane the rest."""
    used = 4 + 2 + (1 if state.message else 0)  # the frame, the table's header, the output pane's box
    t = state.training
    if t is not None:
        used += 2 + max(5 if t.compression_ratio is None else 6, len(t.hosts) + 1) + (1 if t.waiting else 0)
        used += 1 if t.lagging is not None else 0
    if state.root_cause is not None:
        used += 2 + max(1, len(state.root_cause.lines))
    room = max(0, height - used)
    rows = len(state.rows) if len(state.rows) + MIN_LOG <= room else max(3, room - MIN_LOG)
    return rows, max(1, min(len(state.log), room - min(rows, len(state.rows)) - 1))


def render(
    state: DashboardState, max_rows: int | None = None, log_lines: int | None = None
) -> RenderableType:
    parts: list[RenderableType] = []
    if state.training is not None:
        parts.append(training_panel(state.training, state.finished))
    parts.append(process_table(state, max_rows))
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
        parts.append(Text(state.message, style="bold"))
    return Panel(Group(*parts), title=header(state), title_align="left")
