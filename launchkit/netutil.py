"""Addresses and ports of the launching machine: the checked ``--interface`` lookup, the fallback
address and the scheduler's port reservation. The lookups themselves are ``launchkit.hostside.netif``'s,
shared with the hosts."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

from launchkit.core.hostfile import parse_host
from launchkit.errors import UsageError
from launchkit.hostside import netif


def interface_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def interface_address(name: str) -> str:
    """The IPv4 address of a network interface, e.g. ``lo`` -> ``127.0.0.1``."""
    if name not in interface_names():
        raise UsageError(f"no network interface named {name!r} here (have: {', '.join(interface_names())})")
    address = netif.interface_address(name)  # the same lookup the hosts' watchdogs do
    if address is None:
        raise UsageError(f"network interface {name!r} has no IPv4 address")
    return address


def check_address(flag: str, text: str, *, resolve: bool, here: bool = False) -> None:
    """An address given on the command line (``--scheduler-ip``): an IP address, or a host name
    that, with ``resolve``, has an address here (where the scheduler runs); with ``here`` (every
    process runs on this machine), an address of this machine. UsageError otherwise, before
    anything starts: nodes told to reach ``notanip``, or an address no interface here has, waited
    silently until the time limit."""
    try:
        ipaddress.ip_address(text)
        numeric = True
    except ValueError:
        numeric = False
    if not numeric:
        _check_name(flag, text, resolve=resolve or here)
    if here:
        _check_local(flag, text)


def _check_local(flag: str, text: str) -> None:
    """``text`` names an address a socket can be bound to on this machine."""
    with contextlib.suppress(OSError, UnicodeError):
        for family, kind, proto, _, addr in socket.getaddrinfo(text, 0, type=socket.SOCK_STREAM):
            with contextlib.suppress(OSError), socket.socket(family, kind, proto) as sock:
                sock.bind(addr)
                return
    raise UsageError(
        f"{flag} {text!r}: not an address of this machine; with --launcher local every process "
        "runs here, so the scheduler must listen on one of this machine's addresses (e.g. 127.0.0.1)"
    )


def _check_name(flag: str, text: str, *, resolve: bool) -> None:
    try:
        host = parse_host(text)
    except ValueError:
        host = None
    if host is None or host.port is not None or host.user is not None:
        raise UsageError(f"{flag} {text!r}: expected an IP address (e.g. 10.0.0.5 or fe80::1) or a host name")
    if resolve:
        try:
            socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(
                f"{flag} {text!r}: not an IP address, and no address is known for it here ({reason}); "
                "expected the address the job's processes reach this machine at, e.g. 10.0.0.5"
            ) from None


def fallback_address() -> str:
    """launch.py's choice: the address of this host's name, else loopback."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


class PortReservation:
    """Holds a free TCP port for the scheduler without the bind-then-close race.

    The socket is bound (never listening) to a port the kernel picks, then marked
    SO_REUSEADDR: the kernel will not hand that port to anyone else's ``bind(0)`` or outgoing
    connection, and a plain ``bind`` to it fails, while the scheduler, which binds with
    SO_REUSEADDR as ZeroMQ (MXNet's ps-lite, trainer_core) does, can still take it. Held for
    the whole job and released by ``close``.
    """

    def __init__(self, ip: str = "") -> None:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind(("", 0))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
