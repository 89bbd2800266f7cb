"""Turn a ``LaunchSpec`` into a ``Plan``: every process with its host, ranks, env and argv. Pure."""

from __future__ import annotations

import dataclasses
import re
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

import dmlc_env
from launchkit.core.capabilities import Capabilities
from launchkit.core.placement import Slot, gpu_slice, machine_key, place
from launchkit.core.spec import Host, LaunchSpec, Plan, Task


def render_argv(command: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The command as launch.py runs it: one word containing spaces runs under ``sh -c``
    (the seeds quote whole command lines as one string); otherwise an exact argv, no shell."""
    if len(command) == 1 and any(c.isspace() for c in command[0]):
        return ("sh", "-c", command[0])
    return tuple(command)


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_assignments(
    command: tuple[str, ...] | list[str],
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Leading ``NAME=VALUE`` words set variables, as launch.py's shell (and ``env``) does:
    ``PS_VERBOSE=1 python3 train.py`` -> ((PS_VERBOSE, 1),), (python3, train.py)."""
    words = list(command)
    pairs: list[tuple[str, str]] = []
    while len(words) > 1 and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        pairs.append((name, value))
    return tuple(pairs), tuple(words)


def default_job_name(command: tuple[str, ...] | list[str]) -> str:
    """A readable name from the command: the first ``*.py`` script, else the program."""
    words = list(command)
    if len(words) == 1:
        words = words[0].split()
    name = next((PurePath(w).stem for w in words if w.endswith(".py")), None)
    if name is None:
        name = PurePath(words[0]).name if words else "job"
    # shown by ps, the dashboard and every message: a control character in a script's name
    # (a newline, an escape sequence) is written escaped, never sent to the terminal
    return name if name.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def new_job_id() -> str:
    """Sortable by start time, unique enough to find a job's processes by it."""
    return time.strftime("%m%d-%H%M%S-") + secrets.token_hex(3)


def new_secret() -> str:
    return secrets.token_hex(32)


#: the scheduler process of an elastic job runs trainer_core's scheduler, not the job's command:
#: membership is served whatever the workers run (a torch.distributed script never sees
#: ``DMLC_ROLE=scheduler``); launchkit names the module and does not import it (docs/elastic.md)
ELASTIC_SCHEDULER_MODULE = "trainer_core.ps.scheduler"


def elastic_scheduler_argv(python: str) -> tuple[str, ...]:
    """The command of an elastic job's scheduler process, run by the interpreter ``python``."""
    return (python, "-m", ELASTIC_SCHEDULER_MODULE)


def has_scheduler(spec: LaunchSpec, caps: Capabilities) -> bool:
    """Whether the job runs a scheduler process: with servers, or on a backend where worker 0
    does not serve the root of a job without servers (``caps.root_in_worker0``: YARN still runs
    a scheduler, docs/backends.md), or in an elastic job (membership cannot depend on a worker)."""
    return spec.num_servers > 0 or not caps.root_in_worker0 or spec.elastic is not None


def worker_hosts(
    slots: list[Slot],
) -> tuple[dict[tuple[str, int | None], int], dict[tuple[str, int | None], int]]:
    """Per machine of the workers: how many workers it runs (``LOCAL_WORLD_SIZE``) and its index
    in the order of the workers' ranks (``GROUP_RANK``/``NODE_RANK``: worker 0's machine is 0)."""
    size: dict[tuple[str, int | None], int] = {}
    index: dict[tuple[str, int | None], int] = {}
    for s in sorted((s for s in slots if s.role == "worker"), key=lambda s: s.rank):
        key = machine_key(s.host)
        size[key] = size.get(key, 0) + 1
        index.setdefault(key, len(index))
    return size, index


OMP_NUM_THREADS = "OMP_NUM_THREADS"


def host_counts(slots: list[Slot]) -> dict[tuple[str, int | None], int]:
    """The processes (servers and workers) each machine runs."""
    counts: dict[tuple[str, int | None], int] = {}
    for s in slots:
        counts[machine_key(s.host)] = counts.get(machine_key(s.host), 0) + 1
    return counts


def user_sets(spec: LaunchSpec, name: str, inherited: Mapping[str, str]) -> bool:
    """Whether the user set ``name`` for the job: ``--env``, ``--env-server``, ``--env-worker``,
    a ``NAME=VALUE`` word before the command, or the launcher's own environment where the
    processes get it (``inherited``)."""
    given = (*spec.env, *spec.env_server, *spec.env_worker, *split_assignments(spec.command)[0])
    return name in inherited or any(n == name for n, _ in given)


def make_plan(
    spec: LaunchSpec,
    *,
    caps: Capabilities,
    job_id: str,
    secret: str,
    root_uri: str,
    root_port: int,
    node_host_of: dict[Host, str] | None = None,
    restart_count: int = 0,
    metrics_addr: str | None = None,
    master: tuple[str, int] = ("", 0),
    job_home: str = "",
    inherited: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> Plan:
    """Every process of the job, on a backend that can do ``caps``. ``node_host_of`` maps a
    host to the address it publishes (``DMLC_NODE_HOST``); by default processes that all run here
    (``caps.here``) publish ``root_uri`` and others the hostfile name. ``restart_count`` is the attempt (``LAUNCHKIT_RESTART_COUNT``). ``master``:
    torch's ``MASTER_ADDR`` and ``MASTER_PORT`` on worker 0's host (``("", 0)``: worker 0's node
    picks them, on the engines). ``job_home``: where the job is recorded (``LAUNCHKIT_JOB_HOME``,
    ``launchkit.jobs.owner.home_id``; "" sets none). Without servers there is no scheduler task: worker 0 serves
    ``root_uri:root_port`` (which must then be on worker 0's host). ``inherited``: the launcher's
    own environment where the processes get it (``caps.inherits_env``): a variable set there is
    the user's. Every process of a machine that runs more than one gets ``OMP_NUM_THREADS=1``
    unless the user set it (as torchrun: each would otherwise run a thread per core). An elastic job's
    scheduler process runs ``python -m trainer_core.ps.scheduler`` (``elastic_scheduler_argv``)."""
    no_scheduler = not has_scheduler(spec, caps)
    slots = place(spec.num_workers, spec.num_servers, spec.hosts)
    local_size, node_rank = worker_hosts(slots)
    job = dmlc_env.JobEnv(
        job_id=job_id,
        secret=secret,
        cluster=spec.backend,
        root_uri=root_uri,
        root_port=root_port,
        num_servers=spec.num_servers,
        num_workers=spec.num_workers,
        interface=spec.interface,
        restart_count=restart_count,
        root_in_worker0=no_scheduler,
        master_addr=master[0],
        master_port=master[1] or spec.master_port or 0,
        max_restarts=spec.max_restarts,
        worker_hosts=len(node_rank),
        home=job_home,
        elastic=spec.elastic,
    )
    assignments, words = split_assignments(spec.command)
    argv = render_argv(words)
    per_role = {"server": dict(spec.env_server), "worker": dict(spec.env_worker), "scheduler": {}}

    def node_host(role: str, host: Host) -> str:
        if role == "scheduler":
            return root_uri
        if node_host_of and host in node_host_of:
            return node_host_of[host]
        return root_uri if caps.here else host.name

    crowded = {k for k, n in host_counts(slots).items() if n > 1}
    if user_sets(spec, OMP_NUM_THREADS, inherited or {}):
        crowded = set()

    def make_task(role: str, rank: int, task_id: int, host: Host, local_rank: int, cwd: str) -> Task:
        cuda: str | None = None
        if spec.gpus_per_worker:
            cuda = gpu_slice(local_rank, spec.gpus_per_worker) if role == "worker" else ""
        env = dmlc_env.build_env(
            job,
            dmlc_env.TaskEnv(
                role=role,
                role_rank=rank,
                task_id=task_id,
                local_rank=local_rank,
                node_host=node_host(role, host),
                cuda_visible_devices=cuda,
                local_size=local_size.get(machine_key(host), 1),
                node_rank=node_rank.get(machine_key(host), 0),
            ),
        )
        user = {**dict(spec.env), **per_role[role], **dict(assignments)}
        identity = {dmlc_env.LAUNCHKIT_JOB_ID, dmlc_env.LAUNCHKIT_JOB_HOME, dmlc_env.LAUNCHKIT_RESTART_COUNT}
        for name in dmlc_env.SECRET_VARS | identity:
            user.pop(name, None)  # the job's identity (its home, its attempt) cannot be overridden
        if machine_key(host) in crowded:
            env[OMP_NUM_THREADS] = "1"
        env.update(user)
        if metrics_addr:  # the launcher's metrics endpoint (docs/metrics.md)
            env[dmlc_env.LAUNCHKIT_METRICS_ADDR] = metrics_addr
        run = elastic_scheduler_argv(python) if role == "scheduler" and spec.elastic is not None else argv
        return Task(role, rank, task_id, host, local_rank, run, env, cwd)

    remote_cwd = spec.sync_dst_dir or spec.cwd
    scheduler_host = spec.hosts[0] if caps.here else Host("localhost")
    tasks = []
    if not no_scheduler:
        task_id = spec.num_servers + spec.num_workers
        tasks.append(make_task("scheduler", 0, task_id, scheduler_host, 0, spec.cwd))
    for s in slots:
        cwd = spec.cwd if caps.here else remote_cwd
        tasks.append(make_task(s.role, s.rank, s.task_id, s.host, s.local_rank, cwd))
    return Plan(
        job_id=job_id,
        job_name=spec.job_name or default_job_name(words),
        backend=spec.backend,
        root_uri=root_uri,
        root_port=root_port,
        tasks=tuple(tasks),
        one_thread=len(crowded),
        job_env=job,
        elastic=spec.elastic,
    )


@dataclass(frozen=True)
class Member:
    """Where and as what one worker of an elastic job starts after the job began: the launcher's
    index for it (``LAUNCHKIT_ROLE_RANK``, never reused), its dense rank among the workers
    starting now (torch's ``RANK``) and their number, its host and the others' on it."""

    index: int
    rank: int
    world: int
    host: Host
    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    hosts: int = 1  # the workers' machines (GROUP_WORLD_SIZE)
    restart: int = 0  # the workers' restarts so far (TORCHELASTIC_RESTART_COUNT)


def member_task(plan: Plan, template: Task, member: Member, node_host: str) -> Task:
    """A worker of ``plan`` (elastic) started later, as ``template`` (the first worker: the
    user's variables, the command, the metrics address) but with ``member``'s place: the
    contract rebuilt for it (``DMLC_NUM_WORKER`` the workers when it starts), torch's ranks dense.
    Its task id follows every id of the first plan (the scheduler's included)."""
    job = plan.job_env
    if job is None:
        raise ValueError("the plan has no contract to start a worker from (not made by make_plan)")
    first = job.num_servers + job.num_workers  # the scheduler's id; later workers' come after it
    task_id = (
        member.index + job.num_servers
        if member.index < job.num_workers
        else first + 1 + member.index - job.num_workers
    )
    now = dataclasses.replace(job, num_workers=member.world, worker_hosts=member.hosts)
    env = dict(template.env)
    cuda = template.env.get(dmlc_env.CUDA_VISIBLE_DEVICES)
    fresh = dmlc_env.build_env(
        now,
        dmlc_env.TaskEnv(
            role="worker",
            role_rank=member.index,
            task_id=task_id,
            local_rank=member.local_rank,
            node_host=node_host,
            cuda_visible_devices=_gpus(cuda, member.local_rank) if cuda is not None else None,
            local_size=member.local_size,
            node_rank=member.node_rank,
        ),
    )
    env.update(fresh)
    env[dmlc_env.RANK] = env[dmlc_env.ROLE_RANK] = str(member.rank)
    env[dmlc_env.TORCHELASTIC_RESTART_COUNT] = str(member.restart)
    env[dmlc_env.TORCHELASTIC_ERROR_FILE] = dmlc_env.error_file_of(
        job, member.index
    )  # (an index is never reused)
    return dataclasses.replace(
        template, rank=member.index, task_id=task_id, host=member.host, local_rank=member.local_rank, env=env
    )


def _gpus(template: str, local_rank: int) -> str:
    """A later worker's ``CUDA_VISIBLE_DEVICES``: the first worker's block size, at its local rank."""
    per = len(template.split(",")) if template else 0
    return gpu_slice(local_rank, per) if per else template


def one_thread_note(plan: Plan) -> str | None:
    """The line that says the launcher set ``OMP_NUM_THREADS=1`` (as torchrun says it); None when
    it did not."""
    if not plan.one_thread:
        return None
    n = plan.one_thread
    if plan.backend == "local":
        where = "this machine (it runs more than one, and each would otherwise"
    else:
        where = f"the {n} host{'s' if n > 1 else ''} that run{'' if n > 1 else 's'} more than one (each would otherwise"
    return f"OMP_NUM_THREADS=1 for every process on {where} start a thread per core); set another with --env OMP_NUM_THREADS:N"
