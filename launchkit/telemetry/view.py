"""From the job's telemetry (``JobMetrics``) to the figures the dashboard's training panel shows.

Pure functions over a model's reports (the times are the reports' own, never the clock's), so
that the launching terminal and ``launchkit top`` in another one, reading the live file, compute
the same panel:

- **step**: the highest step any worker reported;
- **loss**, **accuracy**: the latest of each, and a series for sparklines: the mean over the
  workers that report it of their k-th last report, aligned from the newest;
- **samples/s**: the sum over workers of their ``samples_total`` rate over the last
  ``RATE_WINDOW`` seconds of their reports;
- **MB/s in and out per host**: the ``net_rx_bytes`` / ``net_tx_bytes`` rate of each host's
  reports over the same window; load, memory and GPU from its latest report;
- **compression ratio**: the mean of the workers' latest (cumulative) ``compression_ratio``;
- **lagging**: the worker that lags, named with why: silent (no report for ``STALE`` seconds
  while others report), behind (step well below the median), or slow (samples/s well below
  the median); at most one, the worst;
- **nodes registered**: how many of the job's servers and workers have reported, and not as
  unregistered (``registered`` 0); the scheduler is the one they register with.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dmlc_env.telemetry import finite_number
from launchkit.telemetry.model import Figures, JobMetrics, Series

SERIES = 32  # points kept for a sparkline (it shows the last 30)
RATE_WINDOW = 5.0  # seconds of reports a rate is taken over (at least the last two)
STALE = 10.0  # a worker silent this long while others report is lagging
BEHIND = 0.8  # a step below this fraction of the median (and 2 or more steps back) is behind
SLOW = 0.6  # samples/s below this fraction of the median is slow


@dataclass(frozen=True)
class HostFigures:
    host: str
    load1: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    rx_mbps: float | None = None  # MB/s (10**6 bytes) received, all interfaces but loopback
    tx_mbps: float | None = None
    gpu_util: float | None = None


@dataclass(frozen=True)
class Lagging:
    role: str
    rank: int
    why: str  # e.g. "step 40, median 100"


@dataclass(frozen=True)
class Training:
    nodes_reported: int = 0
    nodes_expected: int = 0
    step: int | None = None
    loss: float | None = None
    loss_series: tuple[float, ...] = ()
    accuracy: float | None = None
    accuracy_series: tuple[float, ...] = ()
    samples_per_s: float | None = None
    samples_series: tuple[float, ...] = ()
    compression_ratio: float | None = None
    hosts: tuple[HostFigures, ...] = ()
    lagging: Lagging | None = None

    @property
    def waiting(self) -> bool:
        """Some nodes reported, not all of them yet: the job is still coming up."""
        return 0 < self.nodes_reported < self.nodes_expected


def rate(series: Series, name: str, window: float = RATE_WINDOW) -> float | None:
    """Per second, of the cumulative figure ``name``, between the newest report and the oldest
    one within ``window`` seconds of it (at least the one before it), never across a drop of the
    counter (a restarted process, an interface gone); None when there are not two such reports."""
    points = [(t, f[name]) for t, f in series.points if name in f]
    if len(points) < 2:
        return None
    t1, v1 = points[-1]
    t0, v0 = t1, v1
    for t, v in reversed(points[:-1]):
        if v > v0 or t >= t0 or (t1 - t > window and t0 < t1):
            break
        t0, v0 = t, v
    if t0 >= t1:
        return None
    return (v1 - v0) / (t1 - t0)


def _aligned(columns: list[list[float]], combine: Callable[[list[float]], float]) -> tuple[float, ...]:
    """``combine`` of the k-th last values of the ``columns`` that have one, for k from the longest
    column's length down to 1 (oldest first): columns aligned from their newest value."""
    columns = [c for c in columns if c]
    if not columns:
        return ()
    longest = max(len(c) for c in columns)
    return tuple(combine([c[-back] for c in columns if len(c) >= back]) for back in range(longest, 0, -1))


def aligned_mean(series: list[Series], name: str, n: int = SERIES) -> tuple[float, ...]:
    """The mean over ``series`` of their k-th last value of ``name``, k = n..1 (oldest first)."""
    columns = [[f[name] for _, f in s.points if name in f][-n:] for s in series]
    return _aligned(columns, lambda values: sum(values) / len(values))


def _latest(series: list[Series], name: str) -> float | None:
    values = [s.latest[name] for s in series if name in s.latest]
    return sum(values) / len(values) if values else None


def samples_series(series: list[Series], n: int = SERIES) -> tuple[float, ...]:
    """Total samples/s between consecutive reports, summed over workers (aligned from the newest)."""
    per_worker = []
    for s in series:
        pts = [(t, f["samples_total"]) for t, f in s.points if "samples_total" in f][-n - 1 :]
        per_worker.append(
            [(v1 - v0) / (t1 - t0) for (t0, v0), (t1, v1) in itertools.pairwise(pts) if t1 > t0]
        )
    return _aligned(per_worker, sum)


