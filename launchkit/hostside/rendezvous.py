"""Where the scheduler is, when no launcher can say it up front (a Grid Engine array job).

The scheduler's task picks its address and a free port and publishes ``ADDRESS PORT`` in a file
on the filesystem the job's tasks share (``LAUNCHKIT_RENDEZVOUS``); every other task waits for
that file. The job secret may likewise come from a file only the user can read
(``LAUNCHKIT_SECRET_FILE``), so that the engine never stores or shows it.

Worker 0 does the same on the engines, where the launcher cannot know its node
(``LAUNCHKIT_RENDEZVOUS_WORKER0``): its task picks its address and two free ports and publishes
``ADDRESS ROOT_PORT MASTER_PORT``; every worker then gets torch's ``MASTER_ADDR``/``MASTER_PORT``
from it, and in a job without servers (``LAUNCHKIT_ROOT_SERVER=worker 0``) also
``DMLC_PS_ROOT_URI``/``PORT``: the rendezvous that worker 0's process serves. Used by the rank
shim; standard library only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Mapping, MutableMapping

from launchkit.hostside.netif import interface_address, is_loopback, route_address, socket_ifnames

RENDEZVOUS_VAR = "LAUNCHKIT_RENDEZVOUS"
SECRET_FILE_VAR = "LAUNCHKIT_SECRET_FILE"
WORKER0_VAR = "LAUNCHKIT_RENDEZVOUS_WORKER0"
#: An address of the launcher's host, which the job's hosts reach (mpi, slurm): worker 0 publishes
#: the address it reaches it through, where no scheduler's address or submit host says more
TOWARD_VAR = "LAUNCHKIT_RENDEZVOUS_TOWARD"
DEFAULT_WAIT = 600.0
#: How long a worker of a job WITH a scheduler waits for worker 0's address (torch's MASTER_* only,
#: which such a job need not use) before it goes on without them, saying why
OPTIONAL_WAIT = 10.0


def format_root(address: str, port: int) -> str:
    return f"{address} {port}\n"


def parse_root(text: str, ports: int = 1) -> tuple[str, int] | None:
    """``ADDRESS PORT`` (and, with ``ports`` 2, ``ADDRESS PORT PORT``: the address and the first)."""
    found = parse_ports(text, ports)
    return None if found is None else (found[0], found[1][0])


def parse_ports(text: str, ports: int) -> tuple[str, list[int]] | None:
    """``ADDRESS PORT...`` (``ports`` of them), and what follows them (worker 0's host name)."""
    parts = text.split()
    if len(parts) not in (1 + ports, 2 + ports) or not all(p.isdigit() for p in parts[1 : 1 + ports]):
        return None
    return parts[0], [int(p) for p in parts[1 : 1 + ports]]


def published_host(path: str) -> str | None:
    """The host name worker 0 wrote after its address and ports (None from an older launchkit)."""
    with contextlib.suppress(OSError), open(path) as f:
        parts = f.read().split()
        return parts[3] if len(parts) == 4 else None
    return None


def local_address(env: Mapping[str, str], toward: str | None) -> str | None:
    """The address this node publishes: ``DMLC_INTERFACE``'s, else the one it reaches ``toward``
    through (a host name or address), else its own name's; None when none can be found."""
    found = interface_address(env["DMLC_INTERFACE"]) if env.get("DMLC_INTERFACE") else None
    with contextlib.suppress(OSError):
        if found is None and toward:
            found = route_address(socket.gethostbyname(toward))
        if found is None:
            found = socket.gethostbyname(socket.gethostname())
    return found


def publish(path: str, address: str) -> tuple[str, int]:
    """The scheduler's side: a free port on ``address``, written with its address atomically."""
    with socket.socket() as s:
        s.bind((address, 0))
        port = int(s.getsockname()[1])
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(format_root(address, port))
    os.replace(tmp, path)
    return address, port


def wait_for(path: str, timeout: float, poll: float = 0.2) -> tuple[str, int]:
    address, ports = wait_for_ports(path, 1, timeout, "the scheduler", poll)
    return address, ports[0]


def wait_for_ports(
    path: str, ports: int, timeout: float, who: str, poll: float = 0.2
) -> tuple[str, list[int]]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            with open(path) as f:
                found = parse_ports(f.read(), ports)
            if found is not None:
                return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who} did not publish its address in {path} within {timeout:g}s")
        time.sleep(poll)


