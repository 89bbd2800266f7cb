"""``--launcher mpi``: one ``mpirun`` starts every server and worker (the scheduler runs here;
without servers there is none: worker 0 serves the rendezvous, see ``hostside/rendezvous.py``).

Open MPI, MPICH (Hydra) and Intel MPI are told apart from ``mpirun --version``. Rank r runs the
r-th task of ``rank_order``: tasks grouped by host, in the order the host list is given to
mpirun with each host's slot count, so MPI's by-slot mapping puts every task where launchkit's
placement put it. The job's variables travel by name (``-x NAME`` / ``-genvlist``), never by
value; the shim turns the MPI rank into the role and ranks. See docs/backends.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlc_env import merge_env
from launchkit.backends.engine import (
    STOP_SIGNALS,
    EngineBackend,
    EngineRun,
    PopenRun,
    engine_env,
    shim_argv,
)
from launchkit.backends.engineflags import NODE_PYTHON
from launchkit.backends.hostlists import mpi_hostfile
from launchkit.backends.mpiflavor import find_flavor, root_note, stop_signal
from launchkit.backends.ssh.options import CONNECTION_FLAGS, SshOptions, from_flags
from launchkit.backends.worker0file import forget_worker0, worker0_file
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag, fill
from launchkit.core.hostfile import format_host
from launchkit.core.spec import LOCALHOST, Host, LaunchSpec, Plan, Task
from launchkit.errors import UsageError
from launchkit.hostside import rendezvous, shim
from launchkit.hostside.netif import route_to


def rank_order(plan: Plan) -> list[Task]:
    """The servers and workers, grouped by host in order of first appearance."""
    tasks = [t for t in plan.tasks if t.role != "scheduler"]
    hosts = {name: i for i, name in enumerate(dict.fromkeys(t.host.name for t in tasks))}
    return sorted(tasks, key=lambda t: hosts[t.host.name])


def host_slots(ordered: Sequence[Task]) -> list[tuple[str, int]]:
    slots: list[tuple[str, int]] = []
    for t in ordered:
        if slots and slots[-1][0] == t.host.name:
            slots[-1] = (t.host.name, slots[-1][1] + 1)
        else:
            slots.append((t.host.name, 1))
    return slots


def rsh_args(opts: SshOptions, ordered: Sequence[Task]) -> list[str]:
    """ssh options for Open MPI's remote starts (``plm_rsh_args``); one user and port for all."""
    users = {t.host.user for t in ordered}
    ports = {t.host.port for t in ordered}
    if len(users) > 1 or len(ports) > 1:
        raise UsageError(
            "--launcher mpi: every host must use the same ssh user and port "
            f"(found users {sorted(str(u) for u in users)}, ports {sorted(str(p) for p in ports)})"
        )
    return opts.client_args(ports.pop() or opts.port, users.pop())


@dataclass(frozen=True)
class MpiOptions:
    mpirun: str = "mpirun"
    flavor: str = "openmpi"
    extra: tuple[str, ...] = ()  # --mpi-args, split
    interface: str | None = None
    as_root: bool = False
    python: str = sys.executable
    local: bool = False  # no hostfile: every rank on this machine
    grace: float = 5.0  # --grace-period: how long a rank may take to end after SIGTERM
    ends: str | None = None  # the launcher's directory for the shims' end marks (LAUNCHKIT_SHIM_ENDS)
    toward: str | None = None  # this machine's address toward the hosts (rendezvous.TOWARD_VAR)


def mpi_env(plan: Plan, opts: MpiOptions) -> dict[str, str]:
    """What every rank gets by name: the engine's variables, the grace period, and for Open MPI
    the shim's SIGUSR2-means-stop (mpirun forwards SIGUSR2 to every rank at once, while its own
    SIGTERM reaches them only after ``odls_base_sigkill_timeout``)."""
    env = engine_env(plan, rank_order(plan), opts.grace)
    env[rendezvous.WORKER0_VAR] = worker0_file(plan)  # worker 0's node picks torch's port there
    if opts.flavor == "openmpi":
        env[shim.NOTIFY_VAR] = "1"
    if opts.ends:
        env[shim.ENDS_VAR] = opts.ends
    if opts.toward:  # worker 0 publishes the address it reaches this machine through, not its name's
        env[rendezvous.TOWARD_VAR] = opts.toward
    return env


