"""Where the scheduler is, when no launcher can say it up front (a Grid Engine array job).

The scheduler's task picks its address and a free port and publishes ``ADDRESS PORT`` in a file
on the filesystem the job's tasks share (``LAUNCHKIT_RENDEZVOUS``); every other task waits for
that file. The job secret may likewise come from a file only the user can read
(``LAUNCHKIT_SECRET_FILE``), so that the engine never stores or shows it. Used by the rank
shim; standard library only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping, MutableMapping

from launchkit.hostside.netif import interface_address, route_address

RENDEZVOUS_VAR = "LAUNCHKIT_RENDEZVOUS"
SECRET_FILE_VAR = "LAUNCHKIT_SECRET_FILE"
DEFAULT_WAIT = 600.0


def format_root(address: str, port: int) -> str:
    return f"{address} {port}\n"


def parse_root(text: str) -> tuple[str, int] | None:
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


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
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            with open(path) as f:
                root = parse_root(f.read())
            if root is not None:
                return root
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler did not publish its address in {path} within {timeout:g}s")
        time.sleep(poll)


def resolve(env: MutableMapping[str, str]) -> None:
    """Fill in the secret and the scheduler's address where the engine could not carry them."""
    secret_file = env.get(SECRET_FILE_VAR)
    if secret_file and not env.get("LAUNCHKIT_JOB_SECRET"):
        with open(secret_file) as f:
            env["LAUNCHKIT_JOB_SECRET"] = f.read().strip()
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
