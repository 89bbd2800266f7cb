"""The environment-variable contract between the launcher and the processes it starts.

This module is the single place where the names live, in both directions:
``build_env`` is what the launcher sets, ``NodeEnv.from_environ`` is what a node
(trainer_core, or any user program) reads back. ``docs/environment.md`` documents
every variable; a test checks that both directions agree.

It depends on nothing but the standard library and belongs to neither package: ``launchkit``
imports it to build the environment, ``trainer_core`` to read it back, and any other launcher
that sets the same variables (MXNet's ``tools/launch.py``, a job started by hand) is served just
as well. Settings that only the trainer reads (ps-lite's knobs, ``PS_SHM``...) live in
``trainer_core.config``. Nothing here has side effects on import.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

# --- MXNet / dmlc-core names (kept exactly, so real MXNet jobs run unchanged) ---
DMLC_ROLE = "DMLC_ROLE"
DMLC_PS_ROOT_URI = "DMLC_PS_ROOT_URI"
DMLC_PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
DMLC_NUM_SERVER = "DMLC_NUM_SERVER"
DMLC_NUM_WORKER = "DMLC_NUM_WORKER"
DMLC_NODE_HOST = "DMLC_NODE_HOST"
DMLC_TASK_ID = "DMLC_TASK_ID"
DMLC_JOB_CLUSTER = "DMLC_JOB_CLUSTER"
DMLC_INTERFACE = "DMLC_INTERFACE"

# --- launchkit additions ---
LAUNCHKIT_JOB_ID = "LAUNCHKIT_JOB_ID"
# HOST:PATH, the machine and LAUNCHKIT_HOME that record the job: whose job a process is, for
# ``launchkit kill --all`` in another home (launchkit.jobs.owner)
LAUNCHKIT_JOB_HOME = "LAUNCHKIT_JOB_HOME"
LAUNCHKIT_ROLE_RANK = "LAUNCHKIT_ROLE_RANK"
LAUNCHKIT_LOCAL_RANK = "LAUNCHKIT_LOCAL_RANK"
LAUNCHKIT_JOB_SECRET = "LAUNCHKIT_JOB_SECRET"
LAUNCHKIT_RESTART_COUNT = "LAUNCHKIT_RESTART_COUNT"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# host:port of the launcher's metrics endpoint (docs/metrics.md); unset when none is served
LAUNCHKIT_METRICS_ADDR = "LAUNCHKIT_METRICS_ADDR"
# Who serves DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT: unset, a scheduler process (launch.py's way);
# ROOT_IN_WORKER0, worker 0's own process (a job without servers: no scheduler process runs)
LAUNCHKIT_ROOT_SERVER = "LAUNCHKIT_ROOT_SERVER"
ROOT_IN_WORKER0 = "worker 0"
# MIN:MAX, set only in an elastic job (``launchkit launch -n MIN:MAX``): the workers may change
# while it runs, between MIN and MAX; DMLC_NUM_WORKER is then the count at this process's start
LAUNCHKIT_ELASTIC = "LAUNCHKIT_ELASTIC"
# The metrics figure (dmlc_env.telemetry) an elastic job's worker reports as 1 when it handles a
# change of membership in its own process (trainer_core's elastic API); the launcher then keeps the
# survivors running at a change. A worker that never reports it (a torch.distributed script) is
# restarted with the others at each change, as under torchrun.
ELASTIC_IN_PROCESS_FIGURE = "elastic.in_process"

# --- torchrun's names (torch.distributed's env://), every worker, counted over the workers ---
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"  # the worker's host index, as NODE_RANK
NODE_RANK = "NODE_RANK"
MASTER_ADDR = "MASTER_ADDR"  # worker 0's host
MASTER_PORT = "MASTER_PORT"  # a free port there for torch's TCP store (not DMLC_PS_ROOT_PORT)
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # the workers' hosts (torchrun's nnodes)
ROLE_RANK = "ROLE_RANK"  # the rank among the workers of its role: one role, so RANK
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"  # the workers of its role: WORLD_SIZE
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # the attempt, as LAUNCHKIT_RESTART_COUNT
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"  # --max-restarts
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # the job id (torchrun's --rdzv-id)
TORCH_VARS = (
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT,
    GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RUN_ID,
)  # fmt: skip
# torchrun's that a user may set (--env-worker): the launcher's value is a default
ROLE_NAME = "ROLE_NAME"  # torchrun's --role: "default"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where torch's @record writes a failure
TORCH_DEFAULTS = (ROLE_NAME, TORCHELASTIC_ERROR_FILE)
DEFAULT_ROLE_NAME = "default"

ROLES = ("scheduler", "server", "worker")

# Variables only the launcher sets: a user's --env or NAME=VALUE word must not override one (the
# role, ranks, address or identity of a process would then be wrong, and the job hang or a sweep
# miss it). LAUNCHKIT_ is the launcher's prefix: every name under it that reaches a process is
# the launcher's (its helpers': the rank shim, the batch runner), but for its own two settings.
LAUNCHER_SET = frozenset(
    {
        DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER,
        DMLC_NODE_HOST, DMLC_TASK_ID, DMLC_JOB_CLUSTER, DMLC_INTERFACE, LAUNCHKIT_JOB_ID,
        LAUNCHKIT_JOB_HOME, LAUNCHKIT_ROLE_RANK, LAUNCHKIT_LOCAL_RANK, LAUNCHKIT_JOB_SECRET, LAUNCHKIT_RESTART_COUNT,
        LAUNCHKIT_METRICS_ADDR, LAUNCHKIT_ROOT_SERVER, LAUNCHKIT_ELASTIC, *TORCH_VARS,
    }
)  # fmt: skip
LAUNCHER_SETTINGS = frozenset({"LAUNCHKIT_HOME", "LAUNCHKIT_DEBUG"})  # read by the launcher itself


def launcher_owned(name: str) -> bool:
    """Whether ``name`` is a variable the launcher sets in the job's processes (not the user)."""
    return name in LAUNCHER_SET or (name.startswith("LAUNCHKIT_") and name not in LAUNCHER_SETTINGS)


