"""The launcher's side of one remote host: an ssh connection and the watchdog running there.

``HostAgent`` starts ``launchkit.hostside.watchdog`` over the connection (sending its source and
the hostside modules it imports, ``SHIPPED``), on a session of the fabric connection's paramiko
transport, then multiplexes every process of that host over that one channel: spawn, signal,
heartbeats, output.
Each remote process appears to the supervisor as a ``RemoteProcess`` whose stdout/stderr are
local pipes fed from the channel, so output handling is the same as for local processes.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shlex
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import dmlc_env
from dmlc_env.telemetry import finite_number, whole_number
from launchkit.backends.ssh import LOST_EXIT
from launchkit.backends.ssh import connection as ssh
from launchkit.backends.ssh.feed import Feeder, Pipe
from launchkit.core.spec import Host, Task
from launchkit.errors import BackendError
from launchkit.hostside import childio, hoststat, netif, procscan, watchdog

WINDOW = 1 << 21  # bytes of one stream's output in flight (sent by the watchdog, not yet delivered)
#: What the host runs, in import order: the watchdog last, after the hostside modules it imports
#: (a test checks that nothing it imports is missing).
SHIPPED = (dmlc_env, procscan, netif, hoststat, childio, watchdog)


#: Where a host's figures and its job processes' usage go: (host, figures, {pid: (cpu %, rss)}).
UsageSink = Callable[[str, dict[str, float], dict[int, tuple[float | None, int]]], None]


def usage_of(hb: dict[str, Any]) -> tuple[dict[str, float], dict[int, tuple[float | None, int]]]:
    """The figures and per-process usage a watchdog's heartbeat carries (checked, never trusted:
    what is not a number is left out)."""
    host = hb.get("host")
    figures = (
        {k: v for k, v in host.items() if isinstance(k, str) and finite_number(v)}
        if isinstance(host, dict)
        else {}
    )
    procs: dict[int, tuple[float | None, int]] = {}
    for row in hb.get("procs") or []:
        if isinstance(row, list) and len(row) == 3 and whole_number(row[0]) and whole_number(row[2]):
            procs[row[0]] = (float(row[1]) if finite_number(row[1]) else None, row[2])
    return figures, procs


def spawns_message(tasks: list[Task], ids: list[int]) -> dict[str, Any]:
    """The ``spawns`` instruction for ``tasks`` (with ids ``ids``): the environment entries every
    one of them has alike go once, in ``env``; each entry carries the rest of its own."""
    envs = [dict(t.env) for t in tasks]
    common = (
        {k: v for k, v in envs[0].items() if all(e.get(k, _MISSING) == v for e in envs[1:])} if envs else {}
    )
    procs = [
        {
            "id": i,
            "argv": list(t.argv),
            "env": {k: v for k, v in e.items() if k not in common},
            "cwd": t.cwd,
            "node_host": True,
        }
        for i, t, e in zip(ids, tasks, envs, strict=True)
    ]
    return {"op": "spawns", "env": common, "procs": procs}


_MISSING = object()


def bootstrap_payload() -> bytes:
    """The modules the watchdog needs, as the BOOTSTRAP command reads them from stdin."""
    body = json.dumps({m.__name__: inspect.getsource(m) for m in SHIPPED}).encode()
    return str(len(body)).encode() + b"\n" + body


def start_seen(stderr: str, lost: str | None) -> str:
    """What a host showed of a watchdog that did not start: its stderr's last lines, else that
    its channel closed, else that nothing came (a slow or loaded host: a longer --start-timeout)."""
    detail = " / ".join(line.strip() for line in stderr.strip().splitlines()[-5:] if line.strip())[-500:]
    if detail:
        return f"its stderr: {detail}; is python3 there?"
    if lost is not None:
        return f"{lost} with nothing on its stderr; is python3 there?"
    return "no answer and nothing on its stderr (a loaded host may need a longer --start-timeout)"


def remote_command(python: str = "python3") -> str:
    """The watchdog's command line on the host. ``-S``: no ``site`` (the watchdog is standard
    library only), 6 of the 43 ms of CPU its start took here, on every host."""
    return shlex.join([python, "-S", "-u", "-c", watchdog.BOOTSTRAP])


class _Stream:
    """One output stream of a remote process: a local pipe that the supervisor reads, fed by its
    host's ``Feeder`` (one thread for every stream of the host; ``feed.py``)."""

    def __init__(self, proc: RemoteProcess, name: str) -> None:
        self.proc = proc
        r, w = os.pipe()  # (widened by the output merger that reads it)
        self.reader: IO[bytes] = os.fdopen(r, "rb")
        self._pipe = Pipe(w, proc.index, name)
        self._closed = False

    def put(self, data: bytes, acked: bool) -> None:
        if not self._closed:
            self.proc.agent.feeder.put(self._pipe, data, acked)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.proc.agent.feeder.close(self._pipe)


