"""Local addresses, looked up the same way on the launching machine and on the hosts: the IPv4
address of a network interface (the env contract's ``dmlc_env.interface_address``, the same lookup
trainer_core's nodes make), and the address the kernel would use toward another host.
Standard library only (and ``dmlc_env``, itself standard library only); the watchdog carries both
to ssh hosts as source."""

from __future__ import annotations

import ipaddress
import socket

from dmlc_env import interface_address

__all__ = ["interface_address", "route_address", "route_to"]


def route_address(host: str) -> str | None:
    """The local address the kernel would use to reach ``host`` (no packet is sent: a UDP
    socket's connect only picks a route). None when ``host`` is not an IP address or has no route."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((str(ip), 9))
            return str(s.getsockname()[0])
        except OSError:
            return None


def route_to(name: str) -> str | None:
    """The local address toward host ``name`` (a name or an address), resolved here, IPv4 first:
    the scheduler's address goes into ``DMLC_PS_ROOT_URI``, which ps-lite (and MXNet) read as an
    IPv4 address or a name, so where a name resolves to both (``localhost`` is ``::1`` first on
    Debian) the IPv4 route is the one a job can use. None when nothing resolves or routes."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # stable: IPv4 first, else in order
    for info in infos:
        route = route_address(str(info[4][0]))
        if route:
            return route
    return None
