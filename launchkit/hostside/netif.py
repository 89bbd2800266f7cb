"""Local addresses, looked up the same way on the launching machine and on the hosts: the IPv4
address of a network interface, and the address the kernel would use toward another host.
Standard library only; the watchdog carries it to ssh hosts as source."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (``lo`` -> ``127.0.0.1``); None when there
    is no such interface or it has no IPv4 address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


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
