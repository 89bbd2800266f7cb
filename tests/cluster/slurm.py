"""A real Slurm 22.05 cluster for tests: munged, slurmctld and slurmd(s) as children of the test process.

Two shapes (see /work/shared/CLUSTER.md for how they were found to work):

- `SlurmCluster.start_local()`: one node `localhost` (CPUs=2) on the real machine.
- `SlurmCluster.start_netns(n)`: nodes `node1..nodeN` at 10.231.N.(10+i), one per namespace host of a
  `HostGroup` (shared /tmp) on the process's subnet. slurmctld runs in the root namespace at the
  bridge's address, 10.231.N.1; each slurmd runs
  inside its host's network, PID, mount, UTS and IPC namespaces, so a job's processes on nodeK
  are in nodeK's process table only.

Every cluster has its own state dir /run/lkslurm/<tag>/ (mode 755) with slurm.conf, the munge key
and socket, spool and state dirs, pid files and logs. Clients need only `SLURM_CONF` (see
`SlurmCluster.env`): slurm.conf names the munge socket (`AuthInfo=socket=...`). Accounting is
off (no sacct): follow jobs with `squeue` and `scontrol show job`.

A cluster holds a lock (an abstract unix socket named after its tag) while alive; daemons and
state dirs under /run/lkslurm/ whose lock nobody holds are leftovers of a crashed run, and
`sweep_stale()` (called by every start) kills those daemons and removes their dirs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .netns import HOST_ENV, HostGroup, NetnsHost, _parent_pids
from .sshd import ClusterSetupError, require_commands, spawn_daemon, stop_process, tail

STATE_ROOT = Path("/run/lkslurm")
#: Commands the Slurm fixtures need, and the Debian package each comes from.
SLURM_COMMANDS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "srun": "slurm-client",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "nsenter": "util-linux",
}
#: Daemons a crashed run may leave behind (process names, /proc/PID/comm, maybe with Debian's "-wlm").
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
#: A submitted batch job starts in about 0.7s with these (several seconds with the defaults).
SCHEDULER_PARAMETERS = "sched_interval=1,batch_sched_delay=0,sched_min_interval=0"
#: Seconds a finished job stays known to `scontrol show job` (JobState, ExitCode) at least.
#: slurmctld purges old jobs only every max(10, MinJobAge) seconds, so in practice a finished
#: job is visible for MIN_JOB_AGE to MIN_JOB_AGE + 10 seconds.
MIN_JOB_AGE = 5
_TAG_RE = re.compile(rf"{re.escape(str(STATE_ROOT))}/([A-Za-z0-9_.-]+)")

# Runs inside a namespace host before slurmd: `ip netns exec` gave the host a fresh sysfs with an
# empty /sys/fs/cgroup, and slurmd's cgroup/v1 plugin refuses to start unless
# /sys/fs/cgroup/systemd is a cgroup mount. A private named hierarchy (no controllers) is enough
# with proctrack/linuxproc and task/none; it lives in the host's mount namespace only.
_NODE_CGROUP_SH = (
    "mountpoint -q /sys/fs/cgroup/systemd || { "
    "mount -t tmpfs -o mode=755 lk-cgroup /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o none,name=lkslurm lk-cgroup /sys/fs/cgroup/systemd; }"
)


# -- liveness lock and sweep ----------------------------------------------------------------------


def _lock_name(tag: str) -> bytes:
    return f"\0launchkit-test-slurm-{tag}".encode()


def _take_lock(tag: str) -> socket.socket | None:
    """Bind the tag's abstract socket: the kernel frees it when the holder dies. None if held."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec: daemons don't keep it
    try:
        sock.bind(_lock_name(tag))
    except OSError as e:
        sock.close()
        if e.errno != errno.EADDRINUSE:
            raise
        return None
    return sock


def _is_live(tag: str) -> bool:
    """Whether a live process holds the cluster `tag`."""
    sock = _take_lock(tag)
    if sock is None:
        return True
    sock.close()
    return False


