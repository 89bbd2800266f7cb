"""From a ``LaunchSpec`` and a backend to a running job: what ``launchkit launch`` does once the
command line has become a spec (``launchkit.cli.launch`` only turns flags into one).

``run_job`` contacts the hosts, picks the scheduler's address and port, plans the job, prepares
the backend, records the job and hands it to the ``Supervisor``; ``dry_run_plan`` builds the same
plan without contacting anything (``launchkit.submitting`` submits a batch job that no launcher
follows, ``--detach``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchkit.backends.base import Backend
from launchkit.backends.ssh import LOST_EXIT, WATCHDOG_SWEEP
from launchkit.console import Ui
from launchkit.core.plan import has_scheduler, make_plan, new_job_id, new_secret, one_thread_note
from launchkit.core.spec import JobResult, LaunchSpec, Plan
from launchkit.dashboard import Dashboard
from launchkit.elastic import for_job
from launchkit.errors import EXIT_INTERNAL, UsageError
from launchkit.jobs import owner
from launchkit.jobs import records as jobs
from launchkit.jobs.kill import sweep_hosts
from launchkit.logdir import hold_log_dir
from launchkit.roots import Roots
from launchkit.supervisor import EXIT_TIMEOUT, HANDLED_SIGNALS, Supervisor
from launchkit.telemetry.endpoint import Telemetry, serve


def dry_run_plan(spec: LaunchSpec, backend: Backend) -> Plan:
    """The plan a launch would run (no secret, the port only if ``--scheduler-port`` names it)."""
    return make_plan(
        spec,
        caps=backend.capabilities,
        job_id=new_job_id(),
        secret="",
        root_uri=Roots.dry_run_root(spec, backend),
        root_port=spec.scheduler_port or 0,
        node_host_of=backend.node_hosts(spec),
        job_home=_home_or_blank(),
        inherited=inherited(backend),
    )


def _home_or_blank() -> str:
    """This home's ``LAUNCHKIT_JOB_HOME`` for a dry run's plan ("" where a launch would refuse the home)."""
    try:
        return owner.home_id()
    except UsageError:
        return ""


def inherited(backend: Backend) -> dict[str, str]:
    """The launcher's environment where the backend's processes get it (``inherits_env``)."""
    return dict(os.environ) if backend.capabilities.inherits_env else {}


CANNOT_START = {126: "cannot be executed", 127: "was not found"}  # the shell's codes (exit-codes.md)
REAPER_WAIT = 30.0  # seconds past the grace period for the last attempt's reaper to finish its sweep


def restart_cause(result: JobResult, attempt: int, max_restarts: int) -> str | None:
    """Why attempt ``attempt`` (0 first), which ended with ``result``, is followed by another:
    the process that failed first (``worker 1 exit 137, signal 9``); None when it is not: it
    succeeded, no restart is left, or it did not end by a process failing on its own: its time
    limit passed, or the launcher received a signal (Ctrl-C, ``launchkit kill``'s SIGTERM, a
    closed terminal), even one that came while a failure was being torn down."""
    root = result.root_cause
    if attempt >= max_restarts or root is None or result.signalled is not None or result.timed_out:
        return None
    if never_starts(result) is not None:
        return None
    return f"{root.task.role} {root.task.rank} exit {root.exit_code}" + (
        f", signal {root.signal}" if root.signal else ""
    )


def never_starts(result: JobResult) -> str | None:
    """Why the job's command will not start on a restart either: every process that ended by
    itself exited 126 or 127 (the shell's "cannot execute" and "not found"; a program the launcher
    could not start counts as such); None otherwise."""
    own = [r for r in result.results if not r.killed_by_launcher and not r.ok]
    if result.root_cause is None or not own or any(r.exit_code not in CANNOT_START for r in own):
        return None
    root = result.root_cause
    return f"its command {CANNOT_START.get(root.exit_code, 'cannot start')} ({root.task.role} {root.task.rank} exit {root.exit_code})"


def restart_delay(backoff: float, result: JobResult, watchdog_end: float | None) -> float:
    """Seconds before the next attempt: ``backoff``; after an attempt in which an ssh host was lost
    (a process ended ``LOST_EXIT``), at least ``watchdog_end``: how long that host's watchdog, which
    the launcher could not reach, may still take to end the job's processes there by job id (a
    sweep that would end the next attempt's processes too)."""
    if watchdog_end is not None and any(r.exit_code == LOST_EXIT for r in result.results):
        return max(backoff, watchdog_end)
    return backoff


class _Stop:
    """The launcher's signals between two attempts (the backoff, the next attempt's start): the
    first one is kept; once a supervisor exists, passed on to it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.forward: Callable[[int, Any], None] | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self.forward is not None:
            self.forward(signum, frame)

    def install(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self) for sig in HANDLED_SIGNALS}

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when a signal comes."""
        end = time.monotonic() + seconds
        while self.signum is None and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))


