"""Placement: which process runs on which host. Pure functions, documented in docs/placement.md.

Without ``slots=`` on any host, MXNet's rule exactly: for ``i in range(S + W)`` process ``i`` is
a server when ``i < S`` (else a worker) and runs on ``hosts[i % len(hosts)]``. A host listed
twice is simply one more entry in that cycle.

With ``slots=N`` (on any host; a host without it counts as one slot): workers fill each host's
slots in hostfile order, servers go round-robin over the hosts and take no slots. More workers
than slots is a ``PlacementError`` that gives both numbers.

Global task ids (``DMLC_TASK_ID``): servers ``0..S-1``, workers ``S..S+W-1``, the scheduler
``S+W``. Local ranks count the processes of one role on one machine (same name and port).
"""

from __future__ import annotations

from dataclasses import dataclass

from launchkit.core.spec import Host
from launchkit.errors import PlacementError


@dataclass(frozen=True)
class Slot:
    role: str
    rank: int
    task_id: int
    host: Host
    local_rank: int


def machine_key(host: Host) -> tuple[str, int | None]:
    """Two hostfile entries name the same machine when name and port agree."""
    return (host.name.lower(), host.port)


def uses_slots(hosts: list[Host] | tuple[Host, ...]) -> bool:
    return any(h.slots is not None for h in hosts)


#: The most processes of one role a plan holds: each is a task in memory, a line of the plan and a
#: process on some host, so a larger count is a typo (``-s 99999999999999999999`` hung the planner).
MAX_PER_ROLE = 100_000


def _validate(num_workers: int, num_servers: int, hosts: list[Host] | tuple[Host, ...]) -> None:
    if num_workers < 1:
        raise PlacementError(f"-n/--num-workers must be at least 1, got {num_workers}")
    if num_servers < 0:
        raise PlacementError(f"-s/--num-servers must be 0 or more, got {num_servers}")
    for flag, count in (("-n/--num-workers", num_workers), ("-s/--num-servers", num_servers)):
        if count > MAX_PER_ROLE:
            raise PlacementError(f"{flag} {count}: expected at most {MAX_PER_ROLE} processes")
    if not hosts:
        raise PlacementError("no hosts to place the job on")


def assign_hosts(num_workers: int, num_servers: int, hosts: list[Host] | tuple[Host, ...]) -> list[Host]:
    """Host of each process in global order (servers first, then workers)."""
    _validate(num_workers, num_servers, hosts)
    if not uses_slots(hosts):
        return [hosts[i % len(hosts)] for i in range(num_servers + num_workers)]
    capacity = sum(h.slots or 1 for h in hosts)
    if num_workers > capacity:
        raise PlacementError(
            f"{num_workers} workers do not fit in the hostfile's {capacity} slots "
            f"({len(hosts)} hosts); add hosts or slots, or lower -n"
        )
    servers = [hosts[j % len(hosts)] for j in range(num_servers)]
    workers: list[Host] = []
    for h in hosts:
        take = min(h.slots or 1, num_workers - len(workers))
        workers.extend([h] * take)
        if len(workers) == num_workers:
            break
    return servers + workers


def place(num_workers: int, num_servers: int, hosts: list[Host] | tuple[Host, ...]) -> list[Slot]:
    """Servers then workers, each with role rank, global task id, host and local rank."""
    assigned = assign_hosts(num_workers, num_servers, hosts)
    slots: list[Slot] = []
    seen: dict[tuple[str, tuple[str, int | None]], int] = {}
    for i, host in enumerate(assigned):
        role = "server" if i < num_servers else "worker"
        rank = i if role == "server" else i - num_servers
        key = (role, machine_key(host))
        local = seen.get(key, 0)
        seen[key] = local + 1
        slots.append(Slot(role=role, rank=rank, task_id=i, host=host, local_rank=local))
    return slots


def gpu_slice(local_rank: int, gpus_per_worker: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker: its own block of devices by local rank."""
    first = local_rank * gpus_per_worker
    return ",".join(str(d) for d in range(first, first + gpus_per_worker))
