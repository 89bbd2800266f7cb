"""A host's figures and its job processes' usage, from /proc (and ``nvidia-smi`` where it exists).

The same code samples the launcher's host (``launchkit.telemetry.endpoint``) and every ssh host
(the watchdog, which carries this module as source): remote rows and local rows show the same
columns. The figures are those of ``launchkit.telemetry.model``: ``load1``, ``mem_used``,
``mem_total``, ``net_rx_bytes``, ``net_tx_bytes`` (all interfaces but loopback), ``gpu_util``,
``gpu_mem_used``, ``gpu_mem_total``; and per process group of the job (each job process leads
one), its CPU percent (since the previous sample; ``None`` on the first) and resident bytes.
Read-only and best effort: what cannot be read is left out. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
GPU_EVERY = 5.0  # seconds between nvidia-smi runs
GPU_TIMEOUT = 3.0


class ProcStat:
    """One process: ``pgrp``; ``cpu_s``, user + system seconds; ``rss``, bytes; ``start``, clock
    ticks after boot (with the pid, it names one process across pid reuse). A plain class: every
    watchdog imports this module at its start, and ``dataclasses`` (with ``inspect``) cost 5 ms
    of CPU there, on every host."""

    __slots__ = ("cpu_s", "pgrp", "pid", "rss", "start")

    def __init__(self, pid: int, pgrp: int, cpu_s: float, rss: int, start: int) -> None:
        self.pid, self.pgrp, self.cpu_s, self.rss, self.start = pid, pgrp, cpu_s, rss, start

    def _fields(self) -> tuple[int, int, float, int, int]:
        return self.pid, self.pgrp, self.cpu_s, self.rss, self.start

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcStat) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "ProcStat(pid={}, pgrp={}, cpu_s={}, rss={}, start={})".format(*self._fields())


def parse_stat(pid: int, data: bytes) -> ProcStat | None:
    """One ``/proc/PID/stat`` line (the command name may hold spaces and parentheses)."""
    try:
        f = data[data.rindex(b")") + 2 :].split()
        return ProcStat(pid, int(f[2]), (int(f[11]) + int(f[12])) / TICK, int(f[21]) * PAGE, int(f[19]))
    except (IndexError, ValueError):
        return None


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_stat(pid, f.read())
    except OSError:
        return None


def all_stats() -> list[ProcStat]:
    """Every process of this host that can be read."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := read_stat(int(name))) is not None:
            out.append(st)
    return out


def group_usage(stats: Iterable[ProcStat], groups: set[int]) -> dict[int, tuple[float, int]]:
    """(cpu seconds, rss bytes) summed over each process group in ``groups``."""
    totals: dict[int, tuple[float, int]] = {}
    for st in stats:
        if st.pgrp in groups:
            cpu, rss = totals.get(st.pgrp, (0.0, 0))
            totals[st.pgrp] = (cpu + st.cpu_s, rss + st.rss)
    return totals


def parse_loadavg(text: str) -> dict[str, float]:
    return {"load1": float(text.split()[0])}


def parse_meminfo(text: str) -> dict[str, float]:
    kib = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if rest.split():
            kib[name] = int(rest.split()[0]) * 1024
    total = kib.get("MemTotal")
    avail = kib.get("MemAvailable", kib.get("MemFree"))
    return {} if total is None or avail is None else {"mem_total": total, "mem_used": total - avail}


def parse_net_dev(text: str) -> dict[str, float]:
    """Bytes received and sent by every interface but loopback."""
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        cols = rest.split()
        if name.strip() != "lo" and len(cols) >= 9:
            rx += int(cols[0])
            tx += int(cols[8])
    return {"net_rx_bytes": rx, "net_tx_bytes": tx}


