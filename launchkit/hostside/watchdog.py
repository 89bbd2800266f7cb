"""The watchdog that runs a job's processes on one remote host.

The launcher sends this module, with the modules it imports (``childio``, ``procscan``,
``hoststat``, ``netif``, ``dmlc_env``; the list is ``launchkit.backends.ssh.agent.SHIPPED``), over its ssh connection and runs it with
the host's ``python3``: nothing is installed on the host. It speaks JSON lines over the ssh
channel (see docs/ssh.md, "watchdog protocol"): the launcher sends ``hello``, then ``spawns``
(a host's processes in one message), ``signal``, ``acks`` (output delivered), ``hb``
(heartbeat) and ``shutdown``; the watchdog answers ``ready``, ``started``, ``error``,
``out``/``eof`` (output: a JSON line with the length, then that many raw bytes; ``childio``),
``exit``, ``hb`` (with the host's figures and its job processes' usage, ``hoststat``) and
``bye``.

Every process runs in its own session; the environment arrives in the ``spawns`` message, so
it never shows on a command line and needs no ``AcceptEnv`` from sshd. The watchdog ends all of
them (SIGTERM, grace, SIGKILL, then a sweep by job id for grandchildren) when its channel
closes, when the launcher's heartbeats stop (a cut link closes nothing), when told to, or when
the job's deadline passes. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from launchkit.hostside.childio import ChildIO, encode
from launchkit.hostside.hoststat import Latest

#: seconds the watchdog's last words (``lost``, ``bye``) may take to be written before it gives up
#: on them and ends (a cut link takes nothing more)
SAY_WAIT = 5.0

TYPE_CHECKING = False  # (``typing`` is not imported at the start: 2 ms of each host's CPU)
if TYPE_CHECKING:
    from typing import IO, Any


def reached_address() -> str | None:
    """The address this host was reached at (the server side of the ssh connection)."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else None


def process_dir(cwd: str | None) -> str | None:
    """The directory a process starts in: ``~`` or ``~user`` at the start of ``cwd`` is that home
    on this host, as the host's shell expanded it for rsync (``--sync-dst-dir '~/x'``); a relative
    ``cwd`` is relative to the watchdog's own, the login directory, as rsync's is. None: the
    watchdog's own."""
    if not cwd:
        return None
    return os.path.expanduser(cwd) if cwd.startswith("~") else cwd


