"""A real Grid Engine (Debian's gridengine 8.1.9) on this machine, for the `sge` backend's tests.

    from tests.cluster.sge import sge_local  # noqa: F401

    def test_submit(sge_local, tmp_path):
        r = sge_local.run(["qsub", "-sync", "y", "-b", "y", "true"])
        assert r.returncode == 0, r.stderr
        sge_local.wait_idle()

One qmaster and one execd run as children of the test process, on the Debian cell
(SGE_ROOT=/var/lib/gridengine, SGE_CELL=default, the standard ports 6444/6445), so the plain
`qsub`/`qstat`/`qdel`/`qacct` commands work from any process on the machine, with or without
`GridEngine.env`. The packages come from `scripts/install-gridengine.sh` (run by scripts/test.sh).

What `start()` does, each step skipped when what a previous run left is already right:

* kills Grid Engine daemons left by a crashed run (only processes named sge_qmaster/sge_execd);
* host_aliases `HOSTNAME localhost`: 127.0.0.1 resolves to `localhost`, not to the hostname that
  act_qmaster names, and qmaster would refuse the execd and the clients as unknown hosts;
* global config: `min_uid`/`min_gid` 0 (Debian's 1000 refuses root's jobs), accounting flushed
  at once (so `qacct -j ID` sees a job as soon as qstat no longer lists it);
* scheduler: a run every second and one second after each submit/finish;
* this host as exec and submit host, host group `@allhosts`, PE `smp` ($pe_slots), queue
  `all.q` with 8 slots on 2 cores and no load thresholds (so a 5-task array runs at once);
* starts sge_execd and waits until the queue instance is usable, then deletes leftover jobs.

The daemons get an init script's environment (PATH, LANG, SGE_ROOT, SGE_CELL, SGE_ND), not the
test's: jobs inherit the execd's environment, so only what the submitter passes (-v/-V) reaches a
job beyond that and SGE's own variables. Typical timings here: start 1-2 s (3 s after a crashed
run), `qsub -sync y` 1-2 s, qdel of a running job gone from qstat in about 1 s, stop about 2 s.

A machine that cannot run it (not root, packages missing) fails the tests that use the fixture
with the reason; they are never skipped. A machine-wide lock allows one such cluster at a time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .sshd import ClusterSetupError, require_commands, spawn_daemon, stop_process, tail

SGE_ROOT = Path("/var/lib/gridengine")
SGE_CELL = "default"
SPOOL = Path("/var/spool/gridengine")
QMASTER = "/usr/sbin/sge_qmaster"
EXECD = "/usr/sbin/sge_execd"
#: Commands the fixture needs, and the Debian package each comes from (scripts/install-gridengine.sh).
REQUIRED_COMMANDS = {
    QMASTER: "gridengine-master",
    EXECD: "gridengine-exec",
    "qconf": "gridengine-client",
    "qsub": "gridengine-client",
    "qstat": "gridengine-client",
    "qdel": "gridengine-client",
    "qacct": "gridengine-client",
}
QUEUE = "all.q"
PE = "smp"
HOSTGROUP = "@allhosts"
#: Slots of all.q: more than the 2 cores, so that a 5-task job runs all at once.
SLOTS = 8
DAEMON_NAMES = ("sge_qmaster", "sge_execd")
#: Seconds a qmaster gets to stop on SIGTERM before SIGKILL (a clean shutdown takes 6-9 s).
QMASTER_STOP_S = 1.0
DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LOCK_NAME = b"\0launchkit-test-gridengine"
TMP_PREFIX = "lk-sge-"

#: Settings of the global configuration (`qconf -sconf global`) that the fixture needs.
GLOBAL_CONF = {
    "min_uid": "0",
    "min_gid": "0",
    "reporting_params": (
        "accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00 "
        "accounting_flush_time=00:00:00"
    ),
}
#: Settings of the scheduler configuration (`qconf -ssconf`).
SCHED_CONF = {
    "schedule_interval": "0:0:1",
    "flush_submit_sec": "1",
    "flush_finish_sec": "1",
    # A job started on 2 cores must not count as load that blocks the next ones.
    "job_load_adjustments": "NONE",
    "load_adjustment_decay_time": "0:0:0",
}
#: An exec host's attributes besides `hostname` (qconf -Ae wants them all).
EXEC_HOST_CONF = {
    key: "NONE"
    for key in (
        "load_scaling",
        "complex_values",
        "user_lists",
        "xuser_lists",
        "projects",
        "xprojects",
        "usage_scaling",
        "report_variables",
    )
}
PE_CONF = {
    "pe_name": PE,
    "slots": "999",
    "user_lists": "NONE",
    "xuser_lists": "NONE",
    "start_proc_args": "NONE",
    "stop_proc_args": "NONE",
    "allocation_rule": "$pe_slots",
    "control_slaves": "TRUE",
    "job_is_first_task": "TRUE",
    "urgency_slots": "min",
    "accounting_summary": "FALSE",
    "qsort_args": "NONE",
}


def _queue_conf(host_group: str) -> dict[str, str]:
    """The all.q settings that differ from `qconf -sq`'s template."""
    return {
        "qname": QUEUE,
        "hostlist": host_group,
        "load_thresholds": "NONE",
        "pe_list": PE,
        "slots": str(SLOTS),
    }


