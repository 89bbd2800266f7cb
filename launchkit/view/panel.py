"""The training panel: step, loss, accuracy and samples/s with sparklines, compression, the
lagging worker, and one line per host (load, memory, network in and out, GPU)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launchkit.telemetry.view import HostFigures, Training

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as unicode blocks, scaled between their minimum and maximum."""
    values = list(values)[-width:] if width > 0 else []
    if not values:
        return ""
    low, high = min(values), max(values)
    if high <= low:
        return BLOCKS[len(BLOCKS) // 2 - 1] * len(values)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - low) / (high - low) * top)] for v in values)


def number(value: float | None, digits: int = 4) -> str:
    """A figure at ``digits`` significant digits (thousands separated from 10,000 on)."""
    if value is None:
        return "-"
    if abs(value) >= 1_000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}"


def mbps(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _values(t: Training) -> list[tuple[str, str | Text, Sequence[float] | str | Text]]:
    """The figures' rows: (label, value, sparkline series or a note)."""
    rows: list[tuple[str, str | Text, Sequence[float] | str | Text]] = [
        ("step", "-" if t.step is None else f"{t.step:,}", ""),
        ("loss", number(t.loss), t.loss_series),
        ("accuracy", number(t.accuracy), t.accuracy_series),
        ("samples/s", number(t.samples_per_s, 3), t.samples_series),
    ]
    if t.compression_ratio is not None:
        rows.append(("compression", f"{t.compression_ratio:.1f}x", ""))
    if t.lagging is not None:
        lag = t.lagging
        rows.append(
            ("slowest", Text(f"{lag.role} {lag.rank}", style="bold yellow"), Text(lag.why, style="yellow"))
        )
    return rows


LABEL = 11  # the figures' label column


def figures_width(t: Training) -> int:
    """The figures without their sparklines: label, value and the space between."""
    values = [v.cell_len if isinstance(v, Text) else cell_len(v) for _, v, _ in _values(t)]
    return LABEL + 1 + max(values)


def figures_table(t: Training, spark: int = SPARK_WIDTH) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, min_width=LABEL)
    grid.add_column(justify="right", no_wrap=True)
    if spark:  # no room: no sparklines, and the slowest worker named without the why
        grid.add_column(style="cyan", no_wrap=True, overflow="ellipsis")
    for label, value, series in _values(t):
        third = series if isinstance(series, (str, Text)) else sparkline(series, spark)
        grid.add_row(label, value, *((third,) if spark else ()))
    return grid


#: The most hosts the panel lists: beyond it the busiest (highest load) and one line for the rest.
HOST_ROWS = 8


def shown_hosts(hosts: Sequence[HostFigures]) -> tuple[list[HostFigures], int]:
    """The hosts the panel lists (all in order while they fit in ``HOST_ROWS``, else the busiest
    first) and how many are left out."""
    if len(hosts) <= HOST_ROWS:
        return list(hosts), 0
    busiest = sorted(
        hosts, key=lambda h: (-(h.load1 or 0.0), -((h.rx_mbps or 0.0) + (h.tx_mbps or 0.0)), h.host)
    )
    return busiest[: HOST_ROWS - 1], len(hosts) - (HOST_ROWS - 1)