# Variables whose values must never be shown (dry-run plans, job records, logs).
SECRET_VARS = frozenset({LAUNCHKIT_JOB_SECRET})
SECRET_PLACEHOLDER = "<hidden>"


@dataclass(frozen=True)
class JobEnv:
    """What is the same for every process of a job."""

    job_id: str
    secret: str
    cluster: str  # backend name: local, ssh, mpi, sge, slurm, yarn
    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    interface: str | None = None
    restart_count: int = 0  # the attempt: 0 first, N after the Nth restart (--max-restarts)
    root_in_worker0: bool = False  # no scheduler process: worker 0 serves root_uri:root_port
    master_addr: str = ""  # torch's MASTER_ADDR: worker 0's host ("": its node fills it in)
    master_port: int = 0  # torch's MASTER_PORT (0: worker 0's node picks it)
    home: str = ""  # LAUNCHKIT_JOB_HOME: HOST:PATH of the job's record ("": not set)
    max_restarts: int = 0  # --max-restarts (TORCHELASTIC_MAX_RESTARTS)
    worker_hosts: int = 1  # the workers' hosts (GROUP_WORLD_SIZE)
    elastic: tuple[int, int] | None = None  # (MIN, MAX) workers of an elastic job; None: fixed


def format_elastic(bounds: tuple[int, int]) -> str:
    """``LAUNCHKIT_ELASTIC``'s value for (MIN, MAX)."""
    return f"{bounds[0]}:{bounds[1]}"


def parse_elastic(value: str) -> tuple[int, int]:
    """(MIN, MAX) from ``LAUNCHKIT_ELASTIC``'s ``MIN:MAX``; ValueError naming what was expected."""
    lo, sep, hi = value.partition(":")
    try:
        bounds = (int(lo), int(hi))
    except ValueError:
        bounds = (0, 0)
    if not sep or not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(
            f"environment variable {LAUNCHKIT_ELASTIC}={value!r}: expected MIN:MAX with 1 <= MIN <= MAX"
        )
    return bounds