def parse_conf(text: str) -> dict[str, str]:
    """`key value` lines as printed by `qconf -s...` (backslash continuations joined, comments dropped)."""
    conf: dict[str, str] = {}
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.strip().partition(" ")
        conf[key] = " ".join(value.split())
    return conf


def format_conf(conf: dict[str, str]) -> str:
    """The inverse of `parse_conf`, for `qconf -A.../-M...` files."""
    return "".join(f"{k:<24} {v}\n" for k, v in conf.items())


def _differs(current: dict[str, str], wanted: dict[str, str]) -> bool:
    return any(current.get(k) != " ".join(v.split()) for k, v in wanted.items())


def _proc_stat(pid: str) -> tuple[str, str, int]:
    """(comm, state, ppid) of a process, from /proc/PID/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    state, ppid = raw[raw.rindex(")") + 2 :].split()[:2]
    return comm, state, int(ppid)


def pids_named(names: tuple[str, ...]) -> list[int]:
    """Live (not zombie) processes whose name (/proc/PID/comm) is one of `names` exactly, any owner."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm, state, _ppid = _proc_stat(entry)
            except (OSError, ValueError):
                continue
            if comm in names and state not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def _children(parents: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if _proc_stat(entry)[2] in parents:
                    found.append(int(entry))
    return found


def _wait_gone(names: tuple[str, ...], pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while set(pids) & set(pids_named(names)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def kill_stale_daemons(timeout: float = 1.0) -> list[int]:
    """Stop sge_qmaster/sge_execd processes that a crashed run left; returns their pids.

    SIGTERM first, SIGKILL after `timeout` (GridEngine.stop says why that is safe). The daemons
    are children of the test process but switch to user sgeadmin, which clears PR_SET_PDEATHSIG,
    so a killed test run leaves them behind. Jobs such an execd left (sge_shepherd and its
    children) are found again by the next execd from its spool and ended by `qdel` after it starts.
    """
    pids = pids_named(DAEMON_NAMES)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if _wait_gone(DAEMON_NAMES, pids, timeout):
            break
    return pids


def kill_stray_jobs(timeout: float = 5.0) -> list[int]:
    """Wait for sge_shepherd processes (one per running job) to end; then SIGKILL them and their jobs.

    After `qdel` an execd ends its jobs within a second or two; shepherds that outlive that belong
    to no execd any more (their spool was lost) and would keep a crashed run's jobs running.
    """
    names = ("sge_shepherd",)
    shepherds = pids_named(names)
    if not shepherds or _wait_gone(names, shepherds, timeout):
        return []
    shepherds = pids_named(names)
    for child in _children(set(shepherds)):
        with contextlib.suppress(OSError):
            pgid = os.getpgid(child)  # each job runs in its own process group; never the test's
            if pgid not in (0, os.getpgrp()):
                os.killpg(pgid, signal.SIGKILL)
            os.kill(child, signal.SIGKILL)
    for pid in shepherds:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return shepherds


def _acquire_lock(timeout: float, name: bytes = _LOCK_NAME) -> socket.socket:
    """A machine-wide lock (abstract unix socket; the kernel frees it when the holder dies).

    Its name is scoped to the network namespace, as are Grid Engine's ports 6444/6445 that it
    guards: a chroot or container on the machine's network (scripts' fresh box) shares both with
    the machine's own test runs. The holder listens on it, so that a run that waits can name it.
    """
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            sock.listen(8)
            return sock
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise
            if time.monotonic() >= deadline:
                raise ClusterSetupError(
                    f"another test run holds the Grid Engine fixture for more than {timeout:g}s "
                    f"({lock_holder(name)}); only one can run per network namespace"
                ) from None
            time.sleep(0.1)


def lock_holder(name: bytes = _LOCK_NAME) -> str:
    """Who holds the lock ``name``: its pid and command line where this PID namespace sees it (the
    kernel's SO_PEERCRED of the listening socket), else what can be said."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(name)
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError as e:
        return f"its holder did not answer: {e}"
    finally:
        sock.close()
    if pid == os.getpid():
        return "held by this very process"
    if pid == 0:
        return (
            "held by a process outside this PID namespace: another test run on this machine, or in "
            "a chroot or container that shares its network"
        )
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = "?"
    return f"held by pid {pid} (uid {uid}): {cmdline.strip()[:300]}"


@dataclass
class GridEngine:
    """A running qmaster + execd on this host, with queue `all.q` (8 slots) and PE `smp`.

    Attributes: `root`/`cell` (SGE_ROOT, SGE_CELL), `queue`, `pe`, `host` (the exec host's name),
    `dir` (temp dir with the daemons' logs), `startup_s` (seconds `start()` took).
    """

    root: Path
    cell: str
    queue: str
    pe: str
    host: str
    dir: Path
    startup_s: float = 0.0
    qmaster: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    execd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock: socket.socket | None = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """Variables a client command (qsub, qstat, ...) needs; the commands are in /usr/bin."""
        return {"SGE_ROOT": str(self.root), "SGE_CELL": self.cell}

    @property
    def common(self) -> Path:
        """$SGE_ROOT/$SGE_CELL/common: act_qmaster, host_aliases, accounting."""
        return self.root / self.cell / "common"

    def run(self, argv: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a client command with `env` added (to os.environ, or to `env=` if given); text, captured.

        Other keywords go to subprocess.run (cwd, input, check...); stdin is /dev/null unless given.
        """
        env = {**(kw.pop("env", None) or os.environ), **self.env}
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout, **kw)

    def qconf(self, *args: str) -> str:
        """`qconf ARGS`; stdout, or ClusterSetupError with its output."""
        r = self.run(["qconf", *args])
        if r.returncode != 0:
            raise ClusterSetupError(f"qconf {' '.join(args)} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r.stdout

    def job_ids(self) -> list[str]:
        """Ids of the jobs qstat still lists (all users, any state), each once, in qstat's order."""
        r = self.run(["qstat", "-u", "*"])
        if r.returncode != 0:
            raise RuntimeError(f"qstat failed ({r.returncode}): {r.stderr}")
        ids: list[str] = []
        for line in r.stdout.splitlines():
            first = line.split(maxsplit=1)[0] if line.strip() else ""
            if first.isdigit() and first not in ids:
                ids.append(first)
        return ids

    def wait_idle(self, timeout: float = 10) -> None:
        """Wait until qstat lists no job; TimeoutError with `qstat -f` output otherwise."""
        deadline = time.monotonic() + timeout
        while self.job_ids():
            if time.monotonic() >= deadline:
                status = self.run(["qstat", "-f", "-u", "*"]).stdout
                raise TimeoutError(f"Grid Engine still lists jobs after {timeout:g}s:\n{status}")
            time.sleep(0.1)

    def delete_all_jobs(self) -> None:
        """`qdel -f` every job of every user (forced: also jobs whose execd is gone)."""
        if self.job_ids():
            self.run(["qdel", "-f", "-u", "*"])

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def start(cls, ready_timeout: float = 20.0, lock_timeout: float = 60.0) -> GridEngine:
        """Configure and start qmaster and execd (see the module docstring); ready to take jobs."""
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise ClusterSetupError(
                "the Grid Engine fixture must run as root (it starts sge_qmaster/sge_execd)"
            )
        require_commands(REQUIRED_COMMANDS)
        if not (SGE_ROOT / SGE_CELL / "common" / "bootstrap").exists():
            raise ClusterSetupError(
                f"{SGE_ROOT}/{SGE_CELL}/common/bootstrap is missing: the gridengine packages were installed "
                "without a cell; run `bash scripts/install-gridengine.sh`"
            )
        lock = _acquire_lock(lock_timeout)
        for stale in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):  # logs of crashed runs
            shutil.rmtree(stale, ignore_errors=True)
        self = cls(
            root=SGE_ROOT,
            cell=SGE_CELL,
            queue=QUEUE,
            pe=PE,
            host=socket.gethostname(),
            dir=Path(tempfile.mkdtemp(prefix=TMP_PREFIX)),
            _lock=lock,
        )
        try:
            kill_stale_daemons()
            self._write_host_files()
            self._start_qmaster(ready_timeout)
            self._configure()
            self._start_execd(ready_timeout)
            self.delete_all_jobs()
            self.wait_idle(ready_timeout)
            kill_stray_jobs()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _write_host_files(self) -> None:
        """act_qmaster names this host; host_aliases makes `localhost` (127.0.0.1's name) this host."""
        act = self.common / "act_qmaster"
        if (act.read_text().strip() if act.exists() else "") != self.host:
            act.write_text(f"{self.host}\n")
        aliases = self.common / "host_aliases"
        wanted = f"{self.host} localhost\n" if self.host != "localhost" else ""
        current = aliases.read_text() if aliases.exists() else ""
        if current != wanted:
            aliases.write_text(wanted)

    def _start_qmaster(self, timeout: float) -> None:
        log = self.dir / "qmaster.log"
        env = self._daemon_env()
        self.qmaster = self._spawn([QMASTER], log, env)
        deadline = time.monotonic() + timeout
        while True:
            if self.qmaster.poll() is not None:
                raise ClusterSetupError(
                    f"sge_qmaster exited with status {self.qmaster.returncode}; its log:\n{tail(log)}"
                    f"{self._spool_messages('qmaster')}"
                )
            r = self.run(["qconf", "-sh"], timeout=5)
            if r.returncode == 0:
                if self.host not in r.stdout.split():
                    raise ClusterSetupError(
                        f"this host ({self.host}) is no admin host of the Grid Engine cell (admin hosts: "
                        f"{r.stdout.split()}); was the hostname changed since the packages were installed? "
                        "`apt-get purge gridengine-*` and run scripts/install-gridengine.sh again"
                    )
                return
            if time.monotonic() >= deadline:
                raise ClusterSetupError(
                    f"sge_qmaster did not answer within {timeout:g}s: {r.stderr.strip()}; its log:\n{tail(log)}"
                )
            time.sleep(0.05)

    def _daemon_env(self) -> dict[str, str]:
        """The environment of qmaster and execd: what an init script gives them, not the test's.

        Jobs inherit the execd's environment (plus their own -v/-V variables and SGE's), so a
        variable the test process has must not reach a job unless the submitter passes it.
        SGE_ND keeps the daemons in the foreground (children of the test process); jobs see it too.
        """
        return {"PATH": DAEMON_PATH, "LANG": "C.UTF-8", **self.env, "SGE_ND": "1"}

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        saved = dict(os.environ)
        os.environ.clear()  # spawn_daemon passes os.environ on
        os.environ.update(env)
        try:
            return spawn_daemon(argv, log)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def _spool_messages(self, which: str) -> str:
        """The end of a daemon's own log (qmaster's, or execd's: in a directory named as it resolves
        its own host name, `localhost` here)."""
        paths = (
            [SPOOL / "qmaster" / "messages"] if which == "qmaster" else sorted(SPOOL.glob("execd/*/messages"))
        )
        return "".join(f"\n{path}:\n{tail(path)}" for path in paths if path.exists())

    def _apply(self, flag: str, name: str, conf: dict[str, str]) -> None:
        """Write `conf` to a file named `name` and load it with `qconf FLAG file`."""
        path = self.dir / "conf" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(format_conf(conf))
        self.qconf(flag, str(path))

    def _configure(self) -> None:
        """Bring the cell's configuration to what the fixture needs, changing only what differs."""
        glob = parse_conf(self.qconf("-sconf", "global"))
        if _differs(glob, GLOBAL_CONF):
            self._apply("-Mconf", "global", {**glob, **GLOBAL_CONF})
        sched = parse_conf(self.qconf("-ssconf"))
        if _differs(sched, SCHED_CONF):
            self._apply("-Msconf", "sched", {**sched, **SCHED_CONF})

        if self.host not in self.run(["qconf", "-sel"]).stdout.split():
            self._apply("-Ae", "exechost", {"hostname": self.host, **EXEC_HOST_CONF})
        if self.host not in self.run(["qconf", "-ss"]).stdout.split():
            self.qconf("-as", self.host)

        r = self.run(["qconf", "-shgrp", HOSTGROUP])
        hostgroup = {"group_name": HOSTGROUP, "hostlist": self.host}
        if r.returncode != 0:
            self._apply("-Ahgrp", "hostgroup", hostgroup)
        elif _differs(parse_conf(r.stdout), hostgroup):
            self._apply("-Mhgrp", "hostgroup", hostgroup)

        r = self.run(["qconf", "-sp", PE])
        if r.returncode != 0:
            self._apply("-Ap", PE, PE_CONF)
        elif _differs(parse_conf(r.stdout), PE_CONF):
            self._apply("-Mp", PE, {**parse_conf(r.stdout), **PE_CONF})

        queue = _queue_conf(HOSTGROUP)
        r = self.run(["qconf", "-sq", QUEUE])
        if r.returncode != 0:
            self._apply("-Aq", QUEUE, {**parse_conf(self.qconf("-sq")), **queue})
        elif _differs(parse_conf(r.stdout), queue):
            self._apply("-Mq", QUEUE, {**parse_conf(r.stdout), **queue})

    def _queue_states(self) -> str | None:
        """The state letters of QUEUE@host ('' when fine), or None while qstat does not list it."""
        r = self.run(["qstat", "-f", "-q", f"{self.queue}@{self.host}", "-u", "*"])
        for line in r.stdout.splitlines():
            parts = line.split()
            if parts and parts[0] == f"{self.queue}@{self.host}":
                return parts[5] if len(parts) > 5 else ""
        return None

    def _start_execd(self, timeout: float) -> None:
        log = self.dir / "execd.log"
        env = self._daemon_env()
        self.execd = self._spawn([EXECD], log, env)
        deadline = time.monotonic() + timeout
        states: str | None = None
        while True:
            if self.execd.poll() is not None:
                raise ClusterSetupError(
                    f"sge_execd exited with status {self.execd.returncode}; its log:\n{tail(log)}"
                    f"{self._spool_messages('execd')}"
                )
            states = self._queue_states()
            if states == "":
                return
            if time.monotonic() >= deadline:
                raise ClusterSetupError(
                    f"queue {self.queue}@{self.host} not usable {timeout:g}s after sge_execd started "
                    f"(states {states!r}); execd log:\n{tail(log)}{self._spool_messages('execd')}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Delete all jobs, stop execd and qmaster; the cell's configuration stays for the next run.

        A clean qmaster shutdown takes 6-9 s (its threads end one by one, a second each), so it
        gets SIGKILL after one second: it opens its Berkeley DB spool with DB_RECOVER, and a
        killed qmaster restarts with its configuration (and any committed job) intact.
        """
        try:
            if self.qmaster is not None and self.qmaster.poll() is None:
                with contextlib.suppress(TimeoutError, RuntimeError, subprocess.TimeoutExpired):
                    self.delete_all_jobs()
                    self.wait_idle(5)
            kill_stray_jobs()
        finally:
            if self.execd is not None and self.execd.poll() is None:
                self.execd.terminate()  # takes about a second: overlap it with qmaster's
            if self.qmaster is not None:
                stop_process(self.qmaster, timeout=QMASTER_STOP_S)
            if self.execd is not None:
                stop_process(self.execd)
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def sge_local() -> Iterator[GridEngine]:
    """A real Grid Engine cell on this host for the whole session: queue all.q (8 slots), PE smp."""
    try:
        engine = GridEngine.start()
    except ClusterSetupError as e:
        pytest.fail(f"sge_local: {e}", pytrace=False)
    yield engine
    engine.stop()
