"""What the supervisor shows of its job, built from its processes: the rows (with the hosts'
samples), the root cause, the registering nodes, and ``job_state``, the ``DashboardState`` from
them. Pure: the effects (sampling /proc here, refreshing the dashboard, writing the live file)
are ``launchkit.watch``'s ``Publisher``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from launchkit.core.spec import Plan, Task, TaskResult
from launchkit.telemetry.view import Training
from launchkit.view.state import DashboardState, ProcRow, RootCause

ROOT_LINES = 10  # last lines of the root cause shown
LOG_LINES = 12  # the output pane's lines (the live file's when no dashboard is shown)


class Proc(Protocol):
    """One process as the supervisor holds it."""

    task: Task
    handle: Any
    tail: deque[str]
    result: TaskResult | None


Usage = tuple[float | None, int]


def by_pid(procs: dict[tuple[str, int], Usage]) -> dict[int, Usage | None]:
    """The samples by pid alone: None where more than one host reports that pid."""
    out: dict[int, Usage | None] = {}
    for (_, pid), u in procs.items():
        out[pid] = None if pid in out else u
    return out


def usage_of(
    procs: dict[tuple[str, int], Usage], host: str, pid: int, pids: dict[int, Usage | None] | None = None
) -> Usage | None:
    """A process's CPU and memory as its host's sampler saw it: by (host, pid), or by pid alone
    when a single host reports that pid (the sampler may name the launcher's host differently).
    ``pids``: ``by_pid(procs)``, made once per snapshot (a scan of every sample per process was
    quadratic in the job's size)."""
    if (host, pid) in procs:
        return procs[(host, pid)]
    return (by_pid(procs) if pids is None else pids).get(pid)


def row_of(run: Proc, cpu: tuple[float | None, int] | None) -> ProcRow:
    pid = run.handle.pid if run.handle else None
    r = run.result
    if r is None:
        state, detail = ("running" if pid is not None else "starting"), ""
    else:
        state = "ok" if r.ok else ("ended" if r.killed_by_launcher else "failed")
        detail = "" if r.ok else (f"signal {r.signal}" if r.signal else f"exit {r.exit_code}")
    return ProcRow(
        run.task.role,
        run.task.rank,
        host_of(run),
        pid,
        state,
        detail,
        cpu[0] if cpu else None,
        cpu[1] if cpu else None,
        run.tail[-1] if run.tail else "",
    )


def host_of(run: Proc) -> str:
    return getattr(run.handle, "node", None) or str(run.task.host)


def root_cause_of(run: Proc | None) -> RootCause | None:
    if run is None or run.result is None:
        return None
    r = run.result
    detail = f"signal {r.signal}" if r.signal else f"exit {r.exit_code}"
    return RootCause(run.task.role, run.task.rank, host_of(run), detail, tuple(run.tail)[-ROOT_LINES:])


def registering(procs: Sequence[Proc]) -> int:
    """How many nodes register with the scheduler: every process but the scheduler."""
    return sum(1 for p in procs if p.task.role != "scheduler")


def job_state(
    plan: Plan,
    procs: Sequence[Proc],
    *,
    sampled: dict[tuple[str, int], Usage],
    usage: dict[int, Usage],
    elapsed: float,
    log: Sequence[tuple[str, str]] = (),
    root: Proc | None = None,
    finished: bool = False,
    attempt: tuple[int, int] | None = None,
    training: Training | None = None,
    status: str = "",
) -> DashboardState:
    """The state shown and written: a row per process with its usage (the hosts' ``sampled``
    figures by (host, pid), else ``usage`` by pid, read here) while it runs."""
    rows = []
    single = by_pid(sampled)
    for run in procs:
        pid = run.handle.pid if run.handle else None
        alive = pid is not None and run.result is None  # an ended process's last sample is stale
        cpu = (usage_of(sampled, host_of(run), pid, single) or usage.get(pid)) if alive and pid else None
        rows.append(row_of(run, cpu))
    return DashboardState(
        job_id=plan.job_id,
        name=plan.job_name,
        backend=plan.backend,
        elapsed=max(0.0, elapsed),
        rows=tuple(rows),
        log=tuple(log),
        attempt=attempt[0] if attempt else None,
        attempts=attempt[1] if attempt else None,
        training=training,
        root_cause=root_cause_of(root),
        finished=finished,
        status=status,
    )
