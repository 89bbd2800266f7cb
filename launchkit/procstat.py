"""CPU and memory of local processes, from /proc (for the dashboard). Read-only, best effort.

The /proc reading is ``launchkit.hostside.hoststat``'s, the same code the metrics sampler and the
ssh hosts' watchdogs use."""

from __future__ import annotations

from dataclasses import dataclass

from launchkit.hostside.hoststat import all_stats


@dataclass(frozen=True)
class GroupUsage:
    cpu_seconds: float  # user + system, summed over the process group
    rss_bytes: int
    nprocs: int


def usage_by_group(groups: set[int]) -> dict[int, GroupUsage]:
    """Usage of each process group in ``groups`` (each job process leads its own group)."""
    totals: dict[int, GroupUsage] = {}
    for st in all_stats():
        if st.pgrp in groups:
            t = totals.get(st.pgrp, GroupUsage(0.0, 0, 0))
            totals[st.pgrp] = GroupUsage(t.cpu_seconds + st.cpu_s, t.rss_bytes + st.rss, t.nprocs + 1)
    return totals