class RemoteProcess:
    def __init__(self, agent: HostAgent, index: int, task: Task) -> None:
        self.agent = agent
        self.index = index
        self.task = task
        self.pid: int | None = None
        self._streams = {"o": _Stream(self, "o"), "e": _Stream(self, "e")}
        self.stdout: IO[bytes] = self._streams["o"].reader
        self.stderr: IO[bytes] = self._streams["e"].reader
        self._done = threading.Event()
        self._finishing = threading.Lock()  # the channel's reader and a lost host's heartbeat
        self._rc = 0
        self._on_exit: list[Callable[[int], None]] = []
        self.started = threading.Event()

    def feed(self, stream: str, data: bytes, acked: bool = True) -> None:
        """Output for one stream (``acked``: output the watchdog counts against its window)."""
        s = self._streams.get(stream)
        if s is not None:
            s.put(data, acked)

    def close_stream(self, stream: str) -> None:
        s = self._streams.get(stream)
        if s is not None:
            s.close()

    def finish(self, rc: int, note: str | None = None) -> None:
        """The process ended with ``rc`` (the first call counts: an exit and a lost connection
        may come at once, from two threads)."""
        with self._finishing:
            if self._done.is_set():
                return
            if note:
                self.feed("e", f"launchkit: {note}\n".encode(), acked=False)
            self._rc = rc
            self._done.set()
            calls, self._on_exit = self._on_exit, []
        self.started.set()
        for call in calls:
            call(rc)

    def on_exit(self, call: Callable[[int], None]) -> None:
        """``call(returncode)`` once the process has ended: now if it has, else from ``finish``."""
        with self._finishing:
            if not self._done.is_set():
                self._on_exit.append(call)
                return
        call(self._rc)

    def close_all(self) -> None:
        for s in list(self._streams):
            self.close_stream(s)

    @property
    def done(self) -> bool:
        """It has ended (or its host was lost)."""
        return self._done.is_set()

    def wait(self) -> int:
        self._done.wait()
        return self._rc

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():
            self.agent.send({"op": "signal", "id": self.index, "sig": int(sig)})


