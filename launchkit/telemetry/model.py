"""What the launcher knows of a running job's training and hosts: pure data, filled by the
telemetry endpoint and the host samplers, read by the dashboard, ``top`` and ``ps``.

Two kinds of report arrive, each a flat mapping of figure names to numbers:

- a **node report** from one process (role, rank), sent by trainer_core at a bounded rate:
  ``bytes_pushed``, ``bytes_pulled`` (cumulative), ``push_ms``, ``pull_ms`` (mean latency since
  the previous report), ``compression_ratio`` (raw bytes / bytes on the wire, cumulative),
  ``heartbeat_age_s``, and what the training script passes to ``trainer_core.metrics.report``:
  ``step``, ``loss``, ``accuracy``, ``samples_total`` (cumulative), and any other number;
- a **host report** from one host's sampler: ``load1``, ``mem_used``, ``mem_total``,
  ``net_rx_bytes``, ``net_tx_bytes`` (cumulative, all interfaces but loopback), ``gpu_util``,
  ``gpu_mem_used``, ``gpu_mem_total`` (where ``nvidia-smi`` exists), and per process of the job
  (by pid on that host) its CPU percent and resident bytes.

Each keeps a bounded history (for sparklines and rates). The model is guarded by one lock, and
``to_json``/``from_json`` carry it to ``top`` in another terminal through the job's live file.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dmlc_env.telemetry import finite_number

HISTORY = 240  # reports kept per node and per host

Figures = dict[str, float]


@dataclass
class Series:
    """Timestamped reports, newest last, at most HISTORY."""

    points: deque[tuple[float, Figures]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    @property
    def latest(self) -> Figures:
        return self.points[-1][1] if self.points else {}

    def last(self, n: int | None = None) -> list[tuple[float, Figures]]:
        """The newest ``n`` reports (all of them when None), oldest first, copied."""
        points = self.points
        return list(points) if n is None else list(itertools.islice(points, max(0, len(points) - n), None))

    @property
    def at(self) -> float | None:
        return self.points[-1][0] if self.points else None

    def cut(self, n: int | None = None) -> Series:
        """A new series of the newest ``n`` reports (all of them when None)."""
        return Series(deque(self.last(n), maxlen=self.points.maxlen))


def _clean(figures: Mapping[str, Any]) -> Figures:
    """Only finite numbers (bools excluded): a report is never trusted to be well formed."""
    return {k: float(v) for k, v in figures.items() if isinstance(k, str) and finite_number(v)}


def _dicts(doc: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """The objects in the list ``doc[name]`` of a saved model (untrusted: anything else is skipped)."""
    value = doc.get(name)
    return [d for d in value if isinstance(d, dict)] if isinstance(value, list) else []


def _points(raw: Any) -> list[tuple[float, dict[str, Any]]]:
    """The well-formed ``[time, figures]`` pairs of a saved series (untrusted)."""
    if not isinstance(raw, list):
        return []
    return [
        (float(p[0]), p[1])
        for p in raw
        if isinstance(p, list) and len(p) == 2 and finite_number(p[0]) and isinstance(p[1], dict)
    ]


class JobMetrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[tuple[str, int], Series] = {}
        self.hosts: dict[str, Series] = {}
        self.procs: dict[tuple[str, int], tuple[float | None, int]] = {}  # (host, pid) -> (cpu %, rss)

    def node_report(self, role: str, rank: int, at: float, figures: Mapping[str, Any]) -> None:
        with self.lock:
            self.nodes.setdefault((role, rank), Series()).points.append((at, _clean(figures)))

    def host_report(
        self,
        host: str,
        at: float,
        figures: Mapping[str, Any],
        procs: Mapping[int, tuple[float | None, int]] | None = None,
    ) -> None:
        with self.lock:
            self.hosts.setdefault(host, Series()).points.append((at, _clean(figures)))
            for pid, usage in (procs or {}).items():
                self.procs[(host, int(pid))] = usage

    def copy(self, keep: int | None = None) -> JobMetrics:
        """A copy taken at one moment (under the lock), each series cut to its last ``keep`` reports."""
        m = JobMetrics()
        with self.lock:
            m.nodes = {k: s.cut(keep) for k, s in self.nodes.items()}
            m.hosts = {h: s.cut(keep) for h, s in self.hosts.items()}
            m.procs = dict(self.procs)
        return m

    def to_json(self, keep: int | None = None) -> dict[str, Any]:
        """The model as JSON; with ``keep``, each series cut to its last ``keep`` reports (cut
        before it is copied: a caller pays for what it keeps, not for the whole history)."""
        with self.lock:
            nodes = {k: s.last(keep) for k, s in self.nodes.items()}
            hosts = {h: s.last(keep) for h, s in self.hosts.items()}
            procs = list(self.procs.items())
        return {
            "nodes": [
                {"role": r, "rank": k, "points": [[t, f] for t, f in p]} for (r, k), p in nodes.items()
            ],
            "hosts": [{"host": h, "points": [[t, f] for t, f in p]} for h, p in hosts.items()],
            "procs": [[h, p, c, m] for (h, p), (c, m) in procs],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobMetrics:
        """The model saved by ``to_json`` (another launcher's live file: checked, never trusted)."""
        m = cls()
        for n in _dicts(doc, "nodes"):
            if isinstance(n.get("role"), str) and isinstance(n.get("rank"), int):
                for t, f in _points(n.get("points")):
                    m.node_report(n["role"], n["rank"], t, f)
        for h in _dicts(doc, "hosts"):
            if isinstance(h.get("host"), str):
                for t, f in _points(h.get("points")):
                    m.host_report(h["host"], t, f)
        for row in doc.get("procs", []) if isinstance(doc.get("procs"), list) else []:
            if (
                isinstance(row, list)
                and len(row) == 4
                and isinstance(row[0], str)
                and isinstance(row[1], int)
            ):
                cpu = float(row[2]) if finite_number(row[2]) else None
                rss = row[3] if isinstance(row[3], int) else 0
                m.procs[(row[0], row[1])] = (cpu, rss)
        return m
