"""From a ``LaunchSpec`` and a backend to a running job: what ``launchkit launch`` does once the
command line has become a spec (``launchkit.cli.launch`` only turns flags into one).

``run_job`` contacts the hosts, picks the scheduler's address and port, plans the job, prepares
the backend, records the job and hands it to the ``Supervisor``; ``dry_run_plan`` builds the same
plan without contacting anything; ``submit_detached`` submits a batch job that no launcher
follows (``--detach``) and records it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launchkit.backends.base import Backend
from launchkit.console import Ui
from launchkit.core.plan import make_plan, new_job_id, new_secret
from launchkit.core.spec import JobResult, LaunchSpec, Plan
from launchkit.dashboard import Dashboard
from launchkit.errors import BackendError, UsageError
from launchkit.hostside.netif import route_to
from launchkit.jobs import records as jobs
from launchkit.netutil import PortReservation, fallback_address, interface_address
from launchkit.supervisor import Supervisor, check_log_dir


def scheduler_address(spec: LaunchSpec, reached_from: str | None = None) -> str:
    """--scheduler-ip, else the interface's address, else loopback (local), else the local
    address through which the hosts were reached, else the route to the first host."""
    if spec.scheduler_ip:
        return spec.scheduler_ip
    if spec.interface:
        return interface_address(spec.interface)
    if spec.backend == "local":
        return "127.0.0.1"
    return reached_from or route_to(spec.hosts[0].name) or fallback_address()


AT_LAUNCH = "<chosen at launch>"


def dry_run_address(spec: LaunchSpec) -> str:
    """The scheduler's address as far as it is known without contacting a host. ssh takes the
    local address of its connection to the first host: the route to that host's address as
    resolved here (IPv4 first, as a launch takes it), or AT_LAUNCH when its name does not resolve here
    (an ssh config alias)."""
    if spec.backend != "ssh" or spec.scheduler_ip or spec.interface:
        return scheduler_address(spec)
    return route_to(spec.hosts[0].name) or AT_LAUNCH


def dry_run_plan(spec: LaunchSpec, backend: Backend) -> Plan:
    """The plan a launch would run (no secret, the port only if ``--scheduler-port`` names it)."""
    own_address = backend.finds_scheduler_address()
    return make_plan(
        spec,
        job_id=new_job_id(),
        secret="",
        root_uri="<its node's address>" if own_address else dry_run_address(spec),
        root_port=spec.scheduler_port or 0,
        node_host_of=backend.node_hosts(spec),
    )


def run_job(spec: LaunchSpec, backend: Backend, ui: Ui, *, dashboard: Dashboard | None = None) -> JobResult:
    """Start the job on ``backend`` and supervise it to its end."""
    if spec.log_dir:
        check_log_dir(Path(spec.log_dir))  # before contacting anything: exit 2 naming the directory
    reached = backend.connect(spec)
    own_address = backend.finds_scheduler_address()
    root_uri = "" if own_address else scheduler_address(spec, reached)
    reservation = None if spec.scheduler_port or own_address else PortReservation(root_uri)
    try:
        port = spec.scheduler_port or (reservation.port if reservation else 0)
        plan = make_plan(
            spec,
            job_id=new_job_id(),
            secret=new_secret(),
            root_uri=root_uri,
            root_port=port,
            node_host_of=backend.node_hosts(spec),
        )
        try:
            backend.prepare(plan)
        except BaseException:
            backend.close()
            raise
        record = jobs.started_here(
            id=plan.job_id,
            name=plan.job_name,
            backend=plan.backend,
            hosts=tuple(sorted({str(t.host) for t in plan.tasks})),
            command=spec.command,
            cwd=spec.cwd,
            log_dir=spec.log_dir,
            remote=backend.record_info(),
        )
        ui.info(
            f"job {plan.job_id} ({plan.job_name}): 1 scheduler, {_count(spec.num_servers, 'server')}, "
            f"{_count(spec.num_workers, 'worker')} on {plan.backend}; "
            + backend.scheduler_summary(root_uri, port)
        )
        return Supervisor(
            plan,
            backend,
            ui,
            log_dir=spec.log_dir,
            grace=spec.grace_period,
            time_limit=spec.time_limit,
            record=record,
            dashboard=dashboard,
        ).run()
    finally:
        if reservation is not None:
            reservation.close()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Submitted:
    """A detached batch job: launchkit's job id, the engine's, and where its output goes."""

    job_id: str
    engine_job: str
    output: str | None


def submit_detached(spec: LaunchSpec, backend: Backend) -> Submitted:
    """``--detach``: submit the batch job and record it; the job runs on its own."""
    from launchkit.backends.batch import BatchBackend

    if not isinstance(backend, BatchBackend):
        raise UsageError(f"--detach needs a batch engine, not --launcher {backend.name}")
    if not backend.can_detach():
        raise UsageError(f"--detach submits a batch job: {backend.detach_refusal()}")
    plan = make_plan(
        spec,
        job_id=new_job_id(),
        secret=new_secret(),
        root_uri="",
        root_port=0,
        node_host_of=backend.node_hosts(spec),
    )
    backend.prepare(plan)
    try:
        engine_job = backend.submit(plan)
    except OSError as exc:
        raise BackendError(backend.name, str(exc)) from None
    output = backend.output_of(plan)
    record = jobs.started_here(
        id=plan.job_id,
        name=plan.job_name,
        backend=plan.backend,
        hosts=(),
        command=spec.command,
        cwd=spec.cwd,
        log_dir=spec.log_dir,
        remote={"engine": backend.name, "engine_job": engine_job, "output": output},
        detached=True,
        processes=tuple(jobs.ProcessRecord(t.role, t.rank, str(t.host)) for t in plan.tasks),
    )
    jobs.save(record)
    return Submitted(plan.job_id, engine_job, output)
