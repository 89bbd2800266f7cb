"""The remote watchdog, driven over pipes exactly as the launcher drives it over ssh (the same
bootstrap command and module payload), on this machine."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import IO

import fabric
import paramiko
import pytest

from launchkit.backends.ssh import agent as agent_mod
from launchkit.backends.ssh.agent import SHIPPED, HostAgent, bootstrap_payload, remote_command
from launchkit.backends.ssh.backend import SshBackend
from launchkit.core.hostfile import host_key
from launchkit.core.spec import Host, LaunchSpec, Task
from launchkit.errors import BackendError
from launchkit.hostside import watchdog
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import pids_with_job, wait_until


class Dog:
    def __init__(self, job: str, hb_timeout: float = 30.0, window: int | None = None) -> None:
        self.job = job
        self.p = subprocess.Popen(
            ["sh", "-c", remote_command(sys.executable)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(bootstrap_payload())
        self.send(
            {
                "op": "hello",
                "job": job,
                "hb_interval": 0.2,
                "hb_timeout": hb_timeout,
                "grace": 1,
                "window": window,
            }
        )
        self.events: list[dict] = []

    def send(self, msg: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def until(self, ev: str, timeout: float = 10, **match) -> dict:
        """The first event (already received or next) of kind ``ev`` matching ``match``."""
        assert self.p.stdout is not None
        for msg in self.events:
            if msg.get("ev") == ev and all(msg.get(k) == v for k, v in match.items()):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.next_event(ev)
            if msg.get("ev") == ev and all(msg.get(k) == v for k, v in match.items()):
                return msg
        raise AssertionError(f"no {ev} within {timeout}s")

    def next_event(self, waiting_for: str = "") -> dict:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"watchdog ended before {waiting_for}: {self.events[-5:]}")
        msg = json.loads(line)
        if msg.get("ev") == "out":
            msg["data"] = self.p.stdout.read(msg["n"])
        self.events.append(msg)
        return msg

    def output(self, ident: int, stream: str = "o") -> bytes:
        return b"".join(
            m["data"] for m in self.events if m.get("ev") == "out" and m["id"] == ident and m["s"] == stream
        )


def test_spawn_output_env_exit_and_shutdown() -> None:
    dog = Dog("wd-test-1")
    try:
        assert dog.until("ready")["pid"] > 0
        env = {"X_VALUE": "a b $(id) ;'\"", "LAUNCHKIT_JOB_ID": "wd-test-1"}
        code = "import os,sys; print(os.environ['X_VALUE']); print('err', file=sys.stderr); sys.exit(7)"
        dog.send(
            {
                "op": "spawns",
                "procs": [{"id": 5, "argv": [sys.executable, "-c", code], "env": env, "cwd": "/"}],
            }
        )
        assert dog.until("started", id=5)["pid"] > 0
        assert dog.until("exit", id=5)["rc"] == 7
        dog.until("eof", id=5, s="o")
        assert dog.output(5) == b"a b $(id) ;'\"\n"
        dog.send({"op": "spawns", "procs": [{"id": 6, "argv": ["/no/such/program"], "env": {}, "cwd": "/"}]})
        err = dog.until("error", id=6)
        assert err["code"] == 127
        dog.send({"op": "shutdown"})
        assert dog.until("bye")["swept"] == 0
        assert dog.p.wait(timeout=5) == 0
    finally:
        dog.p.kill()


def test_channel_close_ends_every_process_and_grandchild() -> None:
    job = "wd-test-2"
    dog = Dog(job)
    try:
        dog.until("ready")
        grandchild = "import subprocess,time; subprocess.Popen(['setsid','sleep','60']); time.sleep(60)"
        for i in range(2):
            dog.send(
                {
                    "op": "spawns",
                    "procs": [
                        {
                            "id": i,
                            "argv": [sys.executable, "-c", grandchild],
                            "env": {"LAUNCHKIT_JOB_ID": job},
                            "cwd": "/",
                        }
                    ],
                }
            )
            dog.until("started", id=i)
        assert wait_until(lambda: len(pids_with_job(job)) == 4, 5)
        assert dog.p.stdin is not None
        dog.p.stdin.close()  # what a dead launcher's ssh connection looks like from the host
        assert wait_until(lambda: pids_with_job(job) == [], 5), pids_with_job(job)
        assert dog.p.wait(timeout=5) == 0
    finally:
        dog.p.kill()


def test_silence_from_the_launcher_ends_the_job() -> None:
    job = "wd-test-3"
    dog = Dog(job, hb_timeout=1.0)
    try:
        dog.until("ready")
        dog.send(
            {
                "op": "spawns",
                "procs": [{"id": 0, "argv": ["sleep", "60"], "env": {"LAUNCHKIT_JOB_ID": job}, "cwd": "/"}],
            }
        )
        dog.until("started", id=0)
        t0 = time.monotonic()
        lost = dog.until("lost", timeout=5)
        assert "no heartbeat from the launcher" in lost["msg"]
        assert dog.until("exit", id=0)["rc"] == -15
        assert time.monotonic() - t0 < 4
        assert pids_with_job(job) == []
    finally:
        dog.p.kill()


def test_garbage_on_the_channel_is_reported_not_fatal() -> None:
    dog = Dog("wd-test-4")
    try:
        dog.until("ready")
        assert dog.p.stdin is not None
        dog.p.stdin.write(b'this is not json\n{"op": "spawns"}\n')
        dog.p.stdin.flush()
        dog.send({"op": "spawns", "procs": [{"id": 1, "argv": ["true"], "env": {}, "cwd": "/"}]})
        assert dog.until("exit", id=1)["rc"] == 0  # still serving
        bad = [m["msg"] for m in dog.events if m.get("ev") == "bad"]
        assert len(bad) == 2 and "JSONDecodeError" in bad[0] and "KeyError" in bad[1]
    finally:
        dog.p.kill()


def test_a_directory_in_the_home_starts_where_rsync_wrote(tmp_path, monkeypatch) -> None:
    """``--sync-dst-dir '~/x'`` (quoted: the local shell left the ``~``): rsync's remote shell
    wrote into the home's x, and the processes start there, not in a literal ``~/x`` (exit 127);
    a relative directory is the login directory's, as rsync's is."""
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # the watchdog's host is this machine, its HOME this one
    monkeypatch.chdir(home)  # and its login directory the home, as sshd's
    dog = Dog("wd-test-home")
    try:
        dog.until("ready")
        show = [sys.executable, "-c", "import os; print(os.getcwd())"]
        procs = [
            {"id": i, "argv": show, "env": {}, "cwd": cwd} for i, cwd in enumerate(["~/x", "~/x/", "~", "x"])
        ]
        dog.send({"op": "spawns", "procs": procs})
        for i, want in enumerate([home / "x", home / "x", home, home / "x"]):
            assert dog.until("exit", id=i)["rc"] == 0, dog.events
            dog.until("eof", id=i, s="o")
            assert dog.output(i).decode().strip() == str(want)
    finally:
        dog.p.kill()


def test_process_dir_expands_a_home_at_the_start_only(monkeypatch) -> None:
    monkeypatch.setenv("HOME", "/h/me")
    assert watchdog.process_dir("~/x") == "/h/me/x"
    assert watchdog.process_dir("~") == "/h/me"
    assert watchdog.process_dir("/srv/~x") == "/srv/~x"
    assert watchdog.process_dir("x/~") == "x/~"
    assert watchdog.process_dir("$HOME/x") == "$HOME/x"  # rsync 3.2.4+ writes that name literally too
    assert watchdog.process_dir("") is None and watchdog.process_dir(None) is None


def test_output_waits_for_acknowledgements_and_heartbeats_go_on() -> None:
    """With a window, a stream's unacknowledged output stops at the window (plus one chunk): the
    process waits, heartbeats keep coming; acknowledgements let the rest through, in order."""
    dog = Dog("wd-test-5", window=100_000)
    try:
        dog.until("ready")
        code = "import sys\nfor i in range(60000): print(f'{i:08d}' + 'y' * 41)"
        dog.send(
            {
                "op": "spawns",
                "procs": [{"id": 1, "argv": [sys.executable, "-c", code], "env": {}, "cwd": "/"}],
            }
        )
        dog.until("started", id=1)
        while not dog.output(1):  # its first output (a slow start must not read as held at 0)
            dog.next_event("output")
        for _ in range(3):  # heartbeats while the process is held back
            dog.events = [m for m in dog.events if m.get("ev") != "hb"]
            dog.until("hb")
        held = len(dog.output(1))
        assert 0 < held <= 100_000 + 65536
        assert not any(m.get("ev") == "exit" for m in dog.events)  # still waiting on its pipe
        acked = 0
        while not any(m.get("ev") == "eof" and m["s"] == "o" for m in dog.events):
            got = len(dog.output(1))
            if got > acked:
                dog.send({"op": "acks", "a": [[1, "o", got - acked]]})
                acked = got
            dog.next_event("eof")
        assert dog.output(1) == b"".join(b"%08d" % i + b"y" * 41 + b"\n" for i in range(60000))
        assert dog.until("exit", id=1)["rc"] == 0
    finally:
        dog.p.kill()


def test_a_spawn_while_the_watchdog_ends_is_refused() -> None:
    """Once the watchdog is ending, the process table is final: a spawn that arrives then is
    answered with an error and starts nothing (teardown would not see it)."""
    out = io.BytesIO()
    dog = watchdog.Watchdog(out)
    dog.stopping.set()
    try:
        dog.spawns({"procs": [{"id": 3, "argv": ["sleep", "60"], "env": {}}]})
        assert dog.children == {}
    finally:
        for child in dog.children.values():
            child.kill()
            child.wait()
    (msg,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert msg["ev"] == "error" and msg["id"] == 3 and msg["code"] == 126


def launchkit_imports(module: object) -> set[str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return {name for name in found if name.split(".")[0] in ("launchkit", "dmlc_env")}


def test_everything_the_watchdog_imports_is_shipped_before_it() -> None:
    names = [m.__name__ for m in SHIPPED]
    assert names[-1] == "launchkit.hostside.watchdog"
    for i, module in enumerate(SHIPPED):
        assert launchkit_imports(module) <= set(names[:i]), module.__name__
    assert list(json.loads(bootstrap_payload().split(b"\n", 1)[1])) == names


# -- the launcher's side of a host (HostAgent), in-process -------------------------------------


class _RefusingTransport:
    def open_session(self, timeout: float | None = None) -> None:
        raise paramiko.ChannelException(1, "administratively prohibited")


class _RefusingConnection(fabric.Connection):
    """A connection whose session cannot be opened; records that it was closed."""

    closed = 0

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.transport = _RefusingTransport()

    def close(self) -> None:
        type(self).closed += 1


def _agent(conn: object = None) -> HostAgent:
    return HostAgent(Host("h1"), conn, "job-x", hb_interval=1.0, hb_timeout=30.0, grace=1.0, interface=None)


def _task(tmp_path) -> Task:
    spec = LaunchSpec(num_workers=2, num_servers=0, command=("true",), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="job-x", secret="s", root_uri="127.0.0.1", root_port=1)
    return next(t for t in plan.tasks if t.role == "worker")


def test_a_session_that_cannot_be_opened_is_the_error_and_connections_are_closed(tmp_path) -> None:
    _RefusingConnection.closed = 0
    backend = SshBackend()
    backend.spec = LaunchSpec(
        num_workers=2,
        num_servers=0,
        command=("true",),
        cwd=str(tmp_path),
        hosts=(Host("h1"), Host("h2")),
        backend="ssh",
    )
    backend.conns = {host_key(h): _RefusingConnection(h.name) for h in backend.spec.hosts}
    plan = make_plan(backend.spec, job_id="job-x", secret="s", root_uri="127.0.0.1", root_port=1)
    with pytest.raises(BackendError) as err:
        backend.prepare(plan)
    assert "could not start on 2 host(s)" in err.value.message
    assert "administratively prohibited" in err.value.message
    assert _RefusingConnection.closed >= 2  # every connection closed


def test_the_process_table_can_change_while_a_lost_host_ends_its_processes(tmp_path, monkeypatch) -> None:
    """Another thread starts a process while the host is being declared lost: no
    'dictionary changed size during iteration', and the new process ends as lost too."""
    agent = _agent()
    agent.lost = "the connection to h1 closed"  # spawn() then starts nothing remote
    first = agent.spawn(0, _task(tmp_path))
    inside, release = threading.Event(), threading.Event()
    finish = agent_mod.RemoteProcess.finish

    def slow_finish(self, rc: int, note: str | None = None) -> None:
        if self.index == 0 and not inside.is_set():
            inside.set()
            release.wait(10)
        finish(self, rc, note)

    monkeypatch.setattr(agent_mod.RemoteProcess, "finish", slow_finish)
    first._done.clear()
    errors: list[BaseException] = []

    def mark() -> None:
        try:
            agent._mark_lost("host h1 stopped answering")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=mark)
    t.start()
    assert inside.wait(10)
    second = agent.spawn(1, _task(tmp_path))
    release.set()
    t.join(10)
    assert errors == []
    assert first.wait() == second.wait() == 255


def test_output_is_never_written_to_a_descriptor_closed_meanwhile(tmp_path, monkeypatch) -> None:
    """The stream is closed by another thread just as a chunk is being written, and its
    descriptor number is taken by a new file: the chunk reaches the process's stdout, never
    that file."""
    proc = agent_mod.RemoteProcess(_agent(), 0, _task(tmp_path))
    victim = tmp_path / "victim"
    real_write = os.write
    fired: list[int] = []

    def write(fd: int, data) -> int:
        if bytes(data[:7]) == b"PAYLOAD" and not fired:
            closer = threading.Thread(target=proc.close_all)
            closer.start()
            closer.join(2)  # a close that waits for the write is fine too
            fired.append(os.open(victim, os.O_WRONLY | os.O_CREAT))
        return real_write(fd, data)

    monkeypatch.setattr(agent_mod.os, "write", write)
    proc.feed("o", b"PAYLOAD and more\n")
    assert proc.stdout.read() == b"PAYLOAD and more\n"
    os.close(fired[0])
    assert victim.read_bytes() == b""


def test_an_exit_and_a_lost_connection_at_once_give_one_result(tmp_path, monkeypatch) -> None:
    """The host is declared lost (its note being written) just as the process's exit arrives on
    the channel: whoever waits sees the first end only, not the other's code."""
    proc = agent_mod.RemoteProcess(_agent(), 0, _task(tmp_path))
    inside, release = threading.Event(), threading.Event()
    feed = agent_mod.RemoteProcess.feed

    def slow_feed(self, stream: str, data: bytes, acked: bool = True) -> None:
        inside.set()
        release.wait(10)
        feed(self, stream, data, acked)

    monkeypatch.setattr(agent_mod.RemoteProcess, "feed", slow_feed)
    seen: list[int] = []
    waiter = threading.Thread(target=lambda: seen.append(proc.wait()))
    waiter.start()
    lost = threading.Thread(target=proc.finish, args=(255, "host h1 stopped answering"))
    lost.start()
    assert inside.wait(10)  # the lost host's end is under way
    exited = threading.Thread(target=proc.finish, args=(0,))
    exited.start()
    time.sleep(0.2)  # the exit, had it not waited, would have woken the waiter by now
    release.set()
    for t in (lost, exited, waiter):
        t.join(10)
    assert seen == [255] and proc.wait() == 255


