"""What the cluster-engine backends (mpi, slurm, ...) share.

An engine starts the job's servers and workers itself (one ``mpirun``, one ``srun`` step, one
batch job), each under ``launchkit.hostside.shim``, and hands back one merged stream of framed lines. This
module splits that stream into one process per task again (``EngineProcess``: its own stdout and
stderr pipes, its pid and host from the shim, its exit code), so the supervisor, output merging,
job records and the kill path are the same as for the local and ssh backends. An engine module
supplies only a pure renderer (plan -> argv lists) and an ``EngineRun`` that starts and follows
the engine's own process or job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

import dmlc_env
from launchkit.backends.base import Backend, CleanupSink, ProcessHandle
from launchkit.backends.local import LocalBackend, spawn
from launchkit.core.spec import LaunchSpec, Plan, Task
from launchkit.hostside import shim, tasktable

ENGINE_TAIL = 20
#: How long an exit caused by the engine's own teardown waits for a real failure to be seen first.
TEARDOWN_HOLD = 1.0
#: How long an engine process may stay once every task has reported its end (in a teardown).
ENGINE_LINGER, TEARDOWN_LINGER = 1.0, 0.2
Feed = Callable[[bytes], None]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def shim_argv(python: str, task: Task) -> list[str]:
    """What the engine runs for every task: the shim, then the task's command."""
    return [python, "-m", "launchkit.hostside.shim", "--", *task.argv]


