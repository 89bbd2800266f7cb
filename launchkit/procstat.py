"""CPU and memory of local processes, from /proc (for the dashboard). Read-only, best effort."""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class GroupUsage:
    cpu_seconds: float  # user + system, summed over the process group
    rss_bytes: int
    nprocs: int


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(process group, cpu seconds, rss bytes) of one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    try:
        pgrp = int(fields[2])
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        rss = int(fields[21]) * _PAGE
    except (IndexError, ValueError):
        return None
    return pgrp, cpu, rss


def usage_by_group(groups: set[int]) -> dict[int, GroupUsage]:
    """Usage of each process group in ``groups`` (each job process leads its own group)."""
    totals: dict[int, list[float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(name)
        if st is None or st[0] not in groups:
            continue
        acc = totals.setdefault(st[0], [0.0, 0, 0])
        acc[0] += st[1]
        acc[1] += st[2]
        acc[2] += 1
    return {g: GroupUsage(v[0], int(v[1]), int(v[2])) for g, v in totals.items()}