class Watchdog:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.children: dict[int, subprocess.Popen[bytes]] = {}  # changed and read under `table`
        self.table = threading.Lock()
        self.io = ChildIO(self._write)  # the processes' output and ends (one thread)
        self.last_heard = time.monotonic()
        self.job_id = ""
        self.hb_interval = 1.0
        self.hb_timeout = 10.0
        self.grace = 3.0
        self.deadline: float | None = None
        self.node_host: str | None = None
        self.ifaces: dict[str, str | None] = {}  # the interface toward each MASTER_ADDR (gloo's, NCCL's)
        self.stopping = threading.Event()
        self.usage: Latest | None = None  # the host's figures, sampled in its own thread

    # -- output to the launcher -------------------------------------------------------------
    def send(self, msg: dict[str, Any], payload: bytes = b"") -> None:
        self._write(encode(msg, payload))

    def send_many(self, msgs: list[dict[str, Any]]) -> None:
        """Several messages in one write (one ssh packet, one wake of the launcher's reader)."""
        self._write(b"".join(encode(m) for m in msgs))

    def _write(self, data: bytes) -> None:
        with self.lock:
            try:
                self.out.write(data)
                self.out.flush()
            except (OSError, ValueError):
                self.stopping.set()

    # -- children ---------------------------------------------------------------------------
    def _spawn(self, msg: dict[str, Any], base: dict[str, str]) -> tuple[int, subprocess.Popen[bytes]] | None:
        """Start one process of a ``spawns`` batch, its environment ``base`` with the entry's own
        ``env`` over it; None if it could not start (said)."""
        ident = int(msg["id"])
        env = dict(base)
        env.update({str(k): str(v) for k, v in msg.get("env", {}).items()})
        if msg.get("node_host") and self.node_host:
            env["DMLC_NODE_HOST"] = self.node_host
        if env.get("MASTER_ADDR") and env.get("DMLC_ROLE") == "worker":  # (netif: imported for workers only)
            from launchkit.hostside.netif import socket_ifnames

            socket_ifnames(env, self.ifaces)
        started: subprocess.Popen[bytes] | None = None
        error = {"ev": "error", "id": ident, "code": 126, "msg": "the job is ending"}
        with self.table:  # (no write under it: the teardown takes it, and a write may wait)
            if not self.stopping.is_set():
                started, error = self._start(ident, msg, env)
        if started is None:
            self.send(error)
            return None
        return ident, started

    def _started(self, procs: list[tuple[int, subprocess.Popen[bytes]]]) -> None:
        """Their ``started`` in one write (before any of their output), then their output and end
        handed to ``io``."""
        self.send_many([{"ev": "started", "id": ident, "pid": proc.pid} for ident, proc in procs])
        for ident, proc in procs:
            self.io.add(ident, proc)

    def spawns(self, msg: dict[str, Any]) -> None:
        """A batch: every process of this host in one message (``procs``), the environment they
        share sent once (``env``); each is started, and answered (``started`` or ``error``), on
        its own."""
        procs = msg["procs"]
        if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
            raise TypeError("spawns: procs is not a list of objects")
        base = dict(os.environ)
        base.setdefault("PYTHONUNBUFFERED", "1")
        base.update({str(k): str(v) for k, v in msg.get("env", {}).items()})
        started = [s for s in (self._spawn(entry, base) for entry in procs) if s is not None]
        if started:
            self._started(started)

    def _start(
        self, ident: int, msg: dict[str, Any], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes] | None, dict[str, Any]]:
        """The process started (in ``children``), or None and the ``error`` to answer."""
        try:
            proc = subprocess.Popen(
                [str(a) for a in msg["argv"]],
                env=env,
                cwd=process_dir(msg.get("cwd")),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            program = str(msg["argv"][0]) if msg.get("argv") else ""
            where = f" (PATH={env.get('PATH', '')})" if code == 127 and "/" not in program else ""
            why = f"{exc.strerror or exc}: {exc.filename or ''}{where}"
            return None, {"ev": "error", "id": ident, "code": code, "msg": why}
        self.children[ident] = proc
        return proc, {}

    def signal(self, ident: int, sig: int) -> None:
        with self.table:
            proc = self.children.get(ident)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    # -- lifecycle ----------------------------------------------------------------------------
    def hello(self, msg: dict[str, Any]) -> None:
        self.job_id = str(msg["job"])
        self.hb_interval = float(msg.get("hb_interval", 1.0))
        self.hb_timeout = float(msg.get("hb_timeout", 10.0))
        self.grace = float(msg.get("grace", 3.0))
        window = msg.get("window")
        self.io.window = int(window) if window else None
        limit = msg.get("time_limit")
        self.deadline = time.monotonic() + float(limit) if limit else None
        iface = msg.get("interface")
        if iface:  # (imported here: without --interface the host never compiles it)
            from launchkit.hostside.netif import interface_address

            self.node_host = interface_address(iface) or reached_address()
        else:
            self.node_host = reached_address()
        if self.usage is None:
            self.usage = Latest(self._groups, every=max(self.hb_interval, 1.0)).start()
        self.send(
            {
                "ev": "ready",
                "pid": os.getpid(),
                "hostname": os.uname().nodename,  # (gethostname(2); no ``socket`` to import)
                "node_host": self.node_host,
                "python": sys.version.split()[0],
            }
        )

    def reader(self, inp: IO[bytes]) -> None:
        for line in iter(inp.readline, b""):
            self.last_heard = time.monotonic()
            try:
                msg = json.loads(line)
                op = msg.get("op")
                if op == "hello":
                    self.hello(msg)
                elif op == "spawns":
                    self.spawns(msg)
                elif op == "acks":  # the streams' delivered output: [[id, stream, n], ...]
                    for ident, name, n in msg["a"]:
                        self.io.ack(int(ident), str(name), int(n))
                elif op == "signal":
                    self.signal(int(msg["id"]), int(msg["sig"]))
                elif op == "shutdown":
                    break
            except (ValueError, KeyError, TypeError) as exc:
                self.send({"ev": "bad", "msg": f"{type(exc).__name__}: {exc}"})
        self.stopping.set()

    def _groups(self) -> list[int]:
        """The process groups of the job's processes here (each leads its own session)."""
        with self.table:
            return [p.pid for p in self.children.values() if p.returncode is None]

    def beat(self) -> dict[str, Any]:
        """A heartbeat, with the latest sample of the host and of the job's processes here (taken
        by ``usage``'s thread: a slow ``nvidia-smi`` never delays a heartbeat)."""
        usage = self.usage
        if usage is None:
            return {"ev": "hb"}
        procs = [
            [pid, None if cpu is None else round(cpu, 1), rss] for pid, (cpu, rss) in usage.procs.items()
        ]
        return {"ev": "hb", "host": usage.figures, "procs": procs}

    def heartbeats(self) -> None:
        """Send a heartbeat every interval (a write that may wait: see ``watch``)."""
        while not self.stopping.wait(self.hb_interval):
            self.send(self.beat())

    def ending(self) -> str | None:
        """Why the job must end here now: the launcher silent for ``hb_timeout`` s, or the job's
        deadline passed; None while neither."""
        if time.monotonic() - self.last_heard > self.hb_timeout:
            return f"no heartbeat from the launcher for {self.hb_timeout:g}s"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "the job's time limit passed"
        return None

    def watch(self) -> None:
        """Until the watchdog stops: every heartbeat interval, end the job if ``ending`` says so.

        It never writes to the channel itself (``lost`` goes through ``say``): on a cut link the
        channel stops taking output (the ssh window and the pipe to sshd fill up), a write of the
        heartbeat or of a process's output then waits for good, and the check of the launcher's
        silence must not wait behind it."""
        while not self.stopping.wait(self.hb_interval):
            why = self.ending()
            if why is not None:
                self.stopping.set()
                self.say({"ev": "lost", "msg": why}, timeout=1.0)  # (the teardown waits for it)

    def say(self, msg: dict[str, Any], timeout: float = SAY_WAIT) -> bool:
        """``msg`` written within ``timeout`` s, or given up (a channel that takes nothing more);
        the write goes on in a thread of its own, ended with the watchdog."""
        writer = threading.Thread(target=self.send, args=(msg,), daemon=True)
        writer.start()
        writer.join(timeout)
        return not writer.is_alive()

    def teardown(self) -> int:
        from launchkit.hostside.procscan import remove_shm, sweep_job  # (at the end: not at each start)

        if self.usage is not None:
            self.usage.stop.set()
        with self.table:  # no spawn after this (stopping is set): the table is final
            children = list(self.children.values())
        self.io.stop()
        live = [p for p in children if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + self.grace
        while time.monotonic() < end and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        swept = sweep_job(self.job_id, self.grace) if self.job_id else 0
        if self.job_id:
            remove_shm(self.job_id)
        # Their ends and last output are written before ``bye`` (the io thread reports them
        # after their reaping above; a process's pipe held by a stranger is waited for no longer).
        self.io.drain(max(self.grace, 1.0))
        return swept


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    dog = Watchdog(sys.stdout.buffer)
    threading.Thread(target=dog.reader, args=(sys.stdin.buffer,), daemon=True).start()
    threading.Thread(target=dog.heartbeats, daemon=True).start()
    dog.watch()
    swept = dog.teardown()
    dog.say({"ev": "bye", "swept": swept})
    os._exit(0)


# The command the launcher runs over ssh: it reads a JSON object {module name: source} from
# stdin (a length line first) and runs main() of this module. Each module is compiled when it is
# first imported (a finder over that object), so what the start does not need (the sweep's
# ``procscan`` and ``pathlib``, ``netif`` without --interface) costs nothing on each host until it
# is needed. No file is written.
BOOTSTRAP = (
    "import sys,json\n"
    "from importlib.machinery import ModuleSpec\n"
    "n=int(sys.stdin.buffer.readline())\n"
    "mods=json.loads(sys.stdin.buffer.read(n))\n"
    "class Shipped:\n"
    "    def find_spec(self,name,path=None,target=None):\n"
    "        if name in mods or name in ('launchkit','launchkit.hostside'):\n"
    "            return ModuleSpec(name,self,origin='<'+name+'>',is_package=name not in mods)\n"
    "    def create_module(self,spec):\n"
    "        return None\n"
    "    def exec_module(self,m):\n"
    "        if m.__name__ in mods:\n"
    "            exec(compile(mods[m.__name__],'<'+m.__name__+'>','exec'),m.__dict__)\n"
    "sys.meta_path.insert(0,Shipped())\n"
    "import launchkit.hostside.watchdog\n"
    "sys.modules['launchkit.hostside.watchdog'].main()\n"
)

if __name__ == "__main__":
    main()