def split_env(tasks: Sequence[Task]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The variables every task shares (passed by name through the engine) and each task's own
    (in the shim's table). The job secret is always shared: it never enters the table."""
    common = dict(tasks[0].env) if tasks else {}
    for t in tasks[1:]:
        common = {k: v for k, v in common.items() if t.env.get(k) == v}
    for name in dmlc_env.SECRET_VARS:
        if any(name in t.env for t in tasks):
            common[name] = tasks[0].env[name]
    own = [{k: v for k, v in t.env.items() if k not in common} for t in tasks]
    return common, own


def shim_table(plan: Plan, ordered: Sequence[Task]) -> str:
    """``LAUNCHKIT_SHIM_TASKS``: row r is what engine rank r runs (the plan index and its own
    variables), compressed (``tasktable``): its size does not grow with the number of tasks."""
    _, own = split_env(ordered)
    index = {t.task_id: i for i, t in enumerate(plan.tasks)}
    return tasktable.encode([(index[t.task_id], env) for t, env in zip(ordered, own, strict=True)])


def engine_env(plan: Plan, ordered: Sequence[Task], grace: float | None = None) -> dict[str, str]:
    """The variables the engine must pass to every rank by name: the shared contract values,
    the shim's table, the defaults (unbuffered Python) and the grace period the shim gives its
    command between SIGTERM and SIGKILL."""
    common, _ = split_env(ordered)
    env = {**dmlc_env.DEFAULTS, **common, shim.TASKS_VAR: shim_table(plan, ordered)}
    if grace is not None:
        env[shim.GRACE_VAR] = f"{grace:g}"
    return env


def scheduler_last(plan: Plan) -> list[Task]:
    """Table order for engines that run the scheduler too: servers, workers, the scheduler."""
    order = {"server": 0, "worker": 1, "scheduler": 2}
    return sorted(plan.tasks, key=lambda t: (order[t.role], t.rank))


class EngineRun:
    """One running engine process or job. Subclasses start it and feed framed lines."""

    def start(self, feed_out: Feed, feed_err: Feed) -> None:
        raise NotImplementedError

    def wait(self) -> int:
        """Block until the engine's job has ended and its output is read; a shell-style code."""
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        raise NotImplementedError

    def cleanup_commands(self) -> list[list[str]]:
        """Commands that end the engine's job if the launcher dies (run by the reaper)."""
        return []

    def finish(self) -> None:
        """Every task has reported its end but the engine lingers: end what is left of it."""


class PopenRun(EngineRun):
    """An engine that is one local process (``mpirun``, ``srun``): its stdout and stderr carry
    the framed lines; a stop (SIGTERM, SIGINT, SIGHUP) goes to it as ``stop_signal`` (the one it
    forwards to the ranks at once; Open MPI's mpirun delays SIGTERM, but forwards SIGUSR2),
    SIGKILL to its whole group."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str], cwd: str, stop_signal: int | None = None
    ) -> None:
        self.argv, self.env, self.cwd = argv, dict(env), cwd
        self.stop_signal = stop_signal
        self.proc: subprocess.Popen[bytes] | None = None
        self.readers: list[threading.Thread] = []

    def start(self, feed_out: Feed, feed_err: Feed) -> None:
        self.proc = spawn(self.argv, self.env, self.cwd)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for stream, feed in ((self.proc.stdout, feed_out), (self.proc.stderr, feed_err)):
            t = threading.Thread(target=_read_lines, args=(stream, feed), daemon=True)
            t.start()
            self.readers.append(t)

    def wait(self) -> int:
        assert self.proc is not None
        rc = self.proc.wait()
        for t in self.readers:
            t.join(5.0)
        return 128 - rc if rc < 0 else rc

    def finish(self) -> None:
        self.signal(signal.SIGKILL)  # its ranks are gone: nothing of the job's is lost

    def signal(self, sig: int) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if sig == signal.SIGKILL:
                os.killpg(self.proc.pid, sig)
            elif self.stop_signal is not None and sig in STOP_SIGNALS:
                self.proc.send_signal(self.stop_signal)
            else:
                self.proc.send_signal(sig)


def _read_lines(stream: IO[bytes], feed: Feed) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in iter(stream.readline, b""):
            feed(line)
    with contextlib.suppress(OSError):
        stream.close()


class EngineProcess:
    """One task run by the engine, as the supervisor sees it (a ProcessHandle)."""

    def __init__(self, task: Task, backend: EngineBackend) -> None:
        self.task = task
        self.pid: int | None = None
        self.node: str | None = None
        self._backend = backend
        out_r, self._out_w = os.pipe()
        err_r, self._err_w = os.pipe()
        self.stdout: IO[bytes] = os.fdopen(out_r, "rb")
        self.stderr: IO[bytes] = os.fdopen(err_r, "rb")
        self._lines = shim.Reassembler()
        self._ends = 0
        self._code: int | None = None
        self.last_output = 0.0  # time.monotonic() of its last output line from the engine
        self._done = threading.Event()
        self._lock = threading.Lock()

    # fed by the backend's demultiplexer (reader threads)
    def output(self, frame: shim.Frame) -> None:
        self.last_output = time.monotonic()
        with self._lock:
            data = self._lines.line(frame)
            if data is None:
                return
            line = data + b"\n"
            fd = self._out_w if frame.kind == "o" else self._err_w
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(fd, line)

    def ended(self, code: int, stopped: bool, whole: bool = False) -> None:
        """One of the shim's two end marks (one per stream); the second one ends the task. ``whole``:
        the mark read beside the engine's stream (which stopped passing this task's on) ends it."""
        with self._lock:
            self._ends = 2 if whole else self._ends + 1
            self._code = code
            if self._ends < 2:
                return
        self._close_streams()
        if stopped and not self._backend.tearing_down:
            threading.Timer(TEARDOWN_HOLD, self._done.set).start()
        else:
            self._done.set()

    def lost(self, code: int, lines: Iterable[str]) -> None:
        """The engine ended without this task's end mark: ``code`` from the engine, and its lines."""
        if self._done.is_set():
            return
        with self._lock:
            if self._code is None:
                self._code = code
                for text in lines:
                    if self._err_w >= 0:
                        with contextlib.suppress(OSError):
                            os.write(self._err_w, text.encode() + b"\n")
        self._close_streams()
        self._done.set()

    def _close_streams(self) -> None:
        with self._lock:
            for name in ("_out_w", "_err_w"):
                fd = getattr(self, name)
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    setattr(self, name, -1)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    # the ProcessHandle side
    def wait(self) -> int:
        self._done.wait()
        code = self._code if self._code is not None else 1
        return -(code - 128) if 128 < code < 160 else code

    def send_signal(self, sig: int) -> None:
        self._backend.signal_engine(sig)


class EngineBackend(Backend):
    """Base class of the engine backends: the scheduler runs on this machine (unless the engine
    runs it, see ``engine_runs``), every other task through one ``EngineRun``."""

    engine_label = "engine"

    def __init__(self, console: Any = None) -> None:
        self.console = console
        self.local = LocalBackend()
        self.plan: Plan | None = None
        self._index: dict[int, int] = {}  # task id -> plan index
        self.run: EngineRun | None = None
        self.procs: dict[int, EngineProcess] = {}  # plan index -> process
        self.tearing_down = False
        self.engine_tail: deque[str] = deque(maxlen=ENGINE_TAIL)
        self._signalled: set[int] = set()
        self._lock = threading.Lock()
        self._cleanup_sink: CleanupSink | None = None
        self.engine_code: int | None = None  # the engine's own exit code, once it ended
        self._engine_ended = threading.Event()
        self.last_said = ""
        self.grace = 5.0  # --grace-period, from connect()

    def connect(self, spec: LaunchSpec) -> str | None:
        self.grace = spec.grace_period
        return None

    # -- what an engine module provides --------------------------------------------------------
    def engine_runs(self, task: Task) -> bool:
        return task.role != "scheduler"

    def engine_noise(self, text: str) -> bool:
        """A line of the engine's own that says nothing to the user (an echo of our own signal)."""
        return False

    def make_run(self, plan: Plan) -> EngineRun:
        raise NotImplementedError

    # -- Backend --------------------------------------------------------------------------------
    def prepare(self, plan: Plan) -> None:
        self.plan = plan
        self._index = {t.task_id: i for i, t in enumerate(plan.tasks)}  # not tasks.index(): O(n) each

    def set_cleanup_sink(self, sink: CleanupSink) -> None:
        """Where to send commands that end the engine's job should the launcher die (the reaper)."""
        self._cleanup_sink = sink

    def start(self, task: Task) -> ProcessHandle:
        assert self.plan is not None, "prepare() first"
        if not self.engine_runs(task):
            return self.local.start(task)
        if self.run is None:
            for i, t in enumerate(self.plan.tasks):
                if self.engine_runs(t):
                    self.procs[i] = EngineProcess(t, self)
            run = self.make_run(self.plan)
            run.start(self._feed, self._feed)
            self.run = run
            self._register_cleanup(run)
            threading.Thread(target=self._follow, args=(run,), daemon=True).start()
        return self.procs[self._index[task.task_id]]

    def _register_cleanup(self, run: EngineRun) -> None:
        if self._cleanup_sink is not None:
            for argv in run.cleanup_commands():  # (each ends the engine's job: EngineRun's rule)
                self._cleanup_sink(argv, ends_job=True)

    def _feed(self, line: bytes) -> None:
        frame = shim.parse_frame(line)
        proc = self.procs.get(frame.task) if frame is not None else None
        if frame is None or proc is None:
            text = line.decode(errors="replace").rstrip("\r\n")
            if text.strip() and not self.engine_noise(text):
                self.engine_tail.append(text)
                if self.console is not None:
                    self.console.print(f"[{self.engine_label}] {text}", markup=False, highlight=False)
            return
        if frame.kind in ("o", "e"):
            proc.output(frame)
        elif frame.kind == "s":
            fields = frame.fields()
            with contextlib.suppress(ValueError, IndexError):
                proc.pid = int(fields[0])
                if self.node_unknown(proc.task):
                    proc.node = fields[1]
            self.on_task_started(proc, fields)
        elif frame.kind == "x":
            fields = frame.fields()
            try:
                code, stopped = int(fields[0]), fields[1:2] == ["1"]
            except (ValueError, IndexError):
                code, stopped = 1, False
            proc.ended(code, stopped)

    def node_unknown(self, task: Task) -> bool:
        """True when the plan could not know the task's node (the shim reports its hostname)."""
        return False

    def on_task_started(self, proc: EngineProcess, fields: list[str]) -> None:
        """Hook: an engine learns its job/step ids from the shims' start marks."""

    def _follow(self, run: EngineRun) -> None:
        try:
            self._settle(run.wait())
        finally:
            self._engine_ended.set()

    def wait_ended(self, timeout: float) -> None:
        if self.run is None:
            return
        if all(p.finished for p in self.procs.values()) and not self._engine_ended.is_set():
            # every task reported its end: the engine has only itself to end. Open MPI's mpirun
            # sometimes never does when a signal it forwards meets a rank's exit, and waits out
            # odls_base_sigkill_timeout when it ends the job itself: it gets a bound
            linger = TEARDOWN_LINGER if self.tearing_down else ENGINE_LINGER
            if self._engine_ended.wait(min(timeout, linger)):
                return
            self.run.finish()
        self._engine_ended.wait(timeout)

    def _settle(self, code: int) -> None:
        self.engine_code = code
        lost = [p for p in self.procs.values() if not p.finished]
        if lost and self.tearing_down:  # ended by the launcher's own teardown
            for p in lost:
                p.lost(128 + signal.SIGTERM, [])
        elif lost:
            why = self.engine_end_message(code)
            lines = [why, *self.engine_tail] if why else list(self.engine_tail)
            for i, p in enumerate(lost):
                p.lost(code or 1, [] if i else lines)

    def scheduler_summary(self, root_uri: str, port: int) -> str:
        if self.finds_scheduler_address() and not root_uri:
            return "scheduler started inside the engine's job (it finds its own address)"
        return super().scheduler_summary(root_uri, port)

    def say(self, message: str) -> None:
        """A line of the engine's own (state changes), on the launcher's console; the latest is
        the dashboard header's ``status``."""
        self.last_said = message
        if self.console is not None:
            self.console.print(f"[{self.engine_label}] {message}", markup=False, highlight=False)

    def status(self) -> str:
        return self.last_said

    def engine_end_message(self, code: int) -> str:
        return f"{self.engine_label} ended (exit {code}) before this process reported its end"

    def signal_engine(self, sig: int) -> None:
        with self._lock:
            if sig in self._signalled or self.run is None:
                return
            self._signalled.add(sig)
            self.tearing_down = True
        self.run.signal(sig)

    def close(self) -> None:
        if self.run is not None and not self._engine_ended.is_set():
            self.run.signal(signal.SIGKILL)