@dataclass(frozen=True)
class TaskEnv:
    """What differs per process."""

    role: str
    role_rank: int
    task_id: int
    local_rank: int
    node_host: str
    cuda_visible_devices: str | None = None
    local_size: int = 1  # the workers on this worker's host (LOCAL_WORLD_SIZE)
    node_rank: int = 0  # this worker's host among the workers' hosts (GROUP_RANK, NODE_RANK)


def build_env(job: JobEnv, task: TaskEnv) -> dict[str, str]:
    """The contract variables for one process (pure; user ``--env`` values are merged by the caller)."""
    if task.role not in ROLES:
        raise ValueError(f"unknown role {task.role!r}")
    env = {
        DMLC_ROLE: task.role,
        DMLC_PS_ROOT_URI: job.root_uri,
        DMLC_PS_ROOT_PORT: str(job.root_port),
        DMLC_NUM_SERVER: str(job.num_servers),
        DMLC_NUM_WORKER: str(job.num_workers),
        DMLC_NODE_HOST: task.node_host,
        DMLC_TASK_ID: str(task.task_id),
        DMLC_JOB_CLUSTER: job.cluster,
        LAUNCHKIT_JOB_ID: job.job_id,
        LAUNCHKIT_ROLE_RANK: str(task.role_rank),
        LAUNCHKIT_LOCAL_RANK: str(task.local_rank),
        LAUNCHKIT_JOB_SECRET: job.secret,
        LAUNCHKIT_RESTART_COUNT: str(job.restart_count),
    }
    if job.interface:
        env[DMLC_INTERFACE] = job.interface
    if job.home:
        env[LAUNCHKIT_JOB_HOME] = job.home
    if task.cuda_visible_devices is not None:
        env[CUDA_VISIBLE_DEVICES] = task.cuda_visible_devices
    if job.root_in_worker0:
        env[LAUNCHKIT_ROOT_SERVER] = ROOT_IN_WORKER0
    if job.elastic is not None:
        env[LAUNCHKIT_ELASTIC] = format_elastic(job.elastic)
    if task.role == "worker":
        env.update(torch_env(job, task))
    return env


def torch_env(job: JobEnv, task: TaskEnv) -> dict[str, str]:
    """torchrun's variables for a worker, with torchrun's meanings: ranks over the workers only
    (servers and a scheduler are not torch's processes), one role (``ROLE_NAME`` "default", as
    torchrun's), its host's index and worker count, the hosts, where torch's TCP store is, the
    attempt and the restarts allowed, the job (torchrun's run id) and where torch's ``@record``
    writes the exception that ends it."""
    return {
        RANK: str(task.role_rank),
        WORLD_SIZE: str(job.num_workers),
        LOCAL_RANK: str(task.local_rank),
        LOCAL_WORLD_SIZE: str(task.local_size),
        GROUP_RANK: str(task.node_rank),
        NODE_RANK: str(task.node_rank),
        GROUP_WORLD_SIZE: str(job.worker_hosts),
        ROLE_NAME: DEFAULT_ROLE_NAME,
        ROLE_RANK: str(task.role_rank),
        ROLE_WORLD_SIZE: str(job.num_workers),
        MASTER_ADDR: job.master_addr,
        MASTER_PORT: str(job.master_port),
        TORCHELASTIC_RESTART_COUNT: str(job.restart_count),
        TORCHELASTIC_MAX_RESTARTS: str(job.max_restarts),
        TORCHELASTIC_RUN_ID: job.job_id,
        TORCHELASTIC_ERROR_FILE: error_file_of(job, task.role_rank),
    }


def error_file_of(job: JobEnv, rank: int) -> str:
    """Where worker ``rank``'s ``@record`` writes its exception (JSON) in this attempt: a file in
    ``/tmp`` (a directory every host has, so nothing need create it first), named by the job."""
    return f"/tmp/launchkit-{job.job_id}-attempt{job.restart_count}-worker{rank}-error.json"


# Set for every process unless the launcher's environment or the user already set them.
DEFAULTS = {PYTHONUNBUFFERED: "1"}