def lagging(workers: dict[tuple[str, int], Series]) -> Lagging | None:
    """The worker that lags the others most, or None (it takes two workers to lag)."""
    reporting = {k: s for k, s in workers.items() if s.at is not None}
    if len(reporting) < 2:
        return None
    newest = max(s.at for s in reporting.values() if s.at is not None)
    silent = [(newest - s.at, k) for k, s in reporting.items() if s.at is not None and newest - s.at > STALE]
    if silent:
        age, (role, rank) = max(silent)
        return Lagging(role, rank, f"no report for {age:.0f}s")
    steps = {k: s.latest["step"] for k, s in reporting.items() if "step" in s.latest}
    if len(steps) >= 2:
        median = statistics.median(steps.values())
        key, low = min(steps.items(), key=lambda kv: (kv[1], kv[0]))
        if low < BEHIND * median and median - low >= 2:
            return Lagging(*key, f"step {low:.0f}, median {median:.0f}")
    rates = {k: r for k, s in reporting.items() if (r := rate(s, "samples_total")) is not None}
    if len(rates) >= 2:
        median = statistics.median(rates.values())
        key, low = min(rates.items(), key=lambda kv: (kv[1], kv[0]))
        if median > 0 and low < SLOW * median:
            return Lagging(*key, f"{low:,.0f} samples/s, median {median:,.0f}")
    return None


def host_figures(host: str, series: Series) -> HostFigures:
    latest: Figures = series.latest
    rx = rate(series, "net_rx_bytes")
    tx = rate(series, "net_tx_bytes")
    return HostFigures(
        host,
        latest.get("load1"),
        latest.get("mem_used"),
        latest.get("mem_total"),
        None if rx is None else rx / 1e6,
        None if tx is None else tx / 1e6,
        latest.get("gpu_util"),
    )


KEEP = SERIES + 4  # the reports a panel reads: a sparkline's worth (rates need fewer)


def training(
    model: JobMetrics, nodes_expected: int = 0, running: set[tuple[str, int]] | None = None
) -> Training:
    """The training panel's figures from the model (copied under its lock). Only the workers in
    ``running`` (all when None) can be named as lagging: a worker that has ended is not late."""
    recent = model.copy(KEEP)
    nodes, hosts = recent.nodes, recent.hosts
    workers = {k: s for k, s in nodes.items() if k[0] == "worker"}
    candidates = {k: s for k, s in workers.items() if running is None or k in running}
    ws = [workers[k] for k in sorted(workers)]
    steps = [s.latest["step"] for s in ws if "step" in s.latest]
    rates = [r for s in ws if (r := rate(s, "samples_total")) is not None]
    return Training(
        nodes_reported=sum(
            1 for (role, _), s in nodes.items() if role != "scheduler" and s.latest.get("registered", 1)
        ),
        nodes_expected=nodes_expected,
        step=int(max(steps)) if steps else None,
        loss=_latest(ws, "loss"),
        loss_series=aligned_mean(ws, "loss"),
        accuracy=_latest(ws, "accuracy"),
        accuracy_series=aligned_mean(ws, "accuracy"),
        samples_per_s=sum(rates) if rates else None,
        samples_series=samples_series(ws),
        compression_ratio=_latest(ws, "compression_ratio"),
        hosts=tuple(host_figures(h, hosts[h]) for h in sorted(hosts)),
        lagging=lagging(candidates),
    )


def to_json(t: Training) -> dict[str, Any]:
    """The panel's figures as JSON (the live file carries them, not the reports they come from:
    those grow with the nodes, 9.5 MB at 1024 processes)."""
    return asdict(t)


def _number(v: Any) -> float | None:
    return float(v) if finite_number(v) else None


def _whole(v: Any) -> int | None:
    return int(v) if finite_number(v) and float(v).is_integer() else None


def from_json(doc: Any) -> Training | None:
    """Figures read back from a live file: None for what is not an object; a field of the wrong
    type reads as unknown (left out), never trusted."""
    if not isinstance(doc, dict):
        return None

    def series(name: str) -> tuple[float, ...]:
        values = doc.get(name)
        return tuple(x for v in values if (x := _number(v)) is not None) if isinstance(values, list) else ()

    hosts = []
    listed = doc.get("hosts")
    for h in listed if isinstance(listed, list) else []:
        if isinstance(h, dict) and isinstance(h.get("host"), str):
            names = ("load1", "mem_used", "mem_total", "rx_mbps", "tx_mbps", "gpu_util")
            hosts.append(HostFigures(h["host"], *(_number(h.get(n)) for n in names)))
    lag = doc.get("lagging")
    lagging = None
    if isinstance(lag, dict) and isinstance(lag.get("role"), str) and _whole(lag.get("rank")) is not None:
        lagging = Lagging(lag["role"], _whole(lag["rank"]) or 0, str(lag.get("why", "")))
    step = _whole(doc.get("step"))
    return Training(
        nodes_reported=_whole(doc.get("nodes_reported")) or 0,
        nodes_expected=_whole(doc.get("nodes_expected")) or 0,
        step=step,
        loss=_number(doc.get("loss")),
        loss_series=series("loss_series"),
        accuracy=_number(doc.get("accuracy")),
        accuracy_series=series("accuracy_series"),
        samples_per_s=_number(doc.get("samples_per_s")),
        samples_series=series("samples_series"),
        compression_ratio=_number(doc.get("compression_ratio")),
        hosts=tuple(hosts),
        lagging=lagging,
    )
