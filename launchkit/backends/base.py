"""What a backend provides. The supervisor owns the orchestration (output, failure, teardown);
a backend only fills in a few hooks: prepare the hosts, start one process, close."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import IO, Any, ClassVar, Protocol

from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import fill
from launchkit.core.spec import Host, LaunchSpec, Plan, Task


class CleanupSink(Protocol):
    """Where a backend sends the commands its reaper must run if the launcher dies
    (``jobs.reaper.Cleanups.add``); ``ends_job``: the command ends the job's processes where they
    run (an engine's cancel), so that, once it has succeeded, their end is known."""

    def __call__(self, argv: list[str], *, ends_job: bool = False) -> None: ...


class ProcessHandle(Protocol):
    """One started process, as the supervisor sees it."""

    task: Task
    pid: int | None
    stdout: IO[bytes]
    stderr: IO[bytes]

    def wait(self) -> int:
        """Block until it ends; Popen convention (negative N when killed by signal N)."""
        ...

    def send_signal(self, sig: int) -> None:
        """Signal the process and everything in its process group."""
        ...


class Backend:
    """Base class of launch backends. Subclasses set ``name`` and ``capabilities`` (what they
    can do: the launcher asks it, never the name) and implement ``start``."""

    name = "base"
    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        """Its constructor's keyword options from ``launchkit launch``'s flags (``flags``: each
        flag's value by name, given or its default), checked (UsageError). The default: each flag
        of ``capabilities.flags`` fills the constructor keyword it names."""
        return fill(cls.capabilities.flags, flags)

    @classmethod
    def allocation_hosts(cls, flags: Mapping[str, Any]) -> tuple[Host, ...]:
        """Where the job goes when ``capabilities.hosts`` is "allocation" (from its flags)."""
        raise NotImplementedError

    @classmethod
    def given_hosts(cls, environ: Mapping[str, str]) -> tuple[str, list[Host]]:
        """``launchkit hosts list --from NAME`` (``capabilities.gives_hosts``): where the hosts
        of the job this runs in came from, and the hosts."""
        raise NotImplementedError

    def describe(self, task: Task) -> list[str]:
        """The command line that would start ``task`` (for ``--dry-run``); default: its argv."""
        return list(task.argv)

    def connect(self, spec: LaunchSpec) -> str | None:
        """Contact the hosts before planning (fail fast). Returns the local address through
        which they are reached, if the backend knows it."""
        return None

    def finds_scheduler_address(self) -> bool:
        """True when the job itself picks the scheduler's address and port (a batch job)."""
        return False

    def scheduler_summary(self, root_uri: str, port: int) -> str:
        """Where the scheduler is, for the launch's first line."""
        return f"scheduler {root_uri}:{port}"

    def worker0_ports(self, spec: LaunchSpec) -> tuple[str, int, int] | None:
        """Worker 0's address and two free ports on its host (the rendezvous's of a job without
        servers, torch's ``MASTER_PORT``), when the launcher learns them before planning (ssh);
        None when this machine is worker 0's (local) or worker 0's node picks them (an engine)."""
        return None

    def reached_name(self, host: Host) -> str:
        """The name or address the backend reaches ``host`` at: the hostfile's name, or for ssh
        its ssh config's ``HostName`` (an alias's real host)."""
        return host.name

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        """``DMLC_NODE_HOST`` per host when not the hostfile's names ("" : the node finds it)."""
        return None

    def prepare(self, plan: Plan) -> None:
        """Check hosts, sync code, open connections. Raise LaunchkitError to stop the launch."""

    def watch(self, handle: ProcessHandle, ended: Callable[[int], None]) -> None:
        """Have ``ended(returncode)`` called once ``handle``'s process has ended (from any thread).
        The default is a thread per process that waits for it; a backend that learns of an end
        from a thread of its own (ssh) calls back from there, with no thread per process."""
        threading.Thread(target=lambda: ended(handle.wait()), daemon=True).start()

    def set_cleanup_sink(self, sink: CleanupSink) -> None:
        """Where to send commands that must run if the launcher dies (the reaper runs them)."""

    def status(self) -> str:
        """What the job is waiting on outside its processes (an engine's queue), for the
        dashboard's header; empty when nothing."""
        return ""

    def set_host_sink(self, sink: Callable[..., None]) -> None:
        """Where to send the figures a remote host's sampler reports (the metrics endpoint's
        ``host_report``); backends without remote samplers ignore it."""

    def describe_job(self, plan: Plan) -> list[list[str]]:
        """Engine command lines that start the whole job (``--dry-run``); none by default."""
        return []

    def notes(self, plan: Plan) -> list[str]:
        """What the backend adds on its own and the user should know (``--dry-run``)."""
        return []

    def start(self, task: Task) -> ProcessHandle:
        """Start one process; raise OSError when the command cannot be started."""
        raise NotImplementedError

    def add_host(self, host: Host) -> None:
        """An elastic job may start workers on ``host``, which it did not use at its start: make
        it ready as ``prepare`` did the others (ssh: connect, sync, start its watchdog);
        LaunchkitError when it cannot. Default: nothing to do (local's one host)."""

    def send_starts(self) -> None:
        """After ``start`` was called for each task: a backend that queues its starts sends them
        now (ssh: one message per host). Default: nothing, ``start`` started the process."""

    def watchdog_timeout(self) -> float | None:
        """How long a host's watchdog goes on after it lost the launcher (its heartbeat timeout),
        for backends with watchdogs on the hosts (ssh); None otherwise."""
        return None

    def await_started(self) -> None:
        """After every process was asked to start: wait (bounded) until each has started, so that
        its pid is known, for the job record. Default: ``start`` returned a started process."""

    def record_info(self) -> dict[str, Any] | None:
        """What ``launchkit kill`` needs later to reach this job's hosts (stored in the job record);
        a read, after ``await_started``."""
        return None

    def wait_ended(self, timeout: float) -> None:
        """After every process reported its end: wait (bounded) for the backend's own helpers
        (an engine's mpirun or srun) to exit, so the final sweep does not count them as strays."""

    def close(self) -> None:
        """Release connections (after every process has ended)."""