def merge_env(base: Mapping[str, str], task_env: Mapping[str, str]) -> dict[str, str]:
    """The full environment of a process: ``base`` (the launcher's, or the remote login's),
    then the defaults where unset, then the job's variables on top."""
    env = dict(base)
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)
    env.update(task_env)
    return env


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` safe to print or store."""
    return {k: (SECRET_PLACEHOLDER if k in SECRET_VARS else v) for k, v in env.items()}


@dataclass(frozen=True)
class NodeEnv:
    """The contract as a node reads it back (the other direction of ``build_env``)."""

    role: str
    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    node_host: str | None
    interface: str | None
    task_id: int | None
    cluster: str | None
    job_id: str | None
    role_rank: int | None
    local_rank: int | None
    secret: str | None
    restart_count: int | None = None
    root_server: str | None = None  # LAUNCHKIT_ROOT_SERVER: None, a scheduler process
    elastic: tuple[int, int] | None = None  # LAUNCHKIT_ELASTIC: (MIN, MAX) workers; None: fixed
    #: TORCHELASTIC_RESTART_COUNT: a worker's restarts of the workers (an elastic job's restart
    #: mode starts the whole group again with it one higher); None when unset
    worker_restarts: int | None = None

    @property
    def root_in_worker0(self) -> bool:
        """This job has no scheduler process: worker 0 serves the root address."""
        return self.root_server == ROOT_IN_WORKER0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> NodeEnv:
        """Read the contract; raises ``KeyError``/``ValueError`` naming the variable when it is broken."""
        e = os.environ if environ is None else environ

        def need(name: str) -> str:
            try:
                return e[name]
            except KeyError:
                raise KeyError(f"environment variable {name} is not set") from None

        def as_int(name: str, value: str | None) -> int | None:
            if value is None or value == "":
                return None
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None

        role = need(DMLC_ROLE)
        if role not in ROLES:
            raise ValueError(f"environment variable {DMLC_ROLE}={role!r}: expected one of {', '.join(ROLES)}")
        port = as_int(DMLC_PS_ROOT_PORT, need(DMLC_PS_ROOT_PORT))
        ns = as_int(DMLC_NUM_SERVER, need(DMLC_NUM_SERVER))
        nw = as_int(DMLC_NUM_WORKER, need(DMLC_NUM_WORKER))
        assert port is not None and ns is not None and nw is not None
        return cls(
            role=role,
            root_uri=need(DMLC_PS_ROOT_URI),
            root_port=port,
            num_servers=ns,
            num_workers=nw,
            node_host=e.get(DMLC_NODE_HOST) or None,
            interface=e.get(DMLC_INTERFACE) or None,
            task_id=as_int(DMLC_TASK_ID, e.get(DMLC_TASK_ID)),
            cluster=e.get(DMLC_JOB_CLUSTER) or None,
            job_id=e.get(LAUNCHKIT_JOB_ID) or None,
            role_rank=as_int(LAUNCHKIT_ROLE_RANK, e.get(LAUNCHKIT_ROLE_RANK)),
            local_rank=as_int(LAUNCHKIT_LOCAL_RANK, e.get(LAUNCHKIT_LOCAL_RANK)),
            secret=e.get(LAUNCHKIT_JOB_SECRET) or None,
            restart_count=as_int(LAUNCHKIT_RESTART_COUNT, e.get(LAUNCHKIT_RESTART_COUNT)),
            root_server=e.get(LAUNCHKIT_ROOT_SERVER) or None,
            elastic=parse_elastic(e[LAUNCHKIT_ELASTIC]) if e.get(LAUNCHKIT_ELASTIC) else None,
            worker_restarts=as_int(TORCHELASTIC_RESTART_COUNT, e.get(TORCHELASTIC_RESTART_COUNT)),
        )


_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (``DMLC_INTERFACE``; ``lo`` -> ``127.0.0.1``),
    or None when there is no such interface or it has no IPv4 address (Linux).

    The one lookup of the job: the launcher (the scheduler's address), the ssh hosts' watchdogs
    (which carry this module as source) and trainer_core's nodes (where they bind) all use it, so
    one ``DMLC_INTERFACE`` means the same address everywhere."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])