#: mpirun's echo of the signal the launcher sent it: the launcher already says it is ending the job
NOISE = re.compile(r"^mpirun: Forwarding signal \d+ to job$")
#: Hydra's farewell when the ranks ended on the SIGTERM the launcher sent (first line), and the
#: two lines that always follow it
HYDRA_ECHO = re.compile(r"^YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated \(signal 15\)$")
HYDRA_ECHO_REST = 2
#: How often the launcher looks for the shims' end marks in its directory, and how long a mark
#: there waits for the same mark in mpirun's stream (with the task's last lines, so counted from
#: the last line mpirun passed on) in a teardown, and else
ENDS_POLL, ENDS_HOLD, ENDS_HOLD_RUNNING = 0.05, 0.3, 2.0


def render(plan: Plan, opts: MpiOptions, ssh: SshOptions) -> list[str]:
    """The mpirun command line for the job. Pure: values of the job's variables never appear."""
    ordered = rank_order(plan)
    names = sorted(mpi_env(plan, opts))
    hosts = ",".join(f"{h}:{n}" for h, n in host_slots(ordered))
    cwd = ordered[0].cwd
    program = shim_argv(opts.python, ordered[0])
    if opts.flavor == "openmpi":
        argv = [opts.mpirun, "-np", str(len(ordered))]
        if opts.as_root:
            argv.append("--allow-run-as-root")
        argv += ["--host", hosts, "--map-by", "slot", "--bind-to", "none", "--oversubscribe"]
        # a failed rank ends the job through the launcher (root cause, grace period), not mpirun;
        # and an ending rank gets the grace period before orted's SIGKILL (default: 1 s)
        argv += ["--mca", "orte_abort_on_non_zero_status", "0"]
        argv += ["--mca", "odls_base_sigkill_timeout", str(math.ceil(opts.grace) + 2)]
        argv += ["--wdir", cwd]
        if not opts.local:
            argv += ["--mca", "plm_rsh_args", shlex.join(rsh_args(ssh, ordered))]
            argv += ["--mca", "plm_rsh_no_tree_spawn", "1"]
        if opts.interface:
            argv += ["--mca", "btl_tcp_if_include", opts.interface]
            argv += ["--mca", "oob_tcp_if_include", opts.interface]
        for name in names:
            argv += ["-x", name]
    else:  # Hydra: MPICH and Intel MPI
        argv = [opts.mpirun, "-n", str(len(ordered)), "-hosts", hosts, "-wdir", cwd]
        if opts.flavor == "mpich":
            # a failed rank ends the job through the launcher (root cause, grace period): Hydra
            # would SIGKILL the others at once and print its BAD TERMINATION banner
            argv.append("-disable-auto-cleanup")
        argv += ["-genvlist", ",".join(names)]
        if opts.interface:
            argv += ["-iface", opts.interface]
    return [*argv, *opts.extra, *program]


def check_hosts(hosts: Sequence[Host], ssh: SshOptions) -> None:
    """mpirun's host lists are ``name:slots``, and Open MPI splits ``plm_rsh_args`` at spaces
    without honouring quotes: refuse what would be misread."""
    for h in hosts:
        if ":" in h.name:
            where = f" (hostfile line {h.line})" if h.line else ""
            raise UsageError(
                f"--launcher mpi: host {h.name!r}{where}: IPv6 addresses cannot be given to mpirun's "
                "host list (HOST:SLOTS); use a host name"
            )
    for flag, value in (("-i/--identity", ssh.identity), ("--known-hosts", str(ssh.known_hosts_path()))):
        if value and any(c.isspace() for c in value):
            raise UsageError(
                f"--launcher mpi: {flag} {value!r}: Open MPI splits its ssh options at spaces; "
                "use a path without spaces"
            )