def _host_cells(all_hosts: Sequence[HostFigures]) -> tuple[list[str], list[list[str]]]:
    columns = ["host", "load", "mem GiB", "in MB/s", "out MB/s"]
    hosts, left_out = shown_hosts(all_hosts)
    gpu = any(h.gpu_util is not None for h in hosts)
    if gpu:
        columns.append("gpu")
    rows = []
    for h in hosts:
        mem = "-" if h.mem_used is None else f"{gib(h.mem_used)}/{gib(h.mem_total)}"
        cells = [h.host, number(h.load1, 3), mem, mbps(h.rx_mbps), mbps(h.tx_mbps)]
        if gpu:
            cells.append("-" if h.gpu_util is None else f"{h.gpu_util:.0f}%")
        rows.append(cells)
    if left_out:  # the rest in one line: their median load
        kept = set(hosts)
        rest = sorted(h.load1 for h in all_hosts if h.load1 is not None and h not in kept)
        median = rest[len(rest) // 2] if rest else None
        rows.append([f"+{left_out} more", number(median, 3), "", "", "", *([""] if gpu else [])])
    return columns, rows


def hosts_width(hosts: Sequence[HostFigures]) -> int:
    """The hosts table's width (each column its widest cell, a space either side)."""
    columns, rows = _host_cells(hosts)
    return sum(max(cell_len(c) for c in (col, *(r[i] for r in rows))) + 2 for i, col in enumerate(columns))


def hosts_table(hosts: Sequence[HostFigures]) -> Table:
    table = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    columns, rows = _host_cells(hosts)
    for col in columns:
        table.add_column(col, justify="left" if col == "host" else "right", no_wrap=True, overflow="ellipsis")
    for cells in rows:
        table.add_row(*cells)
    return table


#: the stacked form's label and unit of each table column (a narrow terminal)
STACKED = {
    "load": ("load", ""),
    "mem GiB": ("mem", " GiB"),
    "in MB/s": ("in", " MB/s"),
    "out MB/s": ("out", " MB/s"),
}


def stacked_hosts(hosts: Sequence[HostFigures], width: int) -> list[str] | None:
    """The hosts as lines of ``width`` cells when their table is wider (None: the table fits): each
    host's name, then its figures as ``label value`` pairs, each pair whole, wrapping onto lines
    indented by two; so that no figure is cut (only a host name longer than the line)."""
    if hosts_width(hosts) <= width:
        return None
    columns, rows = _host_cells(hosts)
    lines: list[str] = []
    for name, *cells in rows:
        line = name
        for col, value in zip(columns[1:], cells, strict=True):
            if not value:
                continue
            label, unit = STACKED.get(col, (col, ""))
            if name.startswith("+") and col == "load":
                label = "median load"
            pair = f"{label} {value}{unit if value != '-' else ''}"
            if cell_len(line) + 2 + cell_len(pair) <= width:
                line += "  " + pair
            else:
                lines.append(line)
                line = "  " + pair
        lines.append(line)
    return lines


def waiting_line(t: Training, width: int | None = None) -> str:
    """How many nodes registered; shorter where ``width`` cannot hold it (the figures whole)."""
    line = f"waiting for nodes to register: {t.nodes_reported} of {t.nodes_expected}"
    if width is not None and cell_len(line) > width:
        line = f"registered: {t.nodes_reported} of {t.nodes_expected}"
    return line


GAP = 4  # between the figures and the hosts table
MIN_SPARK = 6  # a shorter sparkline is left out


def layout(t: Training, width: int | None) -> tuple[bool, int]:
    """(hosts beside the figures, sparkline width) for a panel ``width`` cells wide (None: as wide
    as it takes). Beside them while both fit with a short sparkline; below them otherwise, so that
    no figure is ever cut (a narrow terminal); the sparklines take what room is left."""
    if width is None:
        return True, SPARK_WIDTH
    inner = width - 4  # the panel's border and padding
    figures = figures_width(t) + 1
    least = figures
    if t.nodes_reported == 0:
        least = cell_len(NO_REPORT)
    hosts = hosts_width(t.hosts) if t.hosts else 0
    beside = not hosts or least + GAP + hosts <= inner
    room = inner - figures - (GAP + hosts if beside and hosts else 0)
    return beside, min(SPARK_WIDTH, room) if room >= MIN_SPARK else 0


def panel_lines(t: Training, finished: bool, width: int | None) -> int:
    """How many lines ``training_panel`` takes."""
    figures = len(_values(t)) if t.nodes_reported else 1
    hosts = min(len(t.hosts), HOST_ROWS) + 1 if t.hosts else 0
    beside, _ = layout(t, width)
    stacked = stacked_hosts(t.hosts, width - 4) if t.hosts and not beside and width is not None else None
    if stacked is not None:
        hosts = len(stacked)
    body = max(figures, hosts) if beside else figures + hosts
    return 2 + body + (1 if t.waiting and not finished else 0)


NO_REPORT = "no training report yet (trainer_core's nodes report here)"


def training_panel(t: Training, finished: bool = False, width: int | None = None) -> RenderableType:
    parts: list[RenderableType] = []
    if t.waiting and not finished:
        line = waiting_line(t, None if width is None else width - 4)
        parts.append(Text(line, style="yellow", no_wrap=True, overflow="ellipsis"))
    beside, spark = layout(t, width)
    figures: RenderableType = figures_table(t, spark)
    if t.nodes_reported == 0:
        figures = Text(NO_REPORT, style="dim", no_wrap=True, overflow="ellipsis")
    hosts: RenderableType = hosts_table(t.hosts) if t.hosts else ""
    stacked = stacked_hosts(t.hosts, width - 4) if t.hosts and not beside and width is not None else None
    if stacked is not None:  # a narrow panel: the table's columns would be cut
        hosts = Text("\n".join(stacked), no_wrap=True, overflow="ellipsis")
    if beside:
        row = Table.grid(padding=(0, GAP))
        row.add_column()
        row.add_column()
        row.add_row(figures, hosts)
        parts.append(row)
    else:
        parts += [figures, hosts]
    return Panel(Group(*parts), title="training", title_align="left", border_style="blue")
