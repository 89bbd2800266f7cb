"""Local addresses, looked up the same way on the launching machine and on the hosts: the IPv4
address of a network interface (the env contract's ``dmlc_env.interface_address``, the same lookup
trainer_core's nodes make), and the address the kernel would use toward another host.
Standard library only (and ``dmlc_env``, itself standard library only); the watchdog carries both
to ssh hosts as source."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import MutableMapping

from dmlc_env import interface_address

__all__ = [
    "interface_address",
    "interface_of",
    "interface_toward",
    "is_loopback",
    "route_address",
    "route_to",
    "socket_ifnames",
]


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


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (``127.0.0.1``, Debian's ``127.0.1.1``, ``::1``)."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address.lower() == "localhost"


def interface_of(address: str) -> str | None:
    """The name of the local network interface that holds IPv4 ``address``; None when none does."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((name for name in names if interface_address(name) == address), None)


def interface_toward(host: str) -> str | None:
    """The local interface the kernel would send through to reach ``host`` (an IPv4 address or a
    name): what gloo and NCCL must bind to for a peer there to reach them. None when ``host``
    does not resolve, has no route, or the route's address is on no interface (IPv6)."""
    try:
        ip = socket.gethostbyname(host)
    except (OSError, UnicodeError):
        return None
    local = route_address(ip)
    return interface_of(local) if local else None


#: What gloo and NCCL bind to and connect through
SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_ifnames(env: MutableMapping[str, str], known: dict[str, str | None] | None = None) -> None:
    """A worker's ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``: the interface its host reaches
    ``MASTER_ADDR`` through (gloo binds to its host name's address otherwise, loopback where that
    resolves to it), unless the user set them; nothing without ``MASTER_ADDR``. ``known``: the
    interfaces already looked up, by address (a host's watchdog starts many workers)."""
    master = env.get("MASTER_ADDR")
    if env.get("DMLC_ROLE") != "worker" or not master or all(env.get(n) for n in SOCKET_IFNAMES):
        return
    if known is None or master not in known:
        iface = interface_toward(master)
        if known is not None:
            known[master] = iface
    else:
        iface = known[master]
    for name in SOCKET_IFNAMES:
        if iface and not env.get(name):
            env[name] = iface
