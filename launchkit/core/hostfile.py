"""Hostfiles: one host per line.

Accepted (see docs/hostfiles.md)::

    # comments, blank lines, Windows line endings
    node1
    node2:2222                 # ssh port
    alice@node3
    alice@node4:2222 slots=4   # MPI / DeepSpeed / Horovod style slot count
    [fe80::1]:22
    2001:db8::7                # a bare IPv6 address (no port)

A host may appear more than once: each line is one more placement entry, as MXNet's
``launch.py`` users rely on. ``parse_hostfile`` is pure; ``read_hostfile`` adds the file I/O.
Every error names the file, the line and what was expected.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path

from launchkit.core.placement import machine_key
from launchkit.core.spec import Host
from launchkit.errors import HostfileError

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_USER_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$")
_DIGITS_RE = re.compile(r"^[0-9]+$")

HOST_FORMS = "host, host:port, user@host, user@host:port or [ipv6]:port"


def _port(text: str) -> int:
    if not _DIGITS_RE.match(text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"bad port {text!r}: expected a number from 1 to 65535")
    return int(text)


def _slots(text: str) -> int:
    if not _DIGITS_RE.match(text) or int(text) < 1 or int(text) > 1_000_000:
        raise ValueError(f"bad slots {text!r}: expected a whole number from 1 to 1000000")
    return int(text)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def parse_host(spec: str) -> Host:
    """``[user@]host[:port]`` or ``[user@][ipv6][:port]`` -> Host. Raises ValueError with the reason."""
    user: str | None = None
    rest = spec
    if "@" in spec:
        user, _, rest = spec.rpartition("@")
        if not _USER_RE.match(user):
            raise ValueError(f"bad user name {user!r} in {spec!r}: expected letters, digits, '.', '_' or '-'")
    port: int | None = None
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise ValueError(f"bad host {spec!r}: '[' without ']' (expected [ipv6] or [ipv6]:port)")
        name, after = rest[1:close], rest[close + 1 :]
        if not _is_ipv6(name):
            raise ValueError(f"bad host {spec!r}: {name!r} in brackets is not an IPv6 address")
        if after:
            if not after.startswith(":"):
                raise ValueError(f"bad host {spec!r}: expected ':port' after ']'")
            port = _port(after[1:])
        return Host(name=name, port=port, user=user)
    if rest.count(":") > 1:
        if not _is_ipv6(rest):
            raise ValueError(f"bad host {spec!r}: expected {HOST_FORMS}")
        return Host(name=rest, user=user)
    name, colon, port_text = rest.partition(":")
    if colon:
        port = _port(port_text)
    if not name or len(name) > 253 or not _HOSTNAME_RE.match(name):
        raise ValueError(f"bad host name {name!r}: expected {HOST_FORMS}")
    return Host(name=name, port=port, user=user)


def parse_line(text: str) -> Host | None:
    """One hostfile line (without its newline) -> Host, or None for a blank/comment line."""
    body = text.split("#", 1)[0].strip()
    if not body:
        return None
    words = body.split()
    host = parse_host(words[0])
    slots: int | None = None
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if key == "slots" and eq:
            if slots is not None:
                raise ValueError("slots given twice on one line")
            slots = _slots(value)
        else:
            raise ValueError(f"unknown field {word!r}: expected slots=N after the host")
    return Host(name=host.name, port=host.port, user=host.user, slots=slots)


def parse_hostfile(text: str, path: str = "<hostfile>") -> list[Host]:
    """Parse a whole hostfile. Raises HostfileError(path, line, reason); never anything else."""
    if text.startswith("\ufeff"):
        text = text[1:]
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if "\x00" in raw:
            raise HostfileError(path, number, "NUL byte in line: expected text")
        try:
            host = parse_line(raw)
        except ValueError as exc:
            raise HostfileError(path, number, str(exc)) from None
        if host is not None:
            hosts.append(Host(host.name, host.port, host.user, host.slots, line=number))
    if not hosts:
        raise HostfileError(path, None, "no hosts in file: expected one host per line")
    return hosts


def read_hostfile(path: str | Path) -> list[Host]:
    """Read and parse a hostfile from disk."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise HostfileError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise HostfileError(str(path), None, "is a directory, expected a hostfile") from None
    except OSError as exc:
        raise HostfileError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise HostfileError(str(path), line, "not UTF-8 text: expected a text file") from None
    return parse_hostfile(text, str(path))


def format_host(host: Host) -> str:
    """The hostfile line for ``host`` (inverse of ``parse_line``)."""
    text = str(host)
    if host.port is None and ":" in host.name:
        text = f"{host.user}@{host.name}" if host.user else host.name
    return f"{text} slots={host.slots}" if host.slots is not None else text


def host_key(host: Host) -> tuple[str, int | None, str | None]:
    """Which login a hostfile entry names: the machine (name and port, as placement counts it) and
    the user. Entries with the same key are one host for ``hosts add/remove`` and for the ssh
    backend's one connection per host; slots and the line number are attributes."""
    return (*machine_key(host), host.user)


def unique_hosts(hosts: Sequence[Host]) -> list[Host]:
    """The first entry of each host (by ``host_key``), in hostfile order."""
    seen: dict[tuple[str, int | None, str | None], Host] = {}
    for h in hosts:
        seen.setdefault(host_key(h), h)
    return list(seen.values())