@dataclass
class _Job:
    """What every attempt of one launch shares."""

    spec: LaunchSpec
    backend: Backend
    ui: Ui
    dashboard: Dashboard | None
    job_id: str = field(default_factory=new_job_id)
    secret: str = field(default_factory=new_secret)
    started: float = field(default_factory=time.monotonic)
    record: jobs.JobRecord | None = None
    stop: _Stop = field(default_factory=_Stop)
    telemetry: Telemetry | None = None  # the metrics endpoint, one for every attempt

    def time_left(self) -> float | None:
        limit = self.spec.time_limit
        return None if limit is None else limit - (time.monotonic() - self.started)


def run_job(spec: LaunchSpec, backend: Backend, ui: Ui, *, dashboard: Dashboard | None = None) -> JobResult:
    """Start the job on ``backend`` and supervise it to its end; after a failure, up to
    ``spec.max_restarts`` times, end what is left, wait the backoff and start it again (the same
    job id and secret, a new scheduler port, ``LAUNCHKIT_RESTART_COUNT`` the attempt). The job's
    exit code is the last attempt's; ``--time-limit`` counts from the first attempt's start."""
    # before contacting anything: exit 2 naming the directory, or the running launch that writes there
    held = hold_log_dir(Path(spec.log_dir)) if spec.log_dir else None
    job = _Job(spec, backend, ui, dashboard)
    old_handlers: dict[int, Any] = {}
    try:
        attempt = 0
        while True:
            result, supervisor = _attempt(job, attempt)
            cause = restart_cause(result, attempt, spec.max_restarts)
            if cause is None:
                why = never_starts(result) if attempt < spec.max_restarts else None
                if why is not None and result.signalled is None and not result.timed_out:
                    ui.warn(f"job {job.job_id}: no restart: {why}, and a restart would run the same command")
                return result
            if job.stop.signum is not None:  # came as the attempt ended, after its supervisor's handlers
                return _ended_between(job, result, 128 + job.stop.signum)
            if not old_handlers:
                old_handlers = job.stop.install()
            delay = restart_delay(spec.restart_backoff, result, _watchdog_end(job))
            lost = " (a host was lost: its watchdog ends first)" if delay > spec.restart_backoff else ""
            ui.warn(
                f"job {job.job_id}: attempt {attempt + 1} failed ({cause}); restarting in "
                f"{delay:g} s{lost} (attempt {attempt + 2} of {spec.max_restarts + 1})"
            )
            assert job.record is not None
            job.record = dataclasses.replace(job.record, attempt=attempt + 1, processes=())
            jobs.save(job.record)
            backoff_end = time.monotonic() + delay
            _settle(job, supervisor)
            wait, left = backoff_end - time.monotonic(), job.time_left()
            out_of_time = left is not None and left <= wait
            job.stop.sleep(wait if left is None else min(wait, left))
            if job.stop.signum is not None:
                return _ended_between(job, result, 128 + job.stop.signum)
            if out_of_time:
                return _ended_between(job, result, EXIT_TIMEOUT, timed_out=True)
            attempt += 1
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if job.telemetry is not None:
            job.telemetry.close()
        if held is not None:
            held.release()  # the --log-dir is free for another launch


def _attempt(job: _Job, attempt: int) -> tuple[JobResult, Supervisor | None]:
    """One attempt: contact the hosts, plan (a new port), prepare, record, supervise. A restart
    whose start fails finishes the record; one that a signal broke (an rsync it ended) ends as
    interrupted."""
    try:
        return _start_attempt(job, attempt)
    except Exception as exc:
        if attempt == 0 or job.record is None:
            raise
        if job.stop.signum is not None:
            return _ended_between(job, None, 128 + job.stop.signum), None
        job.record = jobs.finish(job.record, "failed", getattr(exc, "exit_code", EXIT_INTERNAL))
        raise


