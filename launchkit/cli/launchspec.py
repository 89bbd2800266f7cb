"""``launchkit launch``'s flags -> a ``LaunchSpec``: the checks that need more than a flag's type
(the command, the backend, the hosts, the numbers, the variables; ``launchargs``), each a
``UsageError`` (exit 2) before anything starts."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dmlc_env
from launchkit import backends
from launchkit.cli.backendflags import refuse_unused
from launchkit.cli.launchargs import (
    check_elastic,
    check_not_owned,
    check_restarts,
    parse_env_items,
    working_directory,
)
from launchkit.console import Ui
from launchkit.core.elastic import COOL_DOWN, check_bounds, start_size
from launchkit.core.hostfile import read_hostfile
from launchkit.core.placement import assign_hosts
from launchkit.core.plan import split_assignments
from launchkit.core.spec import LOCALHOST, Host, LaunchSpec
from launchkit.errors import UsageError
from launchkit.hostdiscovery import first_hosts
from launchkit.netutil import check_address

# launch.py's --p3: MXNet's P3 van (priority-based parameter propagation), for every process.
P3_ENV = (("DMLC_PS_VAN_TYPE", "p3"), ("DMLC_PS_WATER_MARK", "10"))


def build_spec(
    *,
    num_workers: int | tuple[int, int],
    num_servers: int | None,
    hostfile: Path | None,
    launcher: str | None,
    sync_dst_dir: str | None,
    env: list[str],
    env_server: list[str],
    env_worker: list[str],
    log_dir: str | None,
    job_name: str | None,
    gpus_per_worker: int | None,
    scheduler_ip: str | None,
    scheduler_port: int | None,
    interface: str | None,
    grace_period: float,
    command: list[str],
    time_limit: float | None = None,
    p3: bool = False,
    engine: Mapping[str, Any] | None = None,
    sync_timeout: float = 900.0,
    max_restarts: int = 0,
    restart_backoff: float = 1.0,
    master_port: int | None = None,
    host_discovery_script: str | None = None,
    blacklist_cooldown: float | None = None,
    ui: Ui,
) -> LaunchSpec:
    """The ``LaunchSpec`` that launch's common flags describe (``launchoptions.common``, by name);
    ``engine``: the engine flags' values, for a backend whose hosts are an allocation.
    ``num_workers``: N, or (MIN, MAX) for an elastic job (``launchoptions.workers_option``)."""
    bounds = num_workers if isinstance(num_workers, tuple) else None
    if bounds is not None:
        check_bounds(bounds)
        num_workers = bounds[1]
    assert isinstance(num_workers, int)
    if not command:
        raise UsageError("no command given: expected `launchkit launch -n N [options] COMMAND [ARGS...]`")
    check_command(command)
    if job_name is not None and not job_name.isprintable():
        raise UsageError(
            f"--job-name {job_name!r} holds a control character (a newline, a tab, an escape "
            "sequence): expected a name that prints as it is (ps, the dashboard and every message show it)"
        )
    backend = launcher or ("ssh" if hostfile else "local")
    if backend not in backends.names():
        raise UsageError(f"--launcher {backend!r}: expected one of {', '.join(backends.names())}")
    caps = backends.capabilities(backend)
    hosts = tuple(read_hostfile(hostfile, ui.warn)) if hostfile else (LOCALHOST,)
    placed = launch_hosts(backend, num_workers, num_servers, engine or {}, bool(hostfile), ui)
    if placed is not None:
        hosts = placed
    discovery = check_elastic(backend, bounds, max_restarts, host_discovery_script, hostfile)
    if blacklist_cooldown is not None and bounds is None:
        raise UsageError("--blacklist-cooldown needs an elastic job: -n MIN:MAX")
    if discovery is not None:  # the hosts it gives now (exit 2 if it fails at the start)
        hosts = tuple(first_hosts(discovery))
    if caps.needs_hostfile and not hostfile and discovery is None:
        raise UsageError(f"--launcher {backend} needs a hostfile: -H FILE")
    if sync_dst_dir:
        refuse_unused(backend, ["sync_dst_dir"])
    if scheduler_ip is not None:
        check_address("--scheduler-ip", scheduler_ip, resolve=caps.connects, here=caps.here)
    if time_limit == 0:  # the ranges of the command line (app.RANGES) have held every other bound
        raise UsageError("--time-limit must be more than 0, got 0")
    if sync_timeout <= 0:
        raise UsageError(f"--sync-timeout must be more than 0, got {sync_timeout:g}")
    check_restarts(backend, caps, max_restarts, restart_backoff)
    if bounds is not None:
        num_workers = start_size(bounds, hosts, caps.elastic, backend)
    if master_port is not None and master_port == scheduler_port:
        raise UsageError(f"--master-port {master_port} is --scheduler-port too: expected two ports")
    environ = dict(os.environ)
    ns = num_workers if num_servers is None else num_servers
    assign_hosts(num_workers, ns, hosts)  # placement errors before anything else happens
    flags = {"--env": env, "--env-server": env_server, "--env-worker": env_worker}
    for warning in check_not_owned(flags, split_assignments(command)[0], gpus_per_worker):
        ui.warn(warning)  # one per variable the docs let --env set (DMLC_INTERFACE)
    return LaunchSpec(
        num_workers=num_workers,
        num_servers=ns,
        command=tuple(command),
        backend=backend,
        hosts=hosts,
        env=parse_env_items(env, "--env", environ) + (P3_ENV if p3 else ()),
        env_server=parse_env_items(env_server, "--env-server", environ),
        env_worker=parse_env_items(env_worker, "--env-worker", environ),
        job_name=job_name,
        log_dir=log_dir,
        sync_dst_dir=sync_dst_dir,
        sync_timeout=sync_timeout,
        gpus_per_worker=gpus_per_worker,
        scheduler_ip=scheduler_ip,
        scheduler_port=scheduler_port,
        master_port=master_port,
        interface=interface or os.environ.get(dmlc_env.DMLC_INTERFACE) or None,
        grace_period=grace_period,
        time_limit=time_limit,
        cwd=working_directory(),
        max_restarts=max_restarts,
        restart_backoff=restart_backoff,
        elastic=bounds,
        hostfile=str(hostfile) if hostfile and bounds is not None and caps.hosts == "hostfile" else None,
        host_discovery=discovery,
        cool_down=COOL_DOWN if blacklist_cooldown is None else blacklist_cooldown,
    )


def check_command(command: list[str]) -> None:
    """The program to run must be a word: ``''`` or ``' '`` (an empty quoted command) is a
    usage error, not a process that cannot start or an ``sh -c ' '`` that does nothing; so is a
    command of only ``NAME=VALUE`` words (``A=1``), which the shell runs as no program at all."""
    if any("\0" in word for word in command):
        bad = next(word for word in command if "\0" in word)
        raise UsageError(f"command word {bad!r} holds a NUL byte, which no program argument or variable can")
    _, words = split_assignments(command)
    last = words[-1] if words else ""
    if len(words) == 1 and split_assignments([last, "x"])[0] and not any(c.isspace() for c in last):
        # NAME=VALUE words and nothing after them (one word with spaces runs under sh -c)
        raise UsageError(
            f"no command after {shlex.join(command)}: NAME=VALUE words set variables for a program, "
            "expected one after them, e.g. `launchkit launch -n 2 PS_VERBOSE=1 python train.py`"
        )
    if not words or not words[0].strip():
        raise UsageError(
            f"empty command {shlex.join(command)}: expected a program to run, "
            "e.g. `launchkit launch -n 2 python train.py`"
        )


def launch_hosts(
    backend: str, num_workers: int, num_servers: int | None, engine: Mapping[str, Any], hostfile: bool, ui: Ui
) -> tuple[Host, ...] | None:
    """The hosts the job goes on when not the hostfile's (``Capabilities.hosts``), else None;
    ``engine``: the engine flags' values (an allocation's size)."""
    cls = backends.backend_class(backend)
    caps = cls.capabilities
    if caps.hosts == "hostfile":
        return None
    if hostfile:
        ui.warn(f"--launcher {backend}: {caps.hostfile_ignored}; the hostfile is ignored")
    if caps.hosts == "allocation":
        return cls.allocation_hosts(engine)
    if caps.hosts == "per task":  # the engine places every process: one placeholder each
        servers = num_workers if num_servers is None else num_servers
        return tuple(
            Host(f"<{backend} task {i}>") for i in range(1, max(num_workers, 0) + max(servers, 0) + 1)
        )
    return (LOCALHOST,)  # "here", or "engine": the engine places the job