def signal_shim_of(command_pid: int, sig: int) -> None:
    """Signal the shim that started ``command_pid`` on this machine (its parent), if it still is one."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        ppid = int(Path(f"/proc/{command_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if b"launchkit.hostside.shim" in Path(f"/proc/{ppid}/cmdline").read_bytes():
            os.kill(ppid, sig)


def end_mark(data: bytes) -> tuple[int, bool] | None:
    """(code, stopped) from a shim's end mark (``shim.end_marks``); None for anything else."""
    frame = shim.parse_frame(data)
    fields = frame.fields() if frame is not None and frame.kind == "x" else []
    if not fields or not fields[0].isdigit():
        return None
    return int(fields[0]), fields[1:2] == ["1"]


class MpirunRun(PopenRun):
    """mpirun (or Hydra's mpiexec), and how a stop (SIGTERM, SIGINT, SIGHUP) reaches its ranks:
    Open MPI's mpirun gets SIGUSR2 (``stop_signal``). With every rank on this machine
    (``ranks_here``: their commands' pids), each rank's shim gets SIGTERM straight from the
    launcher first, since mpirun does not forward a signal once it is ending the job itself (a
    rank killed by a signal); and Hydra is not told at all: a SIGTERM to mpiexec makes it SIGKILL
    the ranks at once, which could reach a rank before its SIGTERM did (seen in 1 run in 6). It
    ends by itself once the ranks have, and the grace period's SIGKILL still reaches it."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        flavor: str,
        ranks_here: Callable[[], Iterable[int]] | None = None,
    ) -> None:
        super().__init__(argv, env, cwd, stop_signal(flavor))
        self.flavor = flavor
        self.ranks_here = ranks_here

    def signal(self, sig: int) -> None:
        if sig in STOP_SIGNALS and self.ranks_here is not None:
            for pid in self.ranks_here():
                signal_shim_of(pid, signal.SIGTERM)
            if self.flavor == "mpich":
                return
        super().signal(sig)


class MpiBackend(EngineBackend):
    name = "mpi"
    engine_label = "mpirun"
    own_flags = (
        EngineFlag("--mpirun", "The mpirun to use.", default="mpirun"),
        EngineFlag("--mpi-args", "Extra mpirun flags, one string.", default=""),
        NODE_PYTHON,
    )
    capabilities = Capabilities(
        options=frozenset({"options", "mpirun", "mpi_args", "node_python", "console"}),
        flags=(*CONNECTION_FLAGS, *own_flags),
        gives_hosts="the MPI hostfile",
        elastic="shrink",  # workers may leave; none can join a running allocation
    )

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        return {"options": from_flags(flags), **fill(cls.own_flags, flags)}

    @classmethod
    def given_hosts(cls, environ: Mapping[str, str]) -> tuple[str, list[Host]]:
        return mpi_hostfile(environ)

    def __init__(
        self,
        options: SshOptions | None = None,
        *,
        mpirun: str = "mpirun",
        mpi_args: str = "",
        node_python: str | None = None,
        console: object = None,
    ) -> None:
        super().__init__(console)
        self.ssh = options or SshOptions()
        self.mpirun = mpirun
        try:
            self.extra = tuple(shlex.split(mpi_args))
        except ValueError as exc:
            raise UsageError(f"--mpi-args {mpi_args!r}: {exc}") from None
        self.python = node_python or sys.executable
        self._flavor: str | None = None
        self._echo_left = 0  # lines of Hydra's farewell still to drop
        self.hosts: tuple[Host, ...] = ()
        self.ends: str | None = None  # see watch_ends

    def connect(self, spec: LaunchSpec) -> str | None:
        """Refuse what mpirun's host and ssh syntax cannot carry, before anything starts."""
        super().connect(spec)
        self.hosts = () if all(h == LOCALHOST for h in spec.hosts) else spec.hosts
        check_hosts(self.hosts, self.ssh)
        return None

    def record_info(self) -> dict[str, Any] | None:
        """The hosts and ssh options, so that ``launchkit kill`` can sweep them by job id too."""
        if not self.hosts:
            return None
        unique = list(dict.fromkeys(self.hosts))
        return {"hosts": [format_host(h) for h in unique], "ssh": dataclasses.asdict(self.ssh)}

    def options(self, plan: Plan) -> MpiOptions:
        if self._flavor is None:
            self._flavor = find_flavor(self.mpirun)
        local = all(t.host == LOCALHOST for t in plan.tasks)
        interface = next(
            (t.env.get("DMLC_INTERFACE") for t in plan.tasks if t.env.get("DMLC_INTERFACE")), None
        )
        return MpiOptions(
            mpirun=self.mpirun,
            flavor=self._flavor,
            extra=self.extra,
            interface=interface,
            as_root=os.geteuid() == 0,
            python=self.python,
            local=local,
            grace=self.grace,
            toward=None if local else route_to(plan.tasks[-1].host.name),
        )

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        return dict.fromkeys(spec.hosts, "")  # resolved on the node by the shim, as ssh does

    def describe(self, task: Task) -> list[str]:
        return list(task.argv) if task.role == "scheduler" else shim_argv(self.python, task)

    def describe_job(self, plan: Plan) -> list[list[str]]:
        check_hosts([t.host for t in plan.tasks if t.host != LOCALHOST], self.ssh)
        return [render(plan, self.options(plan), self.ssh)]

    def notes(self, plan: Plan) -> list[str]:
        note = root_note(self.options(plan).flavor)
        return [note] if note else []

    def prepare(self, plan: Plan) -> None:
        self.options(plan)  # the implementation, or a clear error, before anything starts
        super().prepare(plan)

    def engine_noise(self, text: str) -> bool:
        text = text.strip()
        if NOISE.match(text):
            return True
        if self.tearing_down and HYDRA_ECHO.match(text):
            self._echo_left = HYDRA_ECHO_REST
            return True
        if self._echo_left:
            self._echo_left -= 1
            return True
        return False

    def watch_ends(self, where: str) -> None:
        """Tasks end from the marks their shims left in ``where`` (``shim.end_marks``) when mpirun's
        stream has not brought them: mpirun stops passing output on while it ends the job itself
        (once it sees a rank killed by a signal) and then waits out odls_base_sigkill_timeout."""
        seen: dict[int, float] = {}
        while os.path.isdir(where) and not self._engine_ended.wait(ENDS_POLL):
            hold = ENDS_HOLD if self.tearing_down else ENDS_HOLD_RUNNING
            with contextlib.suppress(OSError):
                for name in filter(str.isdigit, os.listdir(where)):
                    proc = self.procs.get(int(name))
                    if proc is None or proc.finished:
                        continue
                    end = end_mark(Path(where, name).read_bytes())
                    since = max(seen.setdefault(int(name), time.monotonic()), proc.last_output)
                    if end and time.monotonic() - since >= hold:
                        proc.ended(*end, whole=True)
        shutil.rmtree(where, ignore_errors=True)

    def close(self) -> None:
        super().close()
        if self.ends:
            shutil.rmtree(self.ends, ignore_errors=True)
        if self.plan is not None:
            forget_worker0(worker0_file(self.plan))

    def make_run(self, plan: Plan) -> EngineRun:
        self.ends = tempfile.mkdtemp(prefix="launchkit-ends-")
        if self._cleanup_sink is not None:  # a launcher that is SIGKILLed leaves no directory behind
            self._cleanup_sink(["rm", "-rf", "--", self.ends, worker0_file(plan)])
        threading.Thread(target=self.watch_ends, args=(self.ends,), daemon=True).start()
        opts = dataclasses.replace(self.options(plan), ends=self.ends)
        argv = render(plan, opts, self.ssh)
        env = merge_env(os.environ, mpi_env(plan, opts))
        here = None if self.hosts else self.ranks_running
        return MpirunRun(argv, env, rank_order(plan)[0].cwd, opts.flavor, here)

    def ranks_running(self) -> list[int]:
        """The pids of the ranks' commands that have started and not ended."""
        return [p.pid for p in list(self.procs.values()) if p.pid is not None and not p.finished]
