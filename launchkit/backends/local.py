"""The local backend: every process on this machine, each in its own session/process group."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from typing import IO

from dmlc_env import merge_env
from launchkit.backends.base import Backend
from launchkit.core.capabilities import Capabilities
from launchkit.core.spec import Task


class LocalProcess:
    def __init__(self, task: Task, popen: subprocess.Popen[bytes]) -> None:
        self.task = task
        self._popen = popen
        self.pid: int | None = popen.pid
        assert popen.stdout is not None and popen.stderr is not None
        self.stdout: IO[bytes] = popen.stdout
        self.stderr: IO[bytes] = popen.stderr

    def wait(self) -> int:
        return self._popen.wait()

    def send_signal(self, sig: int) -> None:
        # The process leads its own group (start_new_session), so the group id is its pid.
        # Once it has been reaped its pid may be reused: only signal while it is ours.
        if self._popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)


class LocalBackend(Backend):
    name = "local"
    capabilities = Capabilities(
        hosts="here",
        hostfile_ignored="every process runs on this machine",
        here=True,
        inherits_env=True,
        restarts=True,
        elastic="resize",
    )

    def start(self, task: Task) -> LocalProcess:
        return LocalProcess(task, spawn(list(task.argv), merge_env(os.environ, task.env), task.cwd))


def spawn(argv: list[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """A process on this machine in a session of its own (its group is its pid), no stdin, its
    stdout and stderr piped to us."""
    return subprocess.Popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
