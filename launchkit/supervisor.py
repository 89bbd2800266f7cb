"""Run a planned job on a backend and supervise it to the end.

- every process's output is merged live, each line prefixed ``[role rank]``, stdout and stderr
  kept apart, and copied to ``--log-dir`` files when asked;
- when a process fails, the others get SIGTERM and, after the grace period, SIGKILL; the
  process that failed first on its own is the root cause (``launchkit.rootcause``: not one that
  only ends because another node failed), and its exit code becomes the job's;
- SIGINT / SIGTERM / SIGHUP to the launcher end the job the same way (exit 130 / 143 / 129),
  a second one skips the grace period; the job's phases (running, stopping, killing, ...) and
  what moves it from one to the next are ``launchkit.supervision_state``'s;
- a reaper process (``launchkit.jobs.reaper``) ends the job's processes if the launcher itself is
  killed, and a final sweep by job id ends strays (e.g. grandchildren in a new session).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launchkit.backends.base import Backend, ProcessHandle
from launchkit.console import OutputWriter, Ui
from launchkit.core.spec import Host, JobResult, Plan, Task, TaskResult
from launchkit.dashboard import Dashboard, DashboardState, LineSink, TailSink
from launchkit.errors import LaunchkitError
from launchkit.hostside import procscan
from launchkit.jobs import keptoutput, reaper
from launchkit.jobs import records as jobs
from launchkit.logdir import check_log_dir
from launchkit.merger import Merger, Source
from launchkit.rootcause import PEER_WAIT, Blame, Tail, named_root, waited_by
from launchkit.supervision_state import Action, Cause, Event, State, Timing, step
from launchkit.watch import LOG_LINES, Publisher

if TYPE_CHECKING:
    from launchkit.elastic import Elastic
    from launchkit.telemetry.endpoint import Telemetry

TAIL_LINES = 20
LOG_BUFFER = 1 << 18
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_LOG_FAILED = 74  # EX_IOERR: the job succeeded, but its --log-dir files are incomplete
KILL_CONFIRM = 30.0  # seconds after SIGKILL before a process that has not confirmed its end is given up
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_of(returncode: int) -> tuple[int, int | None]:
    """Popen's returncode -> (shell-style exit code, signal number or None)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def job_exit_code(root: TaskResult | None, interrupted_by: int | None, results: list[TaskResult]) -> int:
    if root is not None:
        return root.exit_code
    if interrupted_by is not None:
        return 128 + interrupted_by
    return 0 if all(r.ok for r in results) else 1


@dataclass
class _Running:
    task: Task
    handle: ProcessHandle | None
    tail: deque[str] = field(default_factory=lambda: Tail(TAIL_LINES))  # (a Tail: it sees dmlc_env lines)
    result: TaskResult | None = None
    sources: list[Source] = field(default_factory=list)

    def output_ended(self) -> bool:
        return all(src.done.is_set() for src in self.sources)


