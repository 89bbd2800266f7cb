"""What ``launchkit launch`` does for the cluster engines: the hosts they give (an allocation,
placeholders for the engine to fill) and their options from the command line."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from launchkit import backends
from launchkit.console import Ui
from launchkit.core.spec import LOCALHOST, Host, LaunchSpec
from launchkit.errors import UsageError


def slurm_hosts(nodes: int | None) -> tuple[Host, ...]:
    """Inside an allocation its nodes (``--nodes`` takes the first N); outside, N placeholders."""
    from launchkit.backends import slurm

    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    if slurm.in_allocation(os.environ):
        hosts = slurm.allocation_hosts()
        if nodes is not None and nodes > len(hosts):
            raise UsageError(f"--nodes {nodes}: the allocation has only {len(hosts)} node(s)")
        return hosts[:nodes] if nodes else hosts
    return slurm.placeholder_hosts(nodes or 1)


def engine_hosts(
    backend: str, num_workers: int, num_servers: int | None, nodes: int | None, hostfile: bool, ui: Ui
) -> tuple[Host, ...] | None:
    """The hosts the job goes on when not the hostfile's (``Capabilities.hosts``), else None."""
    caps = backends.capabilities(backend)
    if caps.hosts == "hostfile":
        return None
    if hostfile:
        ui.warn(f"--launcher {backend}: {caps.hostfile_ignored}; the hostfile is ignored")
    if caps.hosts == "allocation":
        return slurm_hosts(nodes)
    if caps.hosts == "per task":  # the engine places every process: one placeholder each
        servers = num_workers if num_servers is None else num_servers
        return tuple(
            Host(f"<{backend} task {i}>") for i in range(1, max(num_workers, 0) + max(servers, 0) + 1)
        )
    return (LOCALHOST,)  # "here", or "engine": the engine places the job


@dataclass(frozen=True)
class EngineFlags:
    """The engine options of ``launchkit launch``, as given (None: not given)."""

    mpirun: str = "mpirun"
    mpi_args: str = ""
    node_python: str | None = None
    partition: str | None = None
    slurm_time: str | None = None
    nodes: int | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None
    cpus_per_server: int | None = None
    cpus_per_worker: int | None = None
    mem: str | None = None
    mem_per_server: str | None = None
    mem_per_worker: str | None = None
    slurm_args: str = ""
    queue: str | None = None
    pe: str | None = None
    sge_resource: tuple[str, ...] = ()
    sge_args: str = ""
    yarn_rm: str | None = None
    yarn_user: str | None = None
    yarn_domain: str | None = None
    yarn_file: tuple[str, ...] = ()


def split_flag(flag: str, value: str) -> tuple[str, ...]:
    """A flag that carries more flags, split as a shell would (no shell runs)."""
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise UsageError(f"{flag} {value!r}: {exc}") from None


def _per_role(f: EngineFlags) -> dict[str, Any]:
    for name, value in (
        ("--cpus-per-server", f.cpus_per_server),
        ("--cpus-per-worker", f.cpus_per_worker),
        ("--cpus-per-task", f.cpus_per_task),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    return {
        "cpus_per_server": f.cpus_per_server or f.cpus_per_task,
        "cpus_per_worker": f.cpus_per_worker or f.cpus_per_task,
        "mem_per_server": f.mem_per_server or f.mem,
        "mem_per_worker": f.mem_per_worker or f.mem,
    }


def engine_backend_options(spec: LaunchSpec, f: EngineFlags) -> dict[str, Any]:
    """The engines' keyword arguments for the backend's constructor (``backends.get_backend``):
    the option objects of the engines the backend declares (``Capabilities.options``); the caller
    passes on those the backend takes."""
    takes = backends.capabilities(spec.backend).options
    options: dict[str, Any] = {"mpirun": f.mpirun, "mpi_args": f.mpi_args, "node_python": f.node_python}
    if "sge" in takes:
        from launchkit.backends.sge import SgeOptions

        options["sge"] = SgeOptions(
            queue=f.queue, pe=f.pe, resources=f.sge_resource, extra=split_flag("--sge-args", f.sge_args)
        )
    if "yarn" in takes:
        from launchkit.backends.yarnspec import YarnOptions

        options["yarn"] = YarnOptions(
            rm_url=f.yarn_rm,
            user=f.yarn_user,
            queue=f.queue,
            domain=f.yarn_domain,
            files=f.yarn_file,
            **_per_role(f),
        )
    if "slurm" in takes:
        from launchkit.backends.slurm import SlurmOptions, parse_mem

        roles = _per_role(f)
        for name in ("mem_per_server", "mem_per_worker"):
            if roles[name] is not None:
                try:
                    parse_mem(roles[name])
                except UsageError as exc:
                    raise UsageError(f"--{name.replace('_', '-')} (or --mem): {exc.message}") from None
        options["slurm"] = SlurmOptions(
            partition=f.partition,
            time=f.slurm_time,
            nodes=f.nodes,
            account=f.account,
            qos=f.qos,
            constraint=f.constraint,
            gpus_per_worker=spec.gpus_per_worker,
            extra=split_flag("--slurm-args", f.slurm_args),
            **roles,
        )
    return options