def _proc_tags(pid: str) -> set[str]:
    """Tags of /run/lkslurm/<tag>/ paths in a process's command line or environment."""
    found: set[str] = set()
    for part in ("cmdline", "environ"):
        with contextlib.suppress(OSError):
            data = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
            found.update(_TAG_RE.findall(data))
    return found


def _stale_daemons() -> list[int]:
    """PIDs of Slurm/munge daemons that belong to a cluster dir nobody holds."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            comm = Path(f"/proc/{name}/comm").read_text().strip()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if comm.removesuffix("-wlm") not in DAEMONS or state in (b"Z", b"X"):
            continue
        tags = _proc_tags(name)
        if tags and not any(_is_live(t) for t in tags):
            pids.append(int(name))
    return pids


def sweep_stale() -> list[str]:
    """Kill daemons and remove state dirs under /run/lkslurm/ that no live cluster holds.

    Only processes named like a Slurm/munge daemon whose command line or environment points into
    /run/lkslurm/<tag>/ are touched (never a job's own processes). Returns what was removed.
    """
    removed = []
    pids = _stale_daemons()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        removed.append(f"pid {pid}")
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.02)
    if STATE_ROOT.is_dir():
        for d in STATE_ROOT.iterdir():
            if d.is_dir() and not _is_live(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"dir {d}")
    return removed


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


# -- configuration --------------------------------------------------------------------------------


def _free_port(exclude: frozenset[int] = frozenset()) -> int:
    """A TCP port free on all addresses (slurmctld and slurmd bind INADDR_ANY), not in `exclude`."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


def write_slurm_conf(
    path: Path,
    *,
    state_dir: Path,
    controller: str,
    nodes: dict[str, str],
    ctld_port: int,
    slurmd_port: int,
) -> Path:
    """Write slurm.conf for `nodes` (NodeName -> NodeAddr): root everywhere, munge through the
    cluster's own socket, no accounting, no cgroup confinement (proctrack/linuxproc, task/none),
    short timeouts so tests run fast, and a partition that lets jobs share CPUs."""
    d = state_dir
    lines = [
        f"ClusterName=lk{d.name.replace('-', '')[:20]}",
        f"SlurmctldHost={controller}",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge.socket.2'}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # Fast: nodes declared down after 10s of silence, 5s per message, SIGKILL 2s after
        # SIGTERM on cancel, no srun liveness limit, finished jobs purged after 5-15s.
        "SlurmdTimeout=10",
        "MessageTimeout=5",
        "KillWait=2",
        "InactiveLimit=0",
        f"MinJobAge={MIN_JOB_AGE}",
        f"SchedulerParameters={SCHEDULER_PARAMETERS}",
        *(f"NodeName={name} NodeAddr={addr} CPUs=2 State=UNKNOWN" for name, addr in nodes.items()),
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _env_argv(env: dict[str, str]) -> list[str]:
    """`env -i K=V ...`: start a daemon with exactly `env` (spawn_daemon passes ours otherwise)."""
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items())]


# -- the cluster ----------------------------------------------------------------------------------