class _PipeChannel:
    """The few methods of a paramiko channel the agent uses, over a watchdog run here (the same
    bootstrap command and payload as over ssh)."""

    def __init__(self) -> None:
        self.p: subprocess.Popen[bytes] | None = None

    def exec_command(self, command: str) -> None:
        self.p = subprocess.Popen(
            ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def sendall(self, data: bytes) -> None:
        assert self.p is not None and self.p.stdin is not None
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def makefile(self, mode: str) -> IO[bytes]:
        assert self.p is not None and self.p.stdout is not None
        return self.p.stdout

    def makefile_stderr(self, mode: str) -> IO[bytes]:
        assert self.p is not None and self.p.stderr is not None
        return self.p.stderr

    def close(self) -> None:
        if self.p is not None and self.p.stdin is not None:
            with contextlib.suppress(OSError):
                self.p.stdin.close()


class _PipeConnection:
    def __init__(self) -> None:
        self.chan = _PipeChannel()
        self.transport = self

    def open_session(self, timeout: float | None = None) -> _PipeChannel:
        return self.chan


def test_an_instruction_the_watchdog_cannot_read_is_a_protocol_error_naming_the_host(tmp_path) -> None:
    """The watchdog answers a malformed instruction with a 'bad' event: the agent reports it as a
    protocol error naming the host, and the processes there end with it (it was dropped, and the
    process the instruction was about ran on, unended)."""
    conn = _PipeConnection()
    agent = HostAgent(
        Host("h1"), conn, "job-bad", hb_interval=0.2, hb_timeout=30.0, grace=1.0, interface=None
    )
    agent.start(10.0)
    task = dataclasses.replace(_task(tmp_path), argv=("sleep", "60"), env={"LAUNCHKIT_JOB_ID": "job-bad"})
    proc = agent.spawn(0, task)
    try:
        assert proc.started.wait(10) and proc.pid is not None
        agent.send({"op": "signal", "id": 0})  # no "sig": the watchdog cannot read it
        assert proc._done.wait(10), "the bad event was dropped"
        assert proc.wait() == agent_mod.LOST_EXIT
        assert agent.lost is not None and "protocol error with the watchdog on h1" in agent.lost
        assert "KeyError" in agent.lost
        assert b"launchkit: protocol error with the watchdog on h1" in proc.stderr.read()
        assert wait_until(lambda: pids_with_job("job-bad") == [], 10)  # ended there as the channel closed
    finally:
        agent.close(2.0)
        assert conn.chan.p is not None
        conn.chan.p.kill()
        conn.chan.p.wait()


def test_the_watchdog_starts_without_the_hosts_site_packages(tmp_path) -> None:
    """The watchdog is standard library only: its python3 runs with -S, so neither the host's
    site-packages nor a sitecustomize is imported (the start's CPU on every host, 128 at a time)."""
    (tmp_path / "sitecustomize.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    p = subprocess.Popen(
        ["sh", "-c", remote_command(sys.executable)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        p.stdin.write(bootstrap_payload() + b'{"op":"hello","job":"wd-nosite","hb_interval":1}\n')
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["ev"] == "ready"
        assert not (tmp_path / "imported").exists()
        p.stdin.write(b'{"op":"shutdown"}\n')
        p.stdin.close()
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()
        p.wait()


@pytest.mark.proc  # the watchdog tries to start the program
def test_a_program_not_found_on_a_host_says_the_path_it_was_looked_for_in() -> None:
    """ssh's "cannot start 'sh' on node1: No such file or directory: sh" said nothing of the PATH
    (a broken --env PATH, a venv not on the host), where local and the engines' shim say it."""
    out = io.BytesIO()
    dog = watchdog.Watchdog(out)
    try:
        dog.spawns({"procs": [{"id": 4, "argv": ["no-such-program-lk"], "env": {"PATH": "/nowhere/bin"}}]})
        dog.spawns({"procs": [{"id": 5, "argv": ["./no-such-program-lk"], "env": {}}]})
    finally:
        for child in dog.children.values():
            child.kill()
            child.wait()
    first, second = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first["code"] == 127 and first["msg"].endswith("no-such-program-lk (PATH=/nowhere/bin)"), first
    assert second["code"] == 127 and "PATH=" not in second["msg"], second  # a path: no PATH said
