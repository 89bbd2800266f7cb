"""Where the supervisor's view of its job goes: ``Publisher`` takes the state (``view.snapshot``,
pure) from the supervisor's processes and the job's telemetry, reading this machine's /proc when
the processes run here and no sampler reports them, refreshes the dashboard (when shown) and writes
the job's live file (always, at most once every ``live.EVERY`` seconds), both from the supervisor's
loop: nothing of it runs in the job's processes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from launchkit.console import Ui
from launchkit.core.spec import Plan
from launchkit.dashboard import Dashboard
from launchkit.hostside.hoststat import GroupMeter
from launchkit.jobs import live
from launchkit.telemetry.model import JobMetrics
from launchkit.telemetry.view import training
from launchkit.view.snapshot import LOG_LINES, Proc, Usage, job_state, registering
from launchkit.view.state import DashboardState

__all__ = ["LOG_LINES", "Publisher"]


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
        here: bool = False,  # the processes run on this machine (the backend's capabilities)
    ) -> None:
        self.status = status
        self.plan = plan
        self.ui = ui
        self.dashboard = dashboard
        self.metrics = metrics
        self.log = log
        self.attempt = attempt
        self.cpu = GroupMeter()
        self.here = here
        self.started = time.time() if started_at is None else started_at
        self._live_next = 0.0
        self._live_failed = False

    def snapshot(
        self, procs: Sequence[Proc], root: Proc | None = None, finished: bool = False
    ) -> DashboardState:
        sampled: dict[tuple[str, int], Usage] = {}
        model = self.metrics
        if model is not None:  # the hosts' samplers (this host's included) saw the processes
            with model.lock:
                sampled = dict(model.procs)
        usage: dict[int, Usage] = {}
        if self.here and not sampled:  # no sampler: read /proc here
            pids = {p.handle.pid for p in procs if p.handle and p.handle.pid and p.result is None}
            usage = self.cpu.sample(pids)
        running = {(p.task.role, p.task.rank) for p in procs if p.result is None}
        return job_state(
            self.plan,
            procs,
            sampled=sampled,
            usage=usage,
            elapsed=time.time() - self.started,
            log=tuple(self.log),
            root=root,
            finished=finished,
            attempt=self.attempt,
            training=None if model is None else training(model, registering(procs), running),
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
        state = self.snapshot(procs, root, final)  # one state for the frame and the file
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