@dataclass
class SlurmCluster:
    """A running Slurm cluster. Run clients with `run()` or with `env` added to the environment."""

    dir: Path
    conf: Path
    nodes: list[str]
    addresses: list[str]
    hosts: HostGroup | None = None
    #: Seconds from the start call to every node idle.
    startup_s: float = 0.0
    _lock: socket.socket | None = field(default=None, repr=False)
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client command needs on top of the usual environment."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (`srun`, `sbatch`, ...) with `env` added; text output captured.
        Keyword arguments go to subprocess.run (an `env` given there is added to os.environ too)."""
        env = {**os.environ, **kw.pop("env", {}), **self.env}
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)

    def job_ids(self, *, finished: bool = False) -> list[str]:
        """IDs of the jobs squeue lists: by default those not finished yet (pending, running,
        completing, ...); with `finished=True` also finished ones slurmctld still remembers."""
        states = ["--states=all"] if finished else []
        proc = self.run(["squeue", "--noheader", *states, "--format=%i"], timeout=15)
        if proc.returncode != 0:
            raise RuntimeError(f"squeue failed: {proc.stderr.strip()}")
        return proc.stdout.split()

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo's long state (`idle`, `allocated`, `mixed`, `down*`, ...)."""
        proc = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=15)
        if proc.returncode != 0:
            raise RuntimeError(f"sinfo failed: {proc.stderr.strip()}")
        return dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())

    def _idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    def wait_idle(self, timeout: float = 10) -> None:
        """Wait until squeue lists no unfinished job and every node is idle; else raise TimeoutError."""
        if _poll(lambda: not self.job_ids() and self._idle(), timeout):
            return
        squeue = self.run(["squeue", "--states=all"]).stdout
        sinfo = self.run(["sinfo", "--Node", "--long"]).stdout
        raise TimeoutError(f"Slurm cluster not idle after {timeout:g}s\nsqueue:\n{squeue}\nsinfo:\n{sinfo}")

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def start_local(cls) -> SlurmCluster:
        """One node `localhost` (CPUs=2) on the real machine; returns once it is idle."""
        return cls._start(
            "local", nodes=["localhost"], addresses=["127.0.0.1"], controller="localhost", hosts=None
        )

    @classmethod
    def start_netns(cls, n: int = 3) -> SlurmCluster:
        """Nodes node1..nodeN (CPUs=2 each) in namespace hosts; slurmctld at the bridge's address."""
        require_commands(SLURM_COMMANDS)
        hosts = HostGroup.create(n, private_tmp=False)
        try:
            controller = f"{socket.gethostname().split('.')[0]}({hosts.bridge_address})"
            return cls._start(
                "netns",
                nodes=[h.name for h in hosts],
                addresses=[h.address for h in hosts],
                controller=controller,
                hosts=hosts,
            )
        except BaseException:
            hosts.close()
            raise

    @classmethod
    def _start(
        cls, kind: str, *, nodes: list[str], addresses: list[str], controller: str, hosts: HostGroup | None
    ) -> SlurmCluster:
        if os.geteuid() != 0:
            raise ClusterSetupError("the Slurm test cluster needs root (SlurmUser=root, munged, namespaces)")
        require_commands(SLURM_COMMANDS)
        t0 = time.monotonic()
        sweep_stale()
        tag = f"{kind}-{secrets.token_hex(3)}"
        lock = _take_lock(tag)
        assert lock is not None, f"fresh tag {tag} is taken"
        STATE_ROOT.mkdir(mode=0o755, exist_ok=True)
        os.chmod(STATE_ROOT, 0o755)
        d = STATE_ROOT / tag
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)  # munged refuses a socket dir that group/others can write
        self = cls(dir=d, conf=d / "slurm.conf", nodes=nodes, addresses=addresses, hosts=hosts, _lock=lock)
        try:
            self._setup(controller)
            self.startup_s = time.monotonic() - t0
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        return self

    def _setup(self, controller: str) -> None:
        d = self.dir
        (d / "state").mkdir()
        for node in self.nodes:
            (d / "spool" / node).mkdir(parents=True)
        ctld_port = _free_port()
        write_slurm_conf(
            self.conf,
            state_dir=d,
            controller=controller,
            nodes=dict(zip(self.nodes, self.addresses, strict=True)),
            ctld_port=ctld_port,
            slurmd_port=_free_port(exclude=frozenset({ctld_port})),
        )
        self._start_munged()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for i, node in enumerate(self.nodes):
            if self.hosts is None:
                argv = ["slurmd", "-D", "-f", str(self.conf), "-N", node]
                if not os.path.ismount("/sys/fs/cgroup"):
                    # a machine (or container) without a cgroup mount: slurmd's cgroup plugin
                    # refuses to start, so give it the same private named hierarchy as the
                    # namespace nodes, in a mount namespace of its own
                    script = f"{_NODE_CGROUP_SH} && exec {shlex.join(argv)}"
                    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
                self._spawn(f"slurmd-{node}", argv)
            else:
                self._spawn_in_host(self.hosts[i], node)
        self._wait_ready(timeout=10 + 0.5 * len(self.nodes))

    def _daemon_env(self) -> dict[str, str]:
        return {**HOST_ENV, "SLURM_CONF": str(self.conf)}

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._daemons[name] = spawn_daemon([*_env_argv(self._daemon_env()), *argv], self.dir / f"{name}.out")

    def _spawn_in_host(self, host: NetnsHost, node: str) -> None:
        """Start slurmd inside `host`'s namespaces (PID namespace included) as node `node`."""
        assert host.pid is not None
        script = f"{_NODE_CGROUP_SH} && exec slurmd -D -f {self.conf} -N {node}"
        nsenter = ["nsenter", "-t", str(host.pid), "-n", "-p", "-m", "-u", "-i", "-r", "-w", "--"]
        self._spawn(f"slurmd-{node}", [*nsenter, "sh", "-c", script])

    def _start_munged(self) -> None:
        d = self.dir
        key = d / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        socket_path = d / "munge.socket.2"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--socket={socket_path}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
        )
        if not _poll(lambda: socket_path.exists() or not self._all_running(), 5) or not self._all_running():
            raise ClusterSetupError(self._failure("munged did not create its socket within 5s"))

    def _all_running(self) -> bool:
        return all(p.poll() is None for p in self._daemons.values())

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            if not self._all_running():
                return True
            try:
                return self._idle()
            except RuntimeError:  # slurmctld not answering yet
                return False

        if not _poll(ready, timeout) or not self._all_running():
            raise ClusterSetupError(self._failure(f"Slurm nodes {self.nodes} not idle within {timeout:g}s"))

    def _failure(self, what: str) -> str:
        """`what`, plus which daemons exited and the end of their logs."""
        parts = [what]
        for name, proc in self._daemons.items():
            status = "running" if proc.poll() is None else f"exited with status {proc.returncode}"
            parts.append(f"-- {name}: {status}")
        for log in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            text = tail(log, 800).strip()
            if text:
                parts.append(f"-- {log.name}:\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, stop slurmd(s), slurmctld and munged, close the namespace hosts and
        remove the state dir. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._daemons.get("slurmctld") is not None and self._all_running():
                with contextlib.suppress(Exception):
                    if ids := self.job_ids():
                        self.run(["scancel", "--full", *ids], timeout=10)
                    # KillWait=2: slurmstepd sends SIGKILL 2s after SIGTERM, then exits.
                    _poll(lambda: not self._steps(), 5)
            if self.hosts is not None:
                # Each slurmd's Popen is nsenter, which does not pass signals on: stop its child.
                children = _parent_pids()
                for name, proc in self._daemons.items():
                    for pid in children.get(proc.pid, []) if name.startswith("slurmd-") else []:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
            order = sorted(self._daemons, key=lambda n: (not n.startswith("slurmd-"), n == "munged"))
            for name in order:
                stop_process(self._daemons[name])
            if self.hosts is not None:
                self.hosts.close()  # kills whatever is left in the hosts' PID namespaces
            for pid in self._steps():  # slurmstepd outlives slurmd: one that ignored scancel
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _steps(self) -> list[int]:
        """Live slurmstepd processes of this cluster (any PID namespace; pids as the machine sees them)."""
        pids = []
        for name in os.listdir("/proc"):
            if name.isdigit() and _alive(int(name)) and self.dir.name in _proc_tags(name):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{name}/comm").read_text().strip() == "slurmstepd":
                        pids.append(int(name))
        return pids


def _poll(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Call `predicate` until it is true or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