class Supervisor:
    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        ui: Ui,
        *,
        writer: OutputWriter | None = None,
        log_dir: str | None = None,
        grace: float = 5.0,
        time_limit: float | None = None,
        record: jobs.JobRecord | None = None,
        dashboard: Dashboard | None = None,
        kill_confirm: float = KILL_CONFIRM,
        restart_if: Callable[[JobResult], bool] | None = None,
        telemetry: Telemetry | None = None,
        elastic: Elastic | None = None,
    ) -> None:
        self.elastic = elastic  # -n MIN:MAX: the workers' membership (launchkit.elastic)
        self._pending = 0  # the processes whose end has not come yet
        self.kill_confirm = kill_confirm
        self.restart_if = restart_if  # True: the launcher restarts the job, its record stays running
        self.reaper: subprocess.Popen[bytes] | None = None  # a restart waits for its last sweep
        self.plan = plan
        self.backend = backend
        self.ui = ui
        self.dashboard = dashboard
        self.writer: TailSink | LineSink = (
            LineSink(dashboard) if dashboard else TailSink(writer or OutputWriter(), deque(maxlen=LOG_LINES))
        )
        self.keeper = keptoutput.Keeper(plan.job_id, ui.warn)  # every stream's output, for launchkit logs
        attempt = (record.attempt + 1, record.max_restarts + 1) if record and record.max_restarts else None
        log = self.writer.dashboard.log if isinstance(self.writer, LineSink) else self.writer.log
        model = telemetry.model if telemetry else None
        self.publisher = Publisher(
            plan,
            ui,
            dashboard,
            model,
            log,
            attempt,
            record.started_at if record else None,
            backend.status,
            here=backend.capabilities.here,
        )
        self._root: _Running | None = None
        self._named_by: _Running | None = None  # the process that named the root cause as failed
        self._waited_by = ""  # who waited for the root cause, in what (``rootcause.waited_by``)
        self._started = time.monotonic()
        self.log_dir = Path(log_dir) if log_dir else None
        self.grace = grace
        self.time_limit = time_limit
        self.state = State()  # the job's phase (launchkit.supervision_state)
        self.record = record
        self._events: queue.Queue[tuple[int, int, float]] = queue.Queue()
        self._signals: list[int] = []
        self._procs: list[_Running] = []
        self._left: set[int] = set()  # elastic: the workers whose end was a change of membership
        self._released: set[int] = set()  # elastic: the scheduler, stopped once every worker ended
        self.merger = Merger(self.writer, self._log_failed, TAIL_LINES)
        if elastic is not None:
            elastic.say = self._announce

    # -- signals -------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals.append(signum)  # only a flag: the loop acts on it

    def _install_signals(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                old[sig] = signal.signal(sig, self._on_signal)
        return old

    # -- output --------------------------------------------------------------------------------
    def _open_log(self, task: Task, name: str) -> IO[bytes] | None:
        if self.log_dir is None or self.merger.log_error is not None:
            return None
        suffix = "stdout" if name == "out" else "stderr"
        path = self.log_dir / f"{task.role}-{task.rank}.{suffix}"
        try:
            return open(path, "ab", buffering=LOG_BUFFER)
        except OSError as exc:
            self.merger.log_failed(exc)  # said once, and the job's exit code says it (74)
            return None

    def _log_failed(self, exc: OSError) -> None:
        """A --log-dir write failed (disk full, read-only): said once; the output goes on."""
        self.ui.error(
            f"cannot write to --log-dir {self.log_dir}: {exc.strerror or exc}; the job goes on, its "
            f"output only to the console (the log files are incomplete; exit {EXIT_LOG_FAILED} if the job succeeds)"
        )

    def _ended(self, index: int, code: int) -> None:
        self._events.put((index, code, time.time()))

    # -- lifecycle -----------------------------------------------------------------------------
    def _start_all(self) -> None:
        """Every process asked to start first (a backend that queues them, ssh, sends them now),
        then each one's output and end attached: the hosts start their processes meanwhile (its
        output waits in its pipe, an end already come is called back at once)."""
        failed: tuple[int, int] | None = None
        for index, task in enumerate(self.plan.tasks):
            run = _Running(task, None)
            self._procs.append(run)
            code = self._ask_start(run)
            if code is not None:
                failed = (index, code)
                break  # no point starting the rest
        self.backend.send_starts()
        for index, run in enumerate(self._procs):
            if run.handle is None:
                break
            self._attach(index, run)
        if failed is not None:
            self._events.put((*failed, time.time()))
        if self.elastic is not None and failed is None:
            self.elastic.begin(
                [(i, run.task) for i, run in enumerate(self._procs) if run.task.role == "worker"]
            )

    def _ask_start(self, run: _Running) -> int | None:
        """Ask the backend to start ``run``'s task: None, or the shell's code when it cannot (126, 127)."""
        task = run.task
        try:
            run.handle = self.backend.start(task)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            # where a program without a '/' was looked for, as the engines' shim says it
            path = task.env.get("PATH", os.environ.get("PATH", ""))
            where = f" (PATH={path})" if code == 127 and "/" not in task.argv[0] else ""
            run.tail.append(f"cannot start {task.argv[0]!r}: {exc.strerror or exc}{where}")
            return code
        return None

    def _attach(self, index: int, run: _Running) -> None:
        """``run``'s output into the merger (and the log files), its end into the event queue."""
        handle, task = run.handle, run.task
        assert handle is not None
        for stream, name in ((handle.stdout, "out"), (handle.stderr, "err")):
            prefix = self.writer.prefix(task.role, task.rank, name)
            kept = self.keeper.open(task.role, task.rank, name)
            run.sources.append(
                self.merger.add(stream, name, prefix, run.tail, self._open_log(task, name), kept)
            )
        self.backend.watch(handle, functools.partial(self._ended, index))

    # -- elastic jobs: the hooks launchkit.elastic uses ------------------------------------------
    def start_task(self, task: Task) -> int:
        """A worker that joins a running elastic job: started, attached, recorded."""
        run = _Running(task, None)
        self._procs.append(run)
        index = len(self._procs) - 1
        self._pending += 1
        code = self._ask_start(run)
        self.backend.send_starts()
        if code is None:
            self._attach(index, run)
        else:
            self._events.put((index, code, time.time()))
        self.backend.await_started()  # (ssh: its pid, for the record)
        self._save_processes()
        return index

    def reach_host(self, host: Host) -> str | None:
        try:
            self.backend.add_host(host)
        except LaunchkitError as exc:
            return exc.message
        return None

    def signal_task(self, index: int, sig: int) -> None:
        run = self._procs[index]
        if run.handle is not None and run.result is None:
            run.handle.send_signal(sig)

    @property
    def timed_out(self) -> bool:
        """The launcher ended the job at its time limit."""
        return self.state.cause is Cause.TIME_LIMIT

    def _step(self, event: Event, signum: int | None = None) -> None:
        """Feed ``event`` to the job's state, and do what the transition says."""
        timing = Timing(self.grace, self.kill_confirm)
        self.state, actions = step(self.state, event, time.monotonic(), timing, signum)
        for action in actions:
            if action is Action.TERMINATE:
                self._signal_all(signal.SIGTERM)
            elif action is Action.KILL:
                self._signal_all(signal.SIGKILL)
            else:
                self._give_up()  # never wait forever for an engine to confirm

    def _give_up(self) -> None:
        """Processes that did not confirm their end ``kill_confirm`` s after SIGKILL (an engine
        that does not answer) count as killed; the backend's cleanup (and the reaper) remain."""
        late = [i for i, run in enumerate(self._procs) if run.result is None and run.handle is not None]
        if late:
            self.ui.warn(
                f"{len(late)} process(es) did not confirm their end {self.kill_confirm:g}s after SIGKILL; "
                "counting them as killed (the engine's own cleanup goes on)"
            )
        for i in late:
            self._events.put((i, -signal.SIGKILL, time.time()))

    def _signal_all(self, sig: int) -> None:
        for run in self._procs:
            if run.handle is not None and run.result is None:
                run.handle.send_signal(sig)

    def run(self) -> JobResult:
        if self.log_dir is not None:
            check_log_dir(self.log_dir)
        reaper_proc, reaper_pipe = reaper.start(self.plan.job_id, self.grace)
        self.reaper = reaper_proc
        cleanups = reaper.Cleanups(reaper_pipe)
        self.backend.set_cleanup_sink(cleanups.add)
        old_handlers = self._install_signals()
        signalled: int | None = None  # the first signal, also one during a teardown under way
        blame = Blame(min(PEER_WAIT, self.grace))  # the failures before the teardown

        def settle(force: bool = False) -> None:
            """End the job once the failures so far name the root cause (or ``force``)."""
            if not self.state.ending and blame.decide(time.monotonic(), force=force):
                assert blame.root is not None
                self._root = self._procs[blame.root]
                self._step(Event.FAILURE)

        try:
            self.merger.start()
            self._start_all()
            self._save_started()
            self._pending += len(self._procs)
            while self._pending:
                settle()
                while self._signals:
                    sig = self._signals.pop(0)
                    signalled = signalled or sig
                    if not self.state.ending:
                        self.ui.warn(f"received {signal.Signals(sig).name}: ending the job")
                        if blame.failed:  # a failure came first: it stays the root cause
                            settle(force=True)
                            continue
                    self._step(Event.SIGNAL, sig)  # the first ends the job, a second the grace period
                if (
                    self.time_limit is not None
                    and not self.state.ending
                    and not blame.failed  # a failure came first: its teardown is near
                    and time.monotonic() - self._started > self.time_limit
                ):
                    self.ui.warn("the job's time limit passed: ending the job")
                    self._step(Event.TIME_LIMIT)
                self._step(Event.TICK)  # the grace period's end, the wait for the kills' confirmation
                if self.elastic is not None and not self.state.ending:
                    self.elastic.tick(time.monotonic(), self)
                    self._release_scheduler()
                self.publisher.publish(self._procs, self._root)
                try:
                    index, code, ended = self._events.get(timeout=0.1)
                except queue.Empty:
                    continue
                run = self._procs[index]
                if run.result is not None:  # already settled (given up on, then it ended after all)
                    continue
                self._pending -= 1
                exit_code, sig_no = exit_code_of(code)
                stopped = self.elastic is not None and index in self.elastic.state.stopping | self._released
                run.result = TaskResult(
                    run.task,
                    exit_code,
                    sig_no,
                    ended,
                    killed_by_launcher=self.state.ending or stopped,
                )
                if self._membership_change(index, exit_code, sig_no):
                    self._save_processes()
                elif exit_code != 0 and not self.state.ending and index not in self._released:
                    blame.add(index, time.monotonic(), run.tail, run.output_ended)
            settle(force=True)  # every process ended before a root cause was named
            self._step(Event.ENDED)
            self.backend.wait_ended(self.grace + 5.0)
            strays = procscan.sweep_job(self.plan.job_id, self.grace, exclude=(reaper_proc.pid,))
            procscan.remove_shm(self.plan.job_id)
            # a bound for streams that stay silent and open (a given-up process, a grandchild
            # holding one); output still coming and a slow reader of ours only slow this down
            self.merger.drain(2.0)
            if self._root is not None:  # with every output read: the node a reporter names
                index, by = named_root(self._procs.index(self._root), self._procs)
                self._root, self._named_by = self._procs[index], None if by is None else self._procs[by]
                self._waited_by = waited_by(index, self._procs)
        finally:
            if self.elastic is not None:
                self.elastic.close()
            self.merger.close()
            self.publisher.publish(self._procs, self._root, final=True)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            cleanups.close()  # the reaper sweeps once more and exits
            with contextlib.suppress(Exception):
                self.backend.close()
        # a signal after the last process ended (while the job was being swept and its output
        # drained): nothing is left to end, but it still counts (no restart after Ctrl-C)
        while self._signals:
            signalled = signalled or self._signals.pop(0)
        results = [self._final(run) for run in self._procs]
        root = results[self._procs.index(self._root)] if self._root is not None else None
        named_by = results[self._procs.index(self._named_by)] if self._named_by is not None else None
        interrupted_by = self.state.signum if self.state.cause is Cause.SIGNAL else None
        # (elastic: the workers that left and a scheduler stopped after the workers ended did not fail)
        counted = [r for i, r in enumerate(results) if i not in self._left | self._released]
        code = (
            EXIT_TIMEOUT if self.timed_out and root is None else job_exit_code(root, interrupted_by, counted)
        )
        if (
            named_by is not None
            and root is not None
            and ((root.killed_by_launcher and root.signal) or root.ok)
        ):
            code = (
                named_by.exit_code
            )  # it never ended on its own, or left early: the code of the one that named it
        if code == 0 and self.merger.log_error is not None:
            code = EXIT_LOG_FAILED
            self.ui.error(
                f"job {self.plan.job_id} succeeded, but its --log-dir files in {self.log_dir} are incomplete "
                f"({self.merger.log_error.strerror or self.merger.log_error}); exit {EXIT_LOG_FAILED}"
            )
        result = JobResult(
            job_id=self.plan.job_id,
            exit_code=code,
            results=tuple(results),
            root_cause=root,
            interrupted_by=interrupted_by,
            signalled=signalled,
            strays_killed=strays,
            timed_out=self.timed_out,
            named_by=named_by,
            waited_by=self._waited_by,
            changes=len(self.elastic.changes) if self.elastic else 0,
        )
        self._save_finished(result)
        return result

    def _membership_change(self, index: int, exit_code: int, signum: int | None) -> bool:
        """An elastic job's worker ended and the job goes on (``launchkit.elastic``): True; its
        failure is then no root cause and does not end the job."""
        if self.elastic is None or self.state.ending or not self.elastic.is_worker(index):
            return False
        if self.elastic.ended(index, exit_code, signum, time.monotonic(), self):
            self._left.add(index)
            return True
        return False

    def _release_scheduler(self) -> None:
        """An elastic job whose workers have all ended: its scheduler, if it still runs, is stopped
        (``Elastic.scheduler_idle``)."""
        assert self.elastic is not None
        if not self.elastic.scheduler_idle(time.monotonic()):
            return
        for index, run in enumerate(self._procs):
            if run.task.role == "scheduler" and run.result is None and index not in self._released:
                self._released.add(index)
                self.signal_task(index, signal.SIGTERM)

    def _announce(self, line: str) -> None:
        """A membership change (or a word on the hosts): into the job's log, which the dashboard
        and ``launchkit top`` show, and on the console when no dashboard covers it."""
        self.publisher.log.append(("launchkit", line))
        if self.dashboard is None:
            self.ui.info(line)

    def snapshot(self) -> DashboardState:
        """The job as the dashboard shows it."""
        return self.publisher.snapshot(self._procs, self._root)

    def _final(self, run: _Running) -> TaskResult:
        assert run.result is not None
        r = run.result
        node = getattr(run.handle, "node", None)
        return TaskResult(
            r.task, r.exit_code, r.signal, r.ended_at, r.killed_by_launcher, tuple(run.tail), node
        )

    # -- job record ----------------------------------------------------------------------------
    def _save_started(self) -> None:
        if self.record is None:
            return
        # an engine knows its own job's id (and output file) only once it has submitted it, and
        # the ssh backend the pids of its processes once every host has started them
        self.backend.await_started()
        remote = self.backend.record_info() or self.record.remote
        self.record = dataclasses.replace(self.record, remote=remote)
        self._save_processes()

    def _save_processes(self) -> None:
        """The record's processes (an elastic job's every worker so far, with how each ended, and
        its membership changes)."""
        if self.record is None:
            return
        procs = tuple(
            jobs.ProcessRecord(
                run.task.role,
                run.task.rank,
                str(run.task.host),
                run.handle.pid if run.handle else None,
                *self._history(i, run),
            )
            for i, run in enumerate(self._procs)
        )
        changes = tuple(self.elastic.changes) if self.elastic else ()
        hosts = self.record.hosts
        if self.elastic is not None:  # a host it gained while it ran too
            hosts = tuple(sorted({*hosts, *(p.host for p in procs)}))
        self.record = dataclasses.replace(self.record, processes=procs, changes=changes, hosts=hosts)
        jobs.save(self.record)

    def _history(self, index: int, run: _Running) -> tuple[int | None, str | None]:
        if self.elastic is None or not self.elastic.is_worker(index):
            return None, None
        return self.elastic.history(index, run.result)

    def _save_finished(self, result: JobResult) -> None:
        if self.record is None:
            return
        if self.elastic is not None:
            self._save_processes()  # how the last workers ended
        remote = self.backend.record_info() or self.record.remote  # ssh: the watchdogs' sweeps, once closed
        self.record = dataclasses.replace(self.record, remote=remote)  # (jobs.kill.confirmed_sweeps)
        if self.restart_if is not None and self.restart_if(result):
            return
        if result.interrupted_by is not None and result.root_cause is None:
            state = "interrupted"
        elif self.timed_out and result.root_cause is None:
            state = "timed out"
        else:
            state = "succeeded" if result.exit_code == 0 else "failed"
        self.record = jobs.finish(self.record, state, result.exit_code)
