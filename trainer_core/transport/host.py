"""This machine: its identity (which peers share its memory) and the addresses it binds and publishes.

The one place trainer_core asks the operating system about the host: ``machine_identity`` decides
which peers can exchange arrays through shared memory, ``interface_address`` resolves
``DMLC_INTERFACE``, ``bind_and_publish_hosts`` picks where a node listens and what it tells others.
"""

from __future__ import annotations

import socket

import dmlc_env
from trainer_core.errors import ConfigError


def host_name(node_host: str | None) -> str:
    """This host's name as the job knows it: ``DMLC_NODE_HOST`` when a launcher set it, else the hostname."""
    return node_host or socket.gethostname()


def machine_identity(node_host: str | None) -> str:
    """Processes with equal identities share ``/dev/shm``: the published host name plus this boot's id
    (so two containers or a rebooted host under one name are told apart)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    return f"{host_name(node_host)}|{boot}"


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (the contract's lookup), or ``ConfigError`` naming it."""
    address = dmlc_env.interface_address(name)
    if address is None:
        raise ConfigError(f"DMLC_INTERFACE={name!r}: no such interface with an IPv4 address")
    return address


def bind_and_publish_hosts(interface: str | None, node_host: str | None) -> tuple[str, str]:
    """(host to bind, host to publish): the interface's address, else ``DMLC_NODE_HOST``, else this host's name."""
    if interface:
        ip = interface_address(interface)
        return ip, ip
    if node_host:
        try:
            ip = socket.gethostbyname(node_host)
        except OSError:
            return "*", node_host
        return ("*", node_host) if not _is_local(ip) else (ip, ip)
    name = host_name(None)
    try:
        return "*", socket.gethostbyname(name)
    except OSError:
        return "*", name


def _is_local(ip: str) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
    except OSError:
        return False
    finally:
        s.close()
    return True