def parse_gpus(text: str) -> dict[str, float]:
    """``nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits``:
    mean utilisation, memory summed over the GPUs (bytes)."""
    rows = []
    for line in text.strip().splitlines():
        try:
            rows.append([float(x) for x in line.split(",")])
        except ValueError:
            continue
    rows = [r for r in rows if len(r) == 3]
    if not rows:
        return {}
    mib = 1 << 20
    return {
        "gpu_util": sum(r[0] for r in rows) / len(rows),
        "gpu_mem_used": sum(r[1] for r in rows) * mib,
        "gpu_mem_total": sum(r[2] for r in rows) * mib,
    }


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def host_figures() -> dict[str, float]:
    """This host's load, memory and network bytes (what can be read)."""
    out: dict[str, float] = {}
    for path, parse in (
        ("/proc/loadavg", parse_loadavg),
        ("/proc/meminfo", parse_meminfo),
        ("/proc/net/dev", parse_net_dev),
    ):
        text = _read(path)
        if text is not None:
            try:
                out.update(parse(text))
            except (ValueError, IndexError):
                continue
    return out


def which(name: str) -> str | None:
    """``shutil.which`` for a plain name (not imported: ``shutil`` brings the compression
    modules, 1.7 ms of each watchdog's start)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


class Gpus:
    """``nvidia-smi`` at most every ``GPU_EVERY`` seconds, with a timeout; nothing without it."""

    def __init__(self, command: str | None = None) -> None:
        self.command = command or which("nvidia-smi")
        self.latest: dict[str, float] = {}
        self._next = 0.0

    def sample(self) -> dict[str, float]:
        if self.command is None or time.monotonic() < self._next:
            return self.latest
        self._next = time.monotonic() + GPU_EVERY
        query = "--query-gpu=utilization.gpu,memory.used,memory.total"
        try:
            done = subprocess.run(
                [self.command, query, "--format=csv,noheader,nounits"],
                capture_output=True,
                timeout=GPU_TIMEOUT,
                check=False,
            )
            self.latest = parse_gpus(done.stdout.decode(errors="replace")) if done.returncode == 0 else {}
        except (OSError, subprocess.SubprocessError):
            self.latest = {}
        return self.latest


class GroupMeter:
    """CPU percent and resident bytes of process groups; the percent is over the time since the
    previous sample of the same group (``None`` on its first)."""

    def __init__(self) -> None:
        self._prev: dict[int, tuple[float, float]] = {}  # group -> (cpu seconds, monotonic time)

    def sample(
        self, groups: Iterable[int], stats: list[ProcStat] | None = None
    ) -> dict[int, tuple[float | None, int]]:
        """{group: (cpu percent or None, rss bytes)} for the groups in ``groups`` that exist."""
        wanted = set(groups)
        now = time.monotonic()
        usage = group_usage(stats if stats is not None else all_stats(), wanted)
        procs: dict[int, tuple[float | None, int]] = {}
        for g, (cpu_s, rss) in usage.items():
            prev = self._prev.get(g)
            pct = None
            if prev is not None and now > prev[1]:
                pct = max(0.0, 100.0 * (cpu_s - prev[0]) / (now - prev[1]))
            procs[g] = (pct, rss)
            self._prev[g] = (cpu_s, now)
        for g in list(self._prev):
            if g not in usage:
                del self._prev[g]
        return procs


class Sampler:
    """Samples the host (``host_figures``, GPUs) and the given process groups (``GroupMeter``)."""

    def __init__(self, gpus: Gpus | None = None) -> None:
        self.gpus = gpus or Gpus()
        self.groups = GroupMeter()

    def sample(
        self, groups: Iterable[int], stats: list[ProcStat] | None = None
    ) -> tuple[dict[str, float], dict[int, tuple[float | None, int]]]:
        """(host figures, {group: (cpu percent or None, rss bytes)})."""
        figures = host_figures()
        figures.update(self.gpus.sample())
        return figures, self.groups.sample(groups, stats)


class Latest:
    """A sampler in a thread of its own, every ``every`` seconds: readers take the latest sample and
    never wait (a slow ``nvidia-smi`` or /proc scan delays nothing else)."""

    def __init__(self, groups: Callable[[], Iterable[int]], every: float = 1.0) -> None:
        self.groups = groups
        self.every = every
        self.sampler = Sampler()
        self.figures: dict[str, float] = {}
        self.procs: dict[int, tuple[float | None, int]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # best effort: a failed sample leaves the last one
                self.figures, self.procs = self.sampler.sample(self.groups())
            if self.stop.wait(self.every):
                return

    def start(self) -> Latest:
        threading.Thread(target=self.run, name="hoststat", daemon=True).start()
        return self