def publish_worker0(path: str, address: str, master_port: int = 0) -> tuple[str, list[int]]:
    """Worker 0's side: two free ports on ``address`` (the rendezvous's, torch's store's), written
    with it atomically. Free when picked, not held (as torchrun picks ``MASTER_PORT``);
    ``master_port``, when not 0, is torch's store's (``--master-port``)."""
    socks = [socket.socket() for _ in range(1 if master_port else 2)]
    try:
        for s in socks:
            s.bind((address, 0))
        ports = [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
    if master_port:
        ports.append(master_port)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{address} {ports[0]} {ports[1]} {socket.gethostname()}\n")
    os.replace(tmp, path)
    return address, ports


def resolve_worker0(env: MutableMapping[str, str]) -> None:
    """A worker's ``MASTER_ADDR``/``PORT`` (and, without servers, ``DMLC_PS_ROOT_URI``/``PORT``)
    from worker 0's file, which worker 0 writes; nothing where the launcher gave them."""
    path = env.get(WORKER0_VAR)
    if not path or env.get("DMLC_ROLE") != "worker" or env.get("MASTER_ADDR"):
        return
    serves = env.get("LAUNCHKIT_ROOT_SERVER") == "worker 0"  # the job's rendezvous too: required
    if env.get("LAUNCHKIT_ROLE_RANK") == "0":
        toward = (
            env.get("DMLC_PS_ROOT_URI")
            or env.get(TOWARD_VAR)
            or env.get("SGE_O_HOST")
            or env.get("SLURM_SUBMIT_HOST")
        )
        pinned = int(env.get("MASTER_PORT") or 0)  # --master-port
        address, (root, master) = publish_worker0(path, local_address(env, toward) or "127.0.0.1", pinned)
    else:
        wait = float(env.get("PS_START_TIMEOUT") or DEFAULT_WAIT) if serves else OPTIONAL_WAIT
        try:
            address, (root, master) = wait_for_ports(path, 2, wait, "worker 0")
        except TimeoutError as exc:
            if serves:
                raise
            sys.stderr.write(
                f"launchkit shim: {exc} (is the job's directory shared?): MASTER_ADDR and "
                "MASTER_PORT are not set; the job's scheduler is not affected\n"
            )
            return
        why = unreachable(address, published_host(path), socket.gethostname())
        if why is not None:
            if serves:
                raise Unreachable(why)
            sys.stderr.write(f"launchkit shim: {why}; MASTER_ADDR and MASTER_PORT are not set\n")
            return
    env["MASTER_ADDR"], env["MASTER_PORT"] = address, str(master)
    if serves:
        env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"] = address, str(root)


class Unreachable(OSError):
    """Worker 0 published an address this worker's host cannot reach (loopback, another host)."""


def unreachable(address: str, worker0_host: str | None, here: str) -> str | None:
    """Why worker 0's ``address`` cannot serve this worker: it is loopback, and worker 0 runs on
    another host (``worker0_host``, as it wrote it; this one is ``here``); None when it can."""
    if not is_loopback(address) or worker0_host is None or worker0_host == here:
        return None
    return (
        f"worker 0 on {worker0_host} published {address}, a loopback address (its host name resolves "
        f"to it, and nothing better was found), which this worker on {here} cannot reach: give "
        "--interface IFACE, the interface of worker 0's host that the other hosts reach"
    )


def resolve(env: MutableMapping[str, str]) -> None:
    """Fill in the secret, the scheduler's address and worker 0's where the engine could not carry them."""
    secret_file = env.get(SECRET_FILE_VAR)
    if secret_file and not env.get("LAUNCHKIT_JOB_SECRET"):
        with open(secret_file) as f:
            env["LAUNCHKIT_JOB_SECRET"] = f.read().strip()
    resolve_scheduler(env)
    resolve_worker0(env)
    socket_ifnames(env)


def resolve_scheduler(env: MutableMapping[str, str]) -> None:
    path = env.get(RENDEZVOUS_VAR)
    if not path or env.get("DMLC_PS_ROOT_URI"):
        return
    if env.get("DMLC_ROLE") == "scheduler":
        # the address it reaches the submitting host through (Grid Engine's SGE_O_HOST)
        address, port = publish(path, local_address(env, env.get("SGE_O_HOST")) or "127.0.0.1")
    else:
        wait = float(env.get("PS_START_TIMEOUT") or DEFAULT_WAIT)
        address, port = wait_for(path, wait)
    env["DMLC_PS_ROOT_URI"] = address
    env["DMLC_PS_ROOT_PORT"] = str(port)
