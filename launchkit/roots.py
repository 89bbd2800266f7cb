"""Where a job's processes meet, chosen before it is planned: the scheduler's address (or, in a
job without servers, worker 0's) and the ports held for it and for torch's store (``Roots``).
``launching`` uses it for every attempt; ``--dry-run`` for what it can know without contacting
anything."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from launchkit.backends.base import Backend
from launchkit.core.capabilities import Capabilities
from launchkit.core.placement import assign_hosts
from launchkit.core.plan import has_scheduler
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import UsageError
from launchkit.hostside.netif import is_loopback, route_to
from launchkit.netutil import PortReservation, fallback_address, interface_address

__all__ = ["AT_LAUNCH", "Roots", "dry_run_address", "root_case", "scheduler_address"]


def scheduler_address(spec: LaunchSpec, caps: Capabilities, reached_from: str | None = None) -> str:
    """--scheduler-ip, else the interface's address, else loopback (every process here), else the
    local address through which the hosts were reached, else the route to the first host."""
    if spec.scheduler_ip:
        return spec.scheduler_ip
    if spec.interface:
        return interface_address(spec.interface)
    if caps.here:
        return "127.0.0.1"
    return reached_from or route_to(spec.hosts[0].name) or fallback_address()


AT_LAUNCH = "<chosen at launch>"
WORKER0_ADDRESS = "<worker 0's address>"  # a dry run of a job without servers off this machine
ITS_NODE = "<its node's address>"  # a dry run where the batch job picks the scheduler's address


def dry_run_address(spec: LaunchSpec, caps: Capabilities) -> str:
    """The scheduler's address as far as it is known without contacting a host. A backend that
    connects to the hosts itself (ssh) takes the local address of its connection to the first
    host: the route to that host's address as resolved here (IPv4 first, as a launch takes it),
    or AT_LAUNCH when its name does not resolve here (an ssh config alias)."""
    if not caps.connects or spec.scheduler_ip or spec.interface:
        return scheduler_address(spec, caps)
    return route_to(spec.hosts[0].name) or AT_LAUNCH


Case = Literal["scheduler", "worker 0 here", "worker 0"]


def root_case(spec: LaunchSpec, caps: Capabilities) -> Case:
    """Who serves the job's root: a scheduler process (here, or in the batch job); worker 0 on
    this machine, on a port reserved here; worker 0 elsewhere, where the backend asks its host
    for the port (ssh) or its node picks it (an engine's shim)."""
    if has_scheduler(spec, caps):
        return "scheduler"
    return "worker 0 here" if caps.here else "worker 0"


def off_this_machine(name: str) -> bool:
    """Whether host ``name`` resolves here to an address that is not loopback (another machine)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return True  # (a name only ssh's config knows: not this machine's loopback either)
    return not all(is_loopback(str(info[4][0])) for info in infos)


def check_reachable(
    spec: LaunchSpec, master_addr: str, reached_name: Callable[[Host], str] = lambda h: h.name
) -> None:
    """Refuse a loopback ``MASTER_ADDR`` (worker 0's address) in a job whose workers span
    machines: the others would wait in ``init_process_group`` for a store they cannot reach.
    ``reached_name`` gives the name a host is reached at (an ssh config alias's ``HostName``)."""
    if not is_loopback(master_addr):
        return
    workers = assign_hosts(spec.num_workers, spec.num_servers, spec.hosts)[spec.num_servers :]
    other = next((h for h in workers if off_this_machine(reached_name(h))), None)
    if other is None:
        return
    named = "or --scheduler-ip ADDRESS (worker 0's address) " if spec.num_servers == 0 else ""
    raise UsageError(
        f"worker 0's host {workers[0]} is reached at {master_addr}, a loopback address, but worker "
        f"hosts such as {other} are other machines, which could not reach torch's store "
        f"(MASTER_ADDR) there: name worker 0's host in the hostfile by an address the others reach, "
        f"or give --interface IFACE (its interface the others reach) {named}(docs/environment.md)"
    )


@dataclass
class Roots:
    """Where a job's processes meet: the root (``DMLC_PS_ROOT_URI``/``PORT``: the scheduler's, or
    without servers worker 0's rendezvous) and torch's store (``MASTER_ADDR``/``PORT``, on worker 0's
    host); ``("", 0)`` where worker 0's node (an engine's shim) or the batch job picks them. On this
    machine the ports are held (``PortReservation``) until ``close``. ``choose`` picks them for a
    launch, ``dry_run_root`` says the root's address for ``--dry-run``: both by ``root_case``."""

    root: tuple[str, int]
    master: tuple[str, int]
    held: list[PortReservation] = field(default_factory=list)

    @staticmethod
    def dry_run_root(spec: LaunchSpec, backend: Backend) -> str:
        """The root's address as a dry run shows it, without contacting anything."""
        caps = backend.capabilities
        if root_case(spec, caps) == "worker 0":
            return spec.scheduler_ip or WORKER0_ADDRESS
        return ITS_NODE if backend.finds_scheduler_address() else dry_run_address(spec, caps)

    @classmethod
    def choose(cls, spec: LaunchSpec, backend: Backend, reached: str | None) -> Roots:
        caps = backend.capabilities
        own_address = backend.finds_scheduler_address()
        here = "" if own_address else scheduler_address(spec, caps, reached)
        held: list[PortReservation] = []

        def reserve() -> int:
            held.append(PortReservation(here))
            return held[-1].port

        try:
            far = backend.worker0_ports(spec)  # ssh: asked on worker 0's host
            case = root_case(spec, caps)
            if case == "scheduler":  # a scheduler process, here or in the batch job
                root = (here, spec.scheduler_port or (0 if own_address else reserve()))
            elif far is not None:
                root = (spec.scheduler_ip or far[0], spec.scheduler_port or far[1])
            elif case == "worker 0 here":
                root = (here, spec.scheduler_port or reserve())
            else:  # an engine: worker 0's shim picks and publishes them
                root = ("", 0)
            if far is not None:  # (--scheduler-ip names worker 0's address where it serves the rendezvous)
                named = spec.scheduler_ip if case != "scheduler" else None
                master = (named or far[0], spec.master_port or far[2])
                check_reachable(spec, master[0], backend.reached_name)
            elif caps.here:
                master = (here, spec.master_port or reserve())
            else:  # worker 0's node: a --master-port reaches it in the plan
                master = ("", 0)
        except BaseException:
            for r in held:
                r.close()
            raise
        return cls(root, master, held)

    def summary(self) -> str:
        """Where worker 0 serves the rendezvous, for the launch's first line (a job without servers)."""
        if not self.root[0]:
            return "no scheduler process: worker 0 serves the rendezvous (its node publishes where)"
        return f"no scheduler process: worker 0 serves the rendezvous at {self.root[0]}:{self.root[1]}"

    def close(self) -> None:
        for r in self.held:
            r.close()