def _start_attempt(job: _Job, attempt: int) -> tuple[JobResult, Supervisor | None]:
    spec, backend, ui = job.spec, job.backend, job.ui
    reached = backend.connect(spec)
    roots = Roots.choose(spec, backend, reached)
    root_uri, port = roots.root
    try:
        if job.telemetry is None:
            job.telemetry = serve(job.job_id, job.secret, root_uri, backend)
        plan = make_plan(
            spec,
            caps=backend.capabilities,
            job_id=job.job_id,
            secret=job.secret,
            root_uri=root_uri,
            root_port=port,
            node_host_of=backend.node_hosts(spec),
            restart_count=attempt,
            metrics_addr=job.telemetry.address if job.telemetry else None,
            master=roots.master,
            job_home=owner.home_id(),
            inherited=inherited(backend),
        )
        if attempt == 0 and (note := one_thread_note(plan)) is not None:
            ui.info(note)
        here = plan.tasks[0].role == "scheduler" or backend.capabilities.here  # a process runs here
        if job.telemetry is not None and here:
            job.telemetry.watch_local(str(plan.tasks[0].host))  # the scheduler's (or local's) host
        try:
            backend.prepare(plan)
        except BaseException:
            backend.close()
            raise
        if job.stop.signum is not None:  # a signal while this restart started: nothing runs yet
            backend.close()
            return _ended_between(job, None, 128 + job.stop.signum), None
        if job.record is None:
            job.record = jobs.started_here(
                id=plan.job_id,
                name=plan.job_name,
                backend=plan.backend,
                hosts=tuple(sorted({str(t.host) for t in plan.tasks})),
                command=spec.command,
                cwd=spec.cwd,
                log_dir=spec.log_dir,
                remote=backend.record_info(),
                max_restarts=spec.max_restarts,
            )
            # recorded before any process starts: a process whose home records nothing is a stray
            # to ``kill --all`` in another home (launchkit.jobs.owner)
            jobs.save(job.record)
        of = f" (attempt {attempt + 1} of {spec.max_restarts + 1})" if spec.max_restarts else ""
        scheduled = has_scheduler(spec, backend.capabilities)
        ui.info(
            f"job {plan.job_id} ({plan.job_name}): "
            + (f"1 scheduler, {_count(spec.num_servers, 'server')}, " if scheduled else "")
            + f"{_count(spec.num_workers, 'worker')} on {plan.backend}; "
            + (backend.scheduler_summary(root_uri, port) if scheduled else roots.summary())
            + of
        )
        left = job.time_left()
        supervisor = Supervisor(
            plan,
            backend,
            ui,
            log_dir=spec.log_dir,
            grace=spec.grace_period,
            time_limit=None if left is None else max(left, 0.001),
            record=job.record,
            dashboard=job.dashboard,
            telemetry=job.telemetry,
            restart_if=lambda r: restart_cause(r, attempt, spec.max_restarts) is not None,
            elastic=for_job(spec, backend, plan, root_uri, job.telemetry, ui.info),
        )
        job.stop.forward = supervisor._on_signal  # a signal before it installs its own handlers
        try:
            result = supervisor.run()
        finally:
            job.stop.forward = None
        job.record = supervisor.record
        return dataclasses.replace(result, attempt=attempt), supervisor
    finally:
        roots.close()


def _watchdog_end(job: _Job) -> float | None:
    """ssh: the longest a lost host's watchdog may go on (its heartbeat timeout, then the grace
    period and its sweep); None for backends without watchdogs."""
    timeout = job.backend.watchdog_timeout()
    return None if timeout is None else timeout + job.spec.grace_period + WATCHDOG_SWEEP


def _settle(job: _Job, supervisor: Supervisor | None) -> None:
    """Before the next attempt: the last one's reaper has finished its sweep by job id (which would
    end the new attempt's processes), and on ssh hosts nothing of the job is left."""
    reaper_proc = supervisor.reaper if supervisor is not None else None
    if reaper_proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper_proc.wait(job.spec.grace_period + REAPER_WAIT)
    # the hosts that ran a process of it (the attempt's record: the job's has none by now)
    last = supervisor.record if supervisor is not None and supervisor.record is not None else job.record
    if last is not None and job.stop.signum is None:
        # (this launcher recorded the attempt's end: the hosts whose watchdog confirmed its sweep are skipped)
        ended = supervisor is not None and supervisor.record is not None
        for host in sweep_hosts(last, job.spec.grace_period, ended=ended):
            if not host.ok:
                job.ui.warn(f"{host.host}: could not check that the last attempt left nothing: {host.error}")


def _ended_between(job: _Job, last: JobResult | None, code: int, *, timed_out: bool = False) -> JobResult:
    """The launch ends between two attempts (a signal, the time limit): nothing is running."""
    signum = None if timed_out else code - 128
    # the attempt that ran last: the record already names the next one, which never started
    ran = last.attempt if last is not None else max((job.record.attempt if job.record else 0) - 1, 0)
    if job.record is not None:
        state = "timed out" if timed_out else "interrupted"
        job.record = jobs.finish(dataclasses.replace(job.record, attempt=ran), state, code)
    if timed_out:
        job.ui.warn(f"the job's time limit ({job.spec.time_limit:g}s) passed before the next attempt")
    elif job.stop.signum is not None:
        job.ui.warn(f"received {signal.Signals(job.stop.signum).name}: no restart")
    return JobResult(
        job_id=job.job_id,
        exit_code=code,
        results=last.results if last is not None else (),
        interrupted_by=signum,
        signalled=signum,
        timed_out=timed_out,
        attempt=ran,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
