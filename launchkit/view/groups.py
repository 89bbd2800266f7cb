"""Which process rows a frame shows when not all of them fit (a job of hundreds or thousands of
processes). Pure.

One row each for the processes that need a look (failed, lost, starting, and the slowest worker
that the training panel names), then one line per host for the others (its processes by role,
their states, mean CPU and total memory), the hosts with a process not running first, then in
the job's order; what still does not fit is counted in the table's caption. Linear in the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchkit.view.state import ProcRow

#: Shown one by one first when not every row fits; lower first.
PRIORITY = {"failed": 0, "lost": 1, "starting": 2}
SLOWEST = 3


@dataclass(frozen=True)
class HostLine:
    """The processes of one host that are not shown one by one."""

    host: str
    rows: tuple[ProcRow, ...]

    @property
    def roles(self) -> str:
        by: dict[str, int] = {}
        for r in self.rows:
            by[r.role] = by.get(r.role, 0) + 1
        return ", ".join(f"{n} {role}{'s' if n > 1 else ''}" for role, n in by.items())

    @property
    def states(self) -> str:
        return counts(self.rows)

    @property
    def cpu_percent(self) -> float | None:
        cpus = [r.cpu_percent for r in self.rows if r.cpu_percent is not None]
        return sum(cpus) / len(cpus) if cpus else None

    @property
    def rss_bytes(self) -> int | None:
        rss = [r.rss_bytes for r in self.rows if r.rss_bytes is not None]
        return sum(rss) if rss else None

    @property
    def settled(self) -> bool:
        """Every process of it runs (or ended well): nothing to look at."""
        return all(r.state in ("running", "ok") for r in self.rows)


def counts(rows: tuple[ProcRow, ...] | list[ProcRow]) -> str:
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(by_state.items()))


@dataclass(frozen=True)
class Shown:
    rows: list[ProcRow]  # one by one, in the job's order
    hosts: list[HostLine]
    left_out: tuple[ProcRow, ...]  # in neither: counted in the caption


def choose(rows: tuple[ProcRow, ...], max_rows: int | None, slowest: tuple[str, int] | None = None) -> Shown:
    """What fits in ``max_rows`` lines (None: every row, one by one): grouped by host where that
    shows more of the job than one row a process (and the rest is on more than one host)."""
    if max_rows is None or len(rows) <= max_rows:
        return Shown(list(rows), [], ())
    room = max(1, max_rows - 1)  # one line for the caption

    def rank(i: int) -> int:
        r = rows[i]
        if (r.role, r.rank) == slowest and r.state == "running":
            return SLOWEST
        return PRIORITY.get(r.state, 9)

    order = sorted(range(len(rows)), key=lambda i: (min(rank(i), 9), i))
    singles = sorted(order[:room])  # one row a process: those to look at first, then in order
    plain = Shown([rows[i] for i in singles], [], tuple(rows[i] for i in sorted(order[room:])))
    urgent = [i for i in order if rank(i) < 9]
    one_by_one = set(urgent[: max(1, room // 2)])
    by_host: dict[str, list[ProcRow]] = {}
    for i, r in enumerate(rows):
        if i not in one_by_one:
            by_host.setdefault(r.host, []).append(r)
    if len(by_host) < 2:
        return plain
    lines = sorted((HostLine(h, tuple(rs)) for h, rs in by_host.items()), key=lambda line: line.settled)
    if len(one_by_one) + len(lines) <= max_rows:
        room = max_rows  # every host fits: no caption
    hosts = lines[: max(0, room - len(one_by_one))]
    if len(one_by_one) + sum(len(line.rows) for line in hosts) <= len(singles):
        return plain
    shown_hosts = {line.host for line in hosts}
    left_out = tuple(r for i, r in enumerate(rows) if i not in one_by_one and r.host not in shown_hosts)
    return Shown([rows[i] for i in sorted(one_by_one)], hosts, left_out)
