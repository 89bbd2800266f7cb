"""The training panel: step, loss, accuracy and samples/s with sparklines, compression, the
lagging worker, and one line per host (load, memory, network in and out, GPU)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launchkit.telemetry.view import HostFigures, Training

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as unicode blocks, scaled between their minimum and maximum."""
    values = list(values)[-width:]
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


def figures_table(t: Training) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, min_width=11)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(style="cyan", no_wrap=True)
    grid.add_row("step", "-" if t.step is None else f"{t.step:,}", "")
    grid.add_row("loss", number(t.loss), sparkline(t.loss_series))
    grid.add_row("accuracy", number(t.accuracy), sparkline(t.accuracy_series))
    grid.add_row("samples/s", number(t.samples_per_s, 3), sparkline(t.samples_series))
    if t.compression_ratio is not None:
        grid.add_row("compression", f"{t.compression_ratio:.1f}x", "")
    if t.lagging is not None:
        lag = t.lagging
        grid.add_row(
            "slowest", Text(f"{lag.role} {lag.rank}", style="bold yellow"), Text(lag.why, style="yellow")
        )
    return grid


def hosts_table(hosts: Sequence[HostFigures]) -> Table:
    table = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("host", "load", "mem GiB", "in MB/s", "out MB/s"):
        table.add_column(col, justify="left" if col == "host" else "right", no_wrap=True)
    gpu = any(h.gpu_util is not None for h in hosts)
    if gpu:
        table.add_column("gpu", justify="right")
    for h in hosts:
        mem = "-" if h.mem_used is None else f"{gib(h.mem_used)}/{gib(h.mem_total)}"
        cells = [h.host, number(h.load1, 3), mem, mbps(h.rx_mbps), mbps(h.tx_mbps)]
        if gpu:
            cells.append("-" if h.gpu_util is None else f"{h.gpu_util:.0f}%")
        table.add_row(*cells)
    return table


def waiting_line(t: Training) -> str:
    return f"waiting for nodes to register: {t.nodes_reported} of {t.nodes_expected}"


def training_panel(t: Training, finished: bool = False) -> RenderableType:
    parts: list[RenderableType] = []
    if t.waiting and not finished:
        parts.append(Text(waiting_line(t), style="yellow"))
    figures: RenderableType = figures_table(t)
    if t.nodes_reported == 0:
        figures = Text("no training report yet (trainer_core's nodes report here)", style="dim")
    row = Table.grid(padding=(0, 4))
    row.add_column()
    row.add_column()
    row.add_row(figures, hosts_table(t.hosts) if t.hosts else "")
    parts.append(row)
    return Panel(Group(*parts), title="training", title_align="left", border_style="blue")
