"""What the supervisor shows of its job, and where: ``Publisher`` builds the ``DashboardState``
from the supervisor's processes and the job's telemetry, refreshes the dashboard (when shown)
and writes the job's live file (always, at most once every ``live.EVERY`` seconds), both from the
supervisor's loop: nothing of it runs in the job's processes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from launchkit.console import Ui
from launchkit.core.spec import Plan, Task, TaskResult
from launchkit.dashboard import Dashboard
from launchkit.hostside.hoststat import GroupMeter
from launchkit.jobs import live
from launchkit.telemetry.model import JobMetrics
from launchkit.telemetry.view import training
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


class Publisher:
    def __init__(
        self,
        plan: Plan,
        ui: Ui,
        dashboard: Dashboard | None,
        metrics: JobMetrics | None,
        log: deque[tuple[str, str]],
        attempt: tuple[int, int] | None = None,  # (this attempt, of how many), 1 first
        started_at: float | None = None,  # when the job started (its first attempt), time.time()
        status: Callable[[], str] | None = None,  # the backend's word on what the job waits on
    ) -> None:
        self.status = status
        self.plan = plan
        self.ui = ui
        self.dashboard = dashboard
        self.metrics = metrics
        self.log = log
        self.attempt = attempt
        self.cpu = GroupMeter()
        self.started = time.time() if started_at is None else started_at
        self._live_next = 0.0
        self._live_failed = False

    def snapshot(
        self, procs: Sequence[Proc], root: Proc | None = None, finished: bool = False
    ) -> DashboardState:
        return self._snapshot(procs, root, finished, self.metrics)

    def _snapshot(
        self, procs: Sequence[Proc], root: Proc | None, finished: bool, model: JobMetrics | None
    ) -> DashboardState:
        sampled: dict[tuple[str, int], tuple[float | None, int]] = {}
        if model is not None:  # the hosts' samplers (this host's included) saw the processes
            with model.lock:
                sampled = dict(model.procs)
        usage: dict[int, tuple[float | None, int]] = {}
        if self.plan.backend == "local" and not sampled:  # no sampler: read /proc here
            pids = {p.handle.pid for p in procs if p.handle and p.handle.pid and p.result is None}
            usage = self.cpu.sample(pids)
        rows = []
        single = by_pid(sampled)
        for run in procs:
            pid = run.handle.pid if run.handle else None
            alive = pid is not None and run.result is None  # an ended process's last sample is stale
            cpu = (usage_of(sampled, host_of(run), pid, single) or usage.get(pid)) if alive and pid else None
            rows.append(row_of(run, cpu))
        running = {(r.role, r.rank) for r in rows if r.state in ("running", "starting")}
        return DashboardState(
            job_id=self.plan.job_id,
            name=self.plan.job_name,
            backend=self.plan.backend,
            elapsed=max(0.0, time.time() - self.started),
            rows=tuple(rows),
            log=tuple(self.log),
            attempt=self.attempt[0] if self.attempt else None,
            attempts=self.attempt[1] if self.attempt else None,
            training=None if model is None else training(model, registering(procs), running),
            root_cause=root_cause_of(root),
            finished=finished,
            status=self.status() if self.status else "",
        )

    def publish(self, procs: Sequence[Proc], root: Proc | None = None, final: bool = False) -> None:
        """Refresh the dashboard when it is due, write the live file when it is due (both at the
        end); one state for both."""
        now = time.monotonic()
        show = self.dashboard is not None and (final or self.dashboard.due())
        write = final or now >= self._live_next
        if not (show or write):
            return
        state = self._snapshot(procs, root, final, self.metrics)  # one state for the frame and the file
        if self.dashboard is not None:
            if final:
                self.dashboard.stop(state)
            elif show:
                self.dashboard.update(state)
        if write and not self._live_failed:
            self._live_next = now + live.EVERY
            try:
                live.write(state)
            except OSError as exc:
                self._live_failed = True
                self.ui.warn(
                    f"cannot write the job's live file {live.path(self.plan.job_id)}: {exc.strerror or exc}; "
                    "the job goes on (launchkit top from another terminal shows less)"
                )
