"""Hostfiles: one host per line.

Accepted (see docs/hostfiles.md)::

    # comments, blank lines, Windows line endings
    node1
    node2:2222                 # ssh port
    alice@node3
    alice@node4:2222 slots=4   # MPI / DeepSpeed / Horovod style slot count
    node5 slots=2 max_slots=4  # Open MPI's max_slots / max-slots: accepted, never binding
    [fe80::1]:22
    2001:db8::7                # a bare IPv6 address (no port)

A host may appear more than once: each line is one more placement entry, as MXNet's
``launch.py`` users rely on. ``parse_hostfile`` is pure; ``read_hostfile`` adds the file I/O.
Every error names the file, the line and what was expected.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Sequence
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


_FIELDS = "slots=N (or Open MPI's max_slots=N)"
_AROUND_EQ = re.compile(r"\s*=\s*")


def parse_line(text: str) -> Host | None:
    """One hostfile line (without its newline) -> Host, or None for a blank/comment line.

    After the host: ``slots=N``, and Open MPI's ``max_slots=N`` / ``max-slots=N`` (checked, and
    never binding: placement puts at most ``slots`` processes on a host). Spaces around ``=`` are
    allowed, as Open MPI allows them."""
    body = text.split("#", 1)[0].strip()
    if not body:
        return None
    words = _AROUND_EQ.sub("=", body).split()
    host = parse_host(words[0])
    given: dict[str, int] = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        key = "max_slots" if key == "max-slots" else key
        if key not in ("slots", "max_slots") or not eq:
            raise ValueError(f"unknown field {word!r}: expected {_FIELDS} after the host")
        if key in given:
            raise ValueError(f"{key} given twice on one line")
        given[key] = _slots(value) if key == "slots" else _max_slots(value)
    slots = given.get("slots")
    if slots is not None and given.get("max_slots", slots) < slots:
        raise ValueError(
            f"max_slots={given['max_slots']} is less than slots={slots}: expected max_slots >= slots"
        )
    return Host(name=host.name, port=host.port, user=host.user, slots=slots)


def _max_slots(text: str) -> int:
    try:
        return _slots(text)
    except ValueError:
        raise ValueError(f"bad max_slots {text!r}: expected a whole number from 1 to 1000000") from None


MAX_BYTES = 16 << 20  # a hostfile is read whole: more is not a hostfile (a device that never ends)
UNLIKELY_PORT = 22  # below this, host:N is more likely Horovod's or mpirun's slot count than a port


def hostfile_warnings(hosts: Sequence[Host], path: str = "<hostfile>") -> list[str]:
    """What parses but is likely not what was meant: ``host:N`` with a port no sshd listens on
    and no ``slots=`` is a port for launch.py (kept), but N slots for Horovod and mpirun."""
    out = []
    for h in hosts:
        if h.port is not None and h.port < UNLIKELY_PORT and h.slots is None:
            where = f"{path}:{h.line}" if h.line is not None else path
            out.append(
                f"{where}: '{h}' means ssh port {h.port} (as in MXNet's launch.py), not {h.port} slots "
                f"(Horovod's and mpirun's host:N); for slots write '{h.address} slots={h.port}'"
            )
    return out


def parse_hostfile(text: str, path: str = "<hostfile>", *, allow_empty: bool = False) -> list[Host]:
    """Parse a whole hostfile. Raises HostfileError(path, line, reason); never anything else.
    A file without hosts is one too, unless ``allow_empty`` (a file ``hosts add`` adds to)."""
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
    if not hosts and not allow_empty:
        raise HostfileError(path, None, "no hosts in file: expected one host per line")
    return hosts


def read_text(path: str | Path) -> str:
    """A hostfile's text; HostfileError naming the file (and the line of a byte that is not UTF-8)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)  # /dev/zero or /dev/urandom: read until memory ran out
    except FileNotFoundError:
        raise HostfileError(str(path), None, "no such file" + _removed_cwd(path)) from None
    except IsADirectoryError:
        raise HostfileError(str(path), None, "is a directory, expected a hostfile") from None
    except OSError as exc:
        raise HostfileError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise HostfileError(
            str(path), None, f"more than {MAX_BYTES >> 20} MiB: expected a hostfile (one host per line)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise HostfileError(str(path), line, "not UTF-8 text: expected a text file") from None


def _removed_cwd(path: str | Path) -> str:
    """Why a relative path names nothing when the working directory itself was removed."""
    if Path(path).is_absolute():
        return ""
    try:
        os.getcwd()
    except OSError:
        return " (the current directory was removed)"
    return ""


def read_hostfile(path: str | Path, warn: Callable[[str], None] | None = None) -> list[Host]:
    """Read and parse a hostfile from disk; ``warn`` hears ``hostfile_warnings``."""
    hosts = parse_hostfile(read_text(path), str(path))
    if warn is not None:
        for message in hostfile_warnings(hosts, str(path)):
            warn(message)
    return hosts


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