class HostAgent:
    def __init__(
        self,
        host: Host,
        conn: Any,
        job_id: str,
        *,
        hb_interval: float,
        hb_timeout: float,
        grace: float,
        interface: str | None,
        time_limit: float | None = None,
        on_usage: UsageSink | None = None,
    ) -> None:
        self.host = host
        self.conn = conn  # an open fabric.Connection: its paramiko transport carries the channel
        self.job_id = job_id
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.grace = grace
        self.interface = interface
        self.time_limit = time_limit
        self.on_usage = on_usage
        self.procs: dict[int, RemoteProcess] = {}  # changed and iterated under _table
        self._table = threading.Lock()
        self.chan: Any = None
        self.info: dict[str, Any] = {}
        self.lost: str | None = None
        self.lost_at: float | None = None  # (time.monotonic()) when it was lost
        self.swept = 0
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._bye = threading.Event()
        self._last_heard = time.monotonic()
        self._stop = threading.Event()
        self._stderr = bytearray()
        self.feeder = Feeder(self._ack, name=f"feed-{host}")

    def _ack(self, acks: list[tuple[int, str, int]]) -> None:
        self.send({"op": "acks", "a": acks})

    # -- start ------------------------------------------------------------------------------
    def start(self, timeout: float, start_timeout: float | None = None) -> None:
        """Open the channel (within ``timeout``, ``--connect-timeout``) and start the watchdog
        (its ``ready`` within ``start_timeout``, ``--start-timeout``: a python3 that starts slowly
        on a loaded host); raises BackendError (with the real reason: how long it waited, what it
        saw) and closes what it opened when that fails."""
        bound = timeout if start_timeout is None else start_timeout
        try:
            self.chan = self.conn.transport.open_session(timeout=timeout)
            self.chan.exec_command(remote_command())
            self.chan.sendall(bootstrap_payload())
            self._out = self.chan.makefile("rb")
        except Exception as exc:  # paramiko raises SSHException, EOFError, socket errors...
            self._abandon()
            why = str(exc) or type(exc).__name__
            raise BackendError("ssh", f"{self.host}: cannot start the watchdog: {why}") from None
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
                "window": WINDOW,
            }
        )
        if not self._ready.wait(bound):
            saw = start_seen(self._stderr.decode(errors="replace"), self.lost)
            self._abandon()
            raise BackendError(
                "ssh",
                f"{self.host}: the watchdog did not start within {bound:g} s (--start-timeout): {saw}",
            )
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _abandon(self) -> None:
        self._stop.set()
        if self.chan is not None:
            with contextlib.suppress(Exception):
                self.chan.close()
        ssh.close(self.conn)

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            try:
                if self.chan is None:
                    raise OSError("no channel")
                self.chan.sendall(data)
            except (OSError, EOFError) as exc:
                self._mark_lost(f"connection to {self.host} failed: {exc}")

    # -- processes --------------------------------------------------------------------------
    def spawn(self, index: int, task: Task, wait: bool = True) -> RemoteProcess:
        """Ask the watchdog to start ``task``; ``wait``: until it has (its pid), at most 10 s."""
        proc = self.add(index, task)
        self.send_spawns([proc])
        if wait:
            proc.started.wait(10.0)
        return proc

    def add(self, index: int, task: Task) -> RemoteProcess:
        """``task``'s process, to be started by ``send_spawns`` (ended at once if the host is lost)."""
        proc = RemoteProcess(self, index, task)
        with self._table:
            self.procs[index] = proc
        if self.lost:
            proc.finish(LOST_EXIT, self.lost)
            proc.close_all()
        return proc

    def send_spawns(self, procs: list[RemoteProcess]) -> None:
        """Ask the watchdog to start ``procs`` in one message (``spawns``: the environment they
        share once, each its own part): one message a host, not one a process."""
        procs = [p for p in procs if not p.done]
        if procs and not self.lost:
            self.send(spawns_message([p.task for p in procs], [p.index for p in procs]))

    # -- channel ----------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            for line in iter(self._out.readline, b""):
                self._last_heard = time.monotonic()
                try:
                    msg = json.loads(line)
                    if msg.get("ev") == "out":  # the line says how many raw bytes follow it
                        msg["data"] = self._out.read(int(msg["n"]))
                    self._dispatch(msg)
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
        with self._table:
            proc = self.procs.get(msg.get("id", -1))
        if ev == "out" and proc:
            proc.feed(msg["s"], msg["data"])
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
        elif ev == "hb" and self.on_usage is not None and "host" in msg:
            self.on_usage(str(self.host), *usage_of(msg))
        elif ev == "lost":
            self._mark_lost(f"watchdog on {self.host}: {msg.get('msg')}")
        elif ev == "bad":  # it could not read an instruction of ours (a spawn, a signal): the two
            # ends disagree on the protocol, and what that instruction was for will never happen
            self._mark_lost(
                f"protocol error with the watchdog on {self.host}: it could not read an instruction "
                f"from the launcher ({str(msg.get('msg'))[:300]}); ending the job's processes there"
            )
            with contextlib.suppress(Exception):  # its end of the channel: it ends them all
                self.chan.close()
        elif ev == "bye":
            self.swept = int(msg.get("swept", 0))
            self._bye.set()

    @property
    def confirmed(self) -> bool:
        """Its watchdog said ``bye``: it swept the job from its host at its teardown (``swept``)."""
        return self._bye.is_set()

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
            self.lost, self.lost_at = why, time.monotonic()
        with self._table:
            procs = list(self.procs.values())
        for proc in procs:
            proc.finish(LOST_EXIT, why)  # writes the reason into its stderr first
            proc.close_all()

    # -- end --------------------------------------------------------------------------------
    def close(self, timeout: float) -> None:
        if self.lost is None and self.chan is not None:
            self.send({"op": "shutdown"})
            self._bye.wait(timeout)
        self._stop.set()
        with self._table:
            procs = list(self.procs.values())
        for proc in procs:
            proc.close_all()
        self._abandon()
