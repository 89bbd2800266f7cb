"""The programs the ssh backend runs on a host before the job (the watchdog, the port probe) are
given --start-timeout (30 s by default, as Horovod's) once their session is open, not the
--connect-timeout; when one does not answer, the message says how long it waited and what it saw
(issue 40: a loaded host's python3 answered after the fixed 10 s; 'TimeoutError' named neither)."""

from __future__ import annotations

import os
import re
import select
import time
from typing import Any

import pytest

from launchkit.backends.ssh import worker0
from launchkit.backends.ssh.agent import HostAgent
from launchkit.backends.ssh.backend import START_TIMEOUT, SshBackend
from launchkit.backends.ssh.options import SshOptions
from launchkit.core.hostfile import host_key
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import BackendError
from tests.launchkit.plans import make_plan
from tests.launchkit.test_remote import _PipeChannel, _PipeConnection


class _SlowChannel(_PipeChannel):
    """A host whose programs start after ``delay`` seconds, ``say`` on their stderr first; with
    ``hang``, they never start."""

    def __init__(self, delay: float = 0.0, say: str = "", hang: bool = False) -> None:
        super().__init__()
        self.delay, self.say, self.hang = delay, say, hang
        self.timeout: float | None = None

    def exec_command(self, command: str) -> None:
        before = f"echo {self.say} >&2; " if self.say else ""
        then = "exec sleep 60" if self.hang else command
        super().exec_command(f"{before}sleep {self.delay}; {then}")

    # what the port probe uses of a paramiko channel
    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout

    def makefile(self, mode: str) -> Any:
        return _TimedReader(self)

    def recv_stderr_ready(self) -> bool:
        assert self.p is not None and self.p.stderr is not None
        return bool(select.select([self.p.stderr], [], [], 0.2)[0])

    def recv_stderr(self, n: int) -> bytes:
        assert self.p is not None and self.p.stderr is not None
        return os.read(self.p.stderr.fileno(), n)

    def kill(self) -> None:
        if self.p is not None:
            self.p.kill()
            self.p.wait()


class _TimedReader:
    """A channel's stdout as paramiko's file reads it with a timeout set: TimeoutError after
    ``timeout`` seconds without data."""

    def __init__(self, chan: _SlowChannel) -> None:
        self.chan = chan

    def read(self) -> bytes:
        p = self.chan.p
        assert p is not None and p.stdout is not None
        got = b""
        while True:
            if not select.select([p.stdout], [], [], self.chan.timeout)[0]:
                raise TimeoutError()
            piece = os.read(p.stdout.fileno(), 65536)
            if not piece:
                return got
            got += piece

    def readline(self) -> bytes:  # the agent's reader: no timeout
        assert self.chan.p is not None and self.chan.p.stdout is not None
        return self.chan.p.stdout.readline()


def _conn(chan: _SlowChannel) -> _PipeConnection:
    conn = _PipeConnection()
    conn.chan = chan
    return conn


def _agent(chan: _SlowChannel) -> HostAgent:
    return HostAgent(
        Host("h1"), _conn(chan), "job-start", hb_interval=5.0, hb_timeout=30.0, grace=1.0, interface=None
    )


def test_a_watchdog_slower_than_the_connect_timeout_starts_within_the_start_timeout(tmp_path) -> None:
    """--connect-timeout 0.5 bounds the session's opening only: a watchdog that answers after
    1.5 s starts (it was given the connect timeout, and failed, before)."""
    assert START_TIMEOUT == 30.0
    spec = LaunchSpec(
        num_workers=1, num_servers=0, command=("true",), backend="ssh", hosts=(Host("h1"),), cwd=str(tmp_path)
    )
    chan = _SlowChannel(delay=1.5)
    backend = SshBackend(SshOptions(connect_timeout=0.5), start_timeout=10.0)
    backend.spec = spec
    backend.conns = {host_key(Host("h1")): _conn(chan)}
    plan = make_plan(spec, job_id="job-start", secret="s", root_uri="127.0.0.1", root_port=1)
    try:
        backend.prepare(plan)
        assert backend.agents[host_key(Host("h1"))].info["ev"] == "ready"
    finally:
        backend.close()
        chan.kill()


@pytest.mark.parametrize(
    ("say", "seen"),
    [
        ("ImportError:_no_module", "its stderr: ImportError:_no_module; is python3 there?"),
        ("", "no answer and nothing on its stderr (a loaded host may need a longer --start-timeout)"),
    ],
)
def test_a_watchdog_that_does_not_answer_is_named_with_the_wait_and_what_was_seen(
    say: str, seen: str
) -> None:
    chan = _SlowChannel(say=say, hang=True)
    t0 = time.monotonic()
    try:
        with pytest.raises(BackendError) as err:
            _agent(chan).start(5.0, 0.5)
    finally:
        chan.kill()
    assert time.monotonic() - t0 < 5
    assert err.value.message == f"ssh: h1: the watchdog did not start within 0.5 s (--start-timeout): {seen}"


def test_the_port_probe_gets_the_start_timeout() -> None:
    slow = _SlowChannel(delay=1.0)
    try:
        address, root, master = worker0.probe(
            _conn(slow), Host("h1"), None, 0.2, "python3", start_timeout=10.0
        )
    finally:
        slow.kill()
    assert address == "h1" and root > 0 and master > 0 and root != master  # no SSH_CONNECTION here: its name
    hung = _SlowChannel(say="loading_torch", hang=True)
    try:
        with pytest.raises(BackendError) as err:
            worker0.probe(_conn(hung), Host("h1"), None, 5.0, "python3", start_timeout=0.3)
    finally:
        hung.kill()
    msg = err.value.message
    assert (
        "h1: cannot pick worker 0's ports there: the port probe (python3 -c) did not answer within 0.3 s"
        in msg
    )
    assert re.search(r"\(--start-timeout; waited \d+\.\d s\): its stderr: loading_torch$", msg), msg


def test_a_probe_that_fails_says_what_it_printed() -> None:
    chan = _SlowChannel()
    try:
        with pytest.raises(BackendError, match=r"printed ''; its stderr: .*no-such-python"):
            worker0.probe(_conn(chan), Host("h1"), None, 5.0, "no-such-python", start_timeout=5.0)
    finally:
        chan.kill()
