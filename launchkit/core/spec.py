"""Frozen types: what to run (``LaunchSpec``), where each process goes (``Task``, ``Plan``),
and how it ended (``TaskResult``, ``JobResult``). Pure data, no behaviour beyond formatting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import dmlc_env


@dataclass(frozen=True)
class Host:
    """One line of a hostfile."""

    name: str
    port: int | None = None
    user: str | None = None
    slots: int | None = None
    line: int | None = None  # where it came from, for error messages

    @property
    def address(self) -> str:
        """``user@name`` as ssh wants it (no port)."""
        return f"{self.user}@{self.name}" if self.user else self.name

    def __str__(self) -> str:
        name = f"[{self.name}]" if ":" in self.name and self.port is not None else self.name
        text = f"{self.user}@{name}" if self.user else name
        return f"{text}:{self.port}" if self.port is not None else text


LOCALHOST = Host("localhost")


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the user asked for, after parsing and validation."""

    num_workers: int
    num_servers: int
    command: tuple[str, ...]
    backend: str = "local"
    hosts: tuple[Host, ...] = (LOCALHOST,)
    env: tuple[tuple[str, str], ...] = ()  # applied to every process
    env_server: tuple[tuple[str, str], ...] = ()
    env_worker: tuple[tuple[str, str], ...] = ()
    job_name: str | None = None
    log_dir: str | None = None
    sync_dst_dir: str | None = None
    sync_timeout: float = 900.0  # seconds for one host's rsync (--sync-timeout)
    gpus_per_worker: int | None = None
    scheduler_ip: str | None = None
    scheduler_port: int | None = None
    master_port: int | None = None  # torch's MASTER_PORT on worker 0's host (--master-port)
    interface: str | None = None
    grace_period: float = 5.0
    time_limit: float | None = None
    cwd: str = "."
    max_restarts: int = 0  # restarts of the whole job after a failure (--max-restarts)
    restart_backoff: float = 1.0  # seconds between a failed attempt and the next (--restart-backoff)
    elastic: tuple[int, int] | None = None  # -n MIN:MAX: the workers may change while it runs
    hostfile: str | None = None  # the hostfile, which an elastic job re-reads while it runs
    host_discovery: str | None = None  # --host-discovery-script: prints host:slots lines
    cool_down: float = 10.0  # --blacklist-cooldown: a host's first cool-down after a worker failed there


@dataclass(frozen=True)
class Task:
    """One process of a job: its role, ranks, host, environment and argv."""

    role: str  # scheduler, server, worker
    rank: int  # 0-based rank within the role
    task_id: int  # global index (DMLC_TASK_ID)
    host: Host
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # the variables launchkit sets (not the base env)
    cwd: str = "."

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}"


@dataclass(frozen=True)
class Plan:
    """A job ready to start: one scheduler (none without servers) plus servers and workers in
    placement order."""

    job_id: str
    job_name: str
    backend: str
    root_uri: str
    root_port: int
    tasks: tuple[Task, ...]  # the scheduler first (none without servers), then servers, then workers
    one_thread: int = 0  # the machines whose processes got OMP_NUM_THREADS=1 from the launcher
    job_env: dmlc_env.JobEnv | None = None  # what every process's contract came from (a later worker's too)
    elastic: tuple[int, int] | None = None  # -n MIN:MAX

    def by_role(self, role: str) -> list[Task]:
        return [t for t in self.tasks if t.role == role]


@dataclass(frozen=True)
class TaskResult:
    """How one process ended. ``exit_code`` follows the shell: 128+N when killed by signal N."""

    task: Task
    exit_code: int
    signal: int | None
    ended_at: float
    killed_by_launcher: bool = False
    tail: tuple[str, ...] = ()
    node: str | None = None  # where it ran, when the backend learned it (an engine's node)

    @property
    def where(self) -> str:
        return self.node or str(self.task.host)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class JobResult:
    """How the whole job ended."""

    job_id: str
    exit_code: int
    results: tuple[TaskResult, ...]
    root_cause: TaskResult | None = None
    interrupted_by: int | None = None  # signal number that stopped the launcher
    signalled: int | None = None  # a signal the launcher received, even during a teardown under way
    strays_killed: int = 0
    timed_out: bool = False  # ended by --time-limit
    attempt: int = 0  # which attempt ended so (LAUNCHKIT_RESTART_COUNT): 0 first
    named_by: TaskResult | None = None  # the process whose output named the root cause as failed
    # who waited for the root cause in what, as their output says ("workers 0 and 2 ... in allreduce (operation 3)")
    waited_by: str = ""
    changes: int = 0  # an elastic job's membership changes (its record has each)
