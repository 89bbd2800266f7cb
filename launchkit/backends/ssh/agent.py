"""The launcher's side of one remote host: an ssh connection and the watchdog running there.

``HostAgent`` starts ``launchkit.hostside.watchdog`` over the connection (sending its source and
the hostside modules it imports, ``SHIPPED``), on a session of the fabric connection's paramiko
transport, then multiplexes every process of that host over that one channel: spawn, signal,
heartbeats, output.
Each remote process appears to the supervisor as a ``RemoteProcess`` whose stdout/stderr are
local pipes fed from the channel, so output handling is the same as for local processes.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import os
import shlex
import threading
import time
from typing import IO, Any

import dmlc_env
from launchkit.backends.ssh import connection as ssh
from launchkit.core.spec import Host, Task
from launchkit.errors import BackendError
from launchkit.hostside import netif, procscan, watchdog

LOST_EXIT = 255  # as ssh reports a connection lost
#: What the host runs, in import order: the watchdog last, after the hostside modules it imports
#: (a test checks that nothing it imports is missing).
SHIPPED = (dmlc_env, procscan, netif, watchdog)


def bootstrap_payload() -> bytes:
    """The modules the watchdog needs, as the BOOTSTRAP command reads them from stdin."""
    body = json.dumps({m.__name__: inspect.getsource(m) for m in SHIPPED}).encode()
    return str(len(body)).encode() + b"\n" + body


def remote_command(python: str = "python3") -> str:
    return shlex.join([python, "-u", "-c", watchdog.BOOTSTRAP])


class RemoteProcess:
    def __init__(self, agent: HostAgent, index: int, task: Task) -> None:
        self.agent = agent
        self.index = index
        self.task = task
        self.pid: int | None = None
        out_r, self._out_w = os.pipe()
        err_r, self._err_w = os.pipe()
        self.stdout: IO[bytes] = os.fdopen(out_r, "rb")
        self.stderr: IO[bytes] = os.fdopen(err_r, "rb")
        self._writers = {"o": self._out_w, "e": self._err_w}
        self._done = threading.Event()
        self._rc = 0
        self.started = threading.Event()

    def feed(self, stream: str, data: bytes) -> None:
        fd = self._writers.get(stream)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, data)

    def close_stream(self, stream: str) -> None:
        fd = self._writers.pop(stream, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def finish(self, rc: int, note: str | None = None) -> None:
        if self._done.is_set():
            return
        if note:
            self.feed("e", f"launchkit: {note}\n".encode())
        self._rc = rc
        self._done.set()
        self.started.set()

    def close_all(self) -> None:
        for s in list(self._writers):
            self.close_stream(s)

    def wait(self) -> int:
        self._done.wait()
        return self._rc

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():
            self.agent.send({"op": "signal", "id": self.index, "sig": int(sig)})


class HostAgent:
    def __init__(self, host: Host, conn: Any, job_id: str, *, hb_interval: float, hb_timeout: float, grace: float,
                 interface: str | None, time_limit: float | None = None) -> None:  # fmt: skip
        self.host = host
        self.conn = conn  # an open fabric.Connection: its paramiko transport carries the channel
        self.job_id = job_id
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.grace = grace
        self.interface = interface
        self.time_limit = time_limit
        self.procs: dict[int, RemoteProcess] = {}
        self.info: dict[str, Any] = {}
        self.lost: str | None = None
        self.swept = 0
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._bye = threading.Event()
        self._last_heard = time.monotonic()
        self._stop = threading.Event()
        self._stderr = bytearray()

    # -- start ------------------------------------------------------------------------------
    def start(self, timeout: float) -> None:
        self.chan = self.conn.transport.open_session(timeout=timeout)
        self.chan.exec_command(remote_command())
        self.chan.sendall(bootstrap_payload())
        self._out = self.chan.makefile("rb")
        threading.Thread(target=self._read, daemon=True, name=f"agent-{self.host}").start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.send(
            {
                "op": "hello",
                "job": self.job_id,
                "hb_interval": self.hb_interval,
                "hb_timeout": self.hb_timeout,
                "grace": self.grace,
                "interface": self.interface,
                "time_limit": self.time_limit,
            }
        )
        if not self._ready.wait(timeout):
            detail = self._stderr.decode(errors="replace").strip()[-500:]
            raise BackendError(
                "ssh", f"{self.host}: the watchdog did not start ({detail or 'no answer'}); is python3 there?"
            )
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            try:
                self.chan.sendall(data)
            except OSError as exc:
                self._mark_lost(f"connection to {self.host} failed: {exc}")

    # -- processes --------------------------------------------------------------------------
    def spawn(self, index: int, task: Task) -> RemoteProcess:
        proc = RemoteProcess(self, index, task)
        self.procs[index] = proc
        if self.lost:
            proc.finish(LOST_EXIT, self.lost)
            proc.close_all()
            return proc
        self.send({"op": "spawn", "id": index, "argv": list(task.argv), "env": dict(task.env), "cwd": task.cwd,
                   "node_host": True})  # fmt: skip
        proc.started.wait(10.0)
        return proc

    # -- channel ----------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            for line in iter(self._out.readline, b""):
                self._last_heard = time.monotonic()
                try:
                    self._dispatch(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
        except (OSError, EOFError):
            pass
        self._mark_lost(f"the connection to {self.host} closed")

    def _read_stderr(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            for line in iter(self.chan.makefile_stderr("rb").readline, b""):
                self._stderr += line

    def _dispatch(self, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        proc = self.procs.get(msg.get("id", -1))
        if ev == "out" and proc:
            proc.feed(msg["s"], base64.b64decode(msg["d"]))
        elif ev == "eof" and proc:
            proc.close_stream(msg["s"])
        elif ev == "started" and proc:
            proc.pid = int(msg["pid"])
            proc.started.set()
        elif ev == "error" and proc:
            proc.feed("e", f"cannot start {proc.task.argv[0]!r} on {self.host}: {msg.get('msg')}\n".encode())
            proc.close_all()
            proc.finish(int(msg.get("code", 127)))
        elif ev == "exit" and proc:
            proc.finish(int(msg["rc"]))
        elif ev == "ready":
            self.info = msg
            self._ready.set()
        elif ev == "lost":
            self._mark_lost(f"watchdog on {self.host}: {msg.get('msg')}")
        elif ev == "bye":
            self.swept = int(msg.get("swept", 0))
            self._bye.set()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.hb_interval):
            self.send({"op": "hb"})
            silent = time.monotonic() - self._last_heard
            if silent > self.hb_timeout:
                self._mark_lost(f"host {self.host} stopped answering (no heartbeat for {silent:.1f}s)")
                return

    def _mark_lost(self, why: str) -> None:
        if self._bye.is_set() or self._stop.is_set():
            return
        if self.lost is None:
            self.lost = why
        for proc in self.procs.values():
            proc.finish(LOST_EXIT, why)  # writes the reason into its stderr first
            proc.close_all()

    # -- end --------------------------------------------------------------------------------
    def close(self, timeout: float) -> None:
        if self.lost is None:
            self.send({"op": "shutdown"})
            self._bye.wait(timeout)
        self._stop.set()
        for proc in self.procs.values():
            proc.close_all()
        with contextlib.suppress(Exception):
            self.chan.close()
        ssh.close(self.conn)
