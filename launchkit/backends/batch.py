"""A batch job submitted to an engine's queue (sbatch, qsub), followed to its end.

What a batch engine supplies: how to submit (argv + a script on the submitter's stdin), how to
read the job's state (``poll``: None while it runs, else its exit code), which files hold its
output, and how to cancel it. This class tails those files as they grow (a line at a time, a
partial line kept until its end arrives), reports state changes, and after the end reads the
files a few more times so nothing written last is lost.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from launchkit.backends.engine import EngineBackend, EngineRun, Feed
from launchkit.core.spec import Plan
from launchkit.errors import EXIT_USAGE, BackendError

POLL = 0.5
FINAL_READS = 3
SUBMIT_TIMEOUT = 60


def engine_said(command: str, proc: subprocess.CompletedProcess[str]) -> str:
    """What a failed engine command said, on one line: its exit code and its non-empty lines."""
    lines = [line.strip() for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
    return f"{command} failed (exit {proc.returncode})" + (f": {'; '.join(lines)}" if lines else "")


def not_available(engine: str, why: str) -> BackendError:
    """The engine cannot take the job (its controller is down, it refused, it is not installed):
    a usage error (exit 2): nothing was started."""
    return BackendError(
        engine,
        f"not available: {why}; nothing was started (is the {engine} engine running here?)",
        EXIT_USAGE,
    )


class FileTail:
    """New complete lines of a growing set of files."""

    def __init__(self, files: Callable[[], list[str]]) -> None:
        self.files = files
        self.pos: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}

    def read(self, feed: Feed) -> None:
        for path in self.files():
            try:
                with open(path, "rb") as f:
                    f.seek(self.pos.get(path, 0))
                    data = f.read()
            except OSError:  # not there yet
                continue
            self.pos[path] = self.pos.get(path, 0) + len(data)
            *lines, self.partial[path] = (self.partial.get(path, b"") + data).split(b"\n")
            for line in lines:
                feed(line + b"\n")

    def flush(self, feed: Feed) -> None:
        for rest in self.partial.values():
            if rest:
                feed(rest + b"\n")
        self.partial.clear()


class BatchRun(EngineRun):
    """Subclasses set ``engine`` and implement ``parse_submit``, ``poll``, ``output_files`` and
    ``cancel_argv``."""

    engine = "batch"

    def __init__(
        self,
        argv: list[str],
        script: str,
        env: Mapping[str, str],
        cwd: str,
        say: Callable[[str], None] | None,
    ) -> None:
        self.argv, self.script, self.env, self.cwd, self.say = argv, script, dict(env), cwd, say
        self.job_id: str | None = None
        self.ended_state = ""  # the engine's word for how it ended, once it has
        self._ended = threading.Event()
        self._code = 0

    # -- what an engine supplies ---------------------------------------------------------------
    def parse_submit(self, stdout: str) -> str:
        raise NotImplementedError

    def poll(self) -> tuple[str, int | None]:
        """(the engine's state, the exit code once the job has ended, else None)."""
        raise NotImplementedError

    def output_files(self) -> list[str]:
        raise NotImplementedError

    def cancel_argv(self, sig: int) -> list[list[str]]:
        raise NotImplementedError

    def output_location(self) -> str:
        """Where the job's output lands (a file, or a directory of per-task files)."""
        raise NotImplementedError

    def describe_state(self, state: str) -> str:
        """The engine's state as the launcher says it."""
        return state.lower()

    # -- EngineRun ---------------------------------------------------------------------------------
    def submit(self) -> str:
        """Submit (the script on the submitter's stdin: no file left behind); the engine's job id."""
        try:
            proc = subprocess.run(
                self.argv,
                input=self.script,
                env=self.env,
                cwd=self.cwd,
                capture_output=True,
                text=True,
                timeout=SUBMIT_TIMEOUT,
            )
        except FileNotFoundError:
            raise not_available(self.engine, f"{self.argv[0]} is not on PATH") from None
        except subprocess.TimeoutExpired:
            raise not_available(self.engine, f"{self.argv[0]} did not answer in {SUBMIT_TIMEOUT} s") from None
        if proc.returncode != 0:
            raise not_available(self.engine, engine_said(self.argv[0], proc))
        return self.parse_submit(proc.stdout)

    def start(self, feed_out: Feed, feed_err: Feed) -> None:
        self.job_id = self.submit()
        threading.Thread(target=self._follow, args=(feed_out,), daemon=True).start()

    def _follow(self, feed: Feed) -> None:
        tail = FileTail(self.output_files)
        shown = ""
        final_reads = 0
        try:
            while final_reads < FINAL_READS:
                state, code = self.poll()
                tail.read(feed)
                if code is None:
                    final_reads = 0  # an end counts only when seen FINAL_READS times in a row
                    if state not in (shown, "UNKNOWN") and self.say is not None:
                        shown = state
                        self.say(f"{self.engine} job {self.job_id}: {self.describe_state(state)}")
                else:
                    self.ended_state, self._code = state, code
                    final_reads += 1
                time.sleep(POLL)
            tail.flush(feed)
        finally:
            self._ended.set()

    def wait(self) -> int:
        self._ended.wait()
        return self._code

    def signal(self, sig: int) -> None:
        if self.job_id is None:
            return
        for argv in self.cancel_argv(sig):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(argv, env=self.env, capture_output=True, timeout=30)

    def cleanup_commands(self) -> list[list[str]]:
        import signal

        return self.cancel_argv(signal.SIGKILL) if self.job_id else []


class BatchBackend(EngineBackend):
    """An engine backend whose job is a batch job (``BatchRun``): it can be submitted and left
    (``--detach``), and its id and output go into the job record."""

    def __init__(self, console: object = None) -> None:
        super().__init__(console)
        self.batch: BatchRun | None = None

    def can_detach(self) -> bool:
        return True

    def detach_refusal(self) -> str:
        return f"--launcher {self.name} cannot submit one here"

    def submit(self, plan: Plan) -> str:
        """``--detach``: submit the job and return the engine's id for it (nothing is followed)."""
        run = self.make_run(plan)
        assert isinstance(run, BatchRun), "can_detach() first"
        return run.submit()

    def output_of(self, plan: Plan) -> str | None:
        return self.batch.output_location() if self.batch is not None else None

    def record_info(self) -> dict[str, Any] | None:
        # known only once the job is submitted: the supervisor records it after the start
        if self.batch is None or self.batch.job_id is None:
            return None
        return {"engine": self.name, "engine_job": self.batch.job_id, "output": self.batch.output_location()}
