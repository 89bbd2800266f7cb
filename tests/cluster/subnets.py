"""The namespace hosts' subnets: which one a test process uses, the lock that lets one cluster at a
time use it, and the sweep of what crashed runs left on it (see docs/testing.md).

Every pytest-xdist worker has a subnet of its own, ``10.231.N.0/24`` with N its number (``gw0``: 0,
``gw1``: 1; a run without xdist, or any other process: 0), so the namespace tests of different
workers run side by side. A cluster's names carry N in its tag (``<N>-<4 hex digits>``: namespaces
``lkns-<tag>-<i>``, bridge ``lkbr<tag>``, veths ``lkv<tag>h<i>``, state dir
``/run/lkcluster/<tag>/``), so the sweep of one subnet never touches another's live cluster. A tag
of 4 hex digits alone (the names before subnets were split) counts as subnet 0.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .sshd import ClusterSetupError

STATE_ROOT = Path("/run/lkcluster")
NS_PREFIX = "lkns-"
BRIDGE_PREFIX = "lkbr"
VETH_PREFIX = "lkv"
NETWORK = "10.231"
#: Subnets 10.231.0-99.0/24: a veth's name (``lkv99-abcdh200``) stays within Linux's 15 characters.
MAX_SUBNETS = 100
_TAG = re.compile(r"(?:(\d+)-)?([0-9a-f]{4})")
_XDIST_WORKER = re.compile(r"gw(\d+)")


@dataclass(frozen=True)
class Subnet:
    """One of the namespace hosts' subnets: ``10.231.<index>.0/24``, bridge at ``.1``, host i at ``.(10+i)``."""

    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_SUBNETS:
            raise ValueError(f"subnet index {self.index}: expected 0 to {MAX_SUBNETS - 1} (10.231.N.0/24)")

    @classmethod
    def of_process(cls, environ: Mapping[str, str] = os.environ) -> Subnet:
        """This process's subnet: its pytest-xdist worker's number (``PYTEST_XDIST_WORKER``, which
        the worker's children inherit), else 0."""
        worker = _XDIST_WORKER.fullmatch(environ.get("PYTEST_XDIST_WORKER", ""))
        return cls(int(worker.group(1)) if worker else 0)

    @property
    def prefix(self) -> str:
        """``10.231.N``: the addresses' first three parts."""
        return f"{NETWORK}.{self.index}"

    @property
    def cidr(self) -> str:
        """``10.231.N.0/24``, e.g. for Open MPI's ``--mca oob_tcp_if_include``."""
        return f"{self.prefix}.0/24"

    @property
    def bridge_address(self) -> str:
        """The launcher's side of the bridge, ``10.231.N.1``: what the hosts reach this machine by."""
        return f"{self.prefix}.1"

    def host_address(self, i: int) -> str:
        """Host ``i``'s (from 1) address, ``10.231.N.(10+i)``."""
        return f"{self.prefix}.{10 + i}"

    def new_tag(self) -> str:
        return f"{self.index}-{secrets.token_hex(2)}"


def tag_subnet(tag: str) -> int | None:
    """The subnet index a cluster tag belongs to (0 for a tag without one), None if it is no tag."""
    m = _TAG.fullmatch(tag)
    return None if m is None else int(m.group(1) or 0)


def tag_of(name: str) -> str | None:
    """The cluster tag in a namespace, bridge, veth or state dir name, None if it has none."""
    for pattern in (rf"{NS_PREFIX}(.+)-\d+", rf"{BRIDGE_PREFIX}(.+)", rf"{VETH_PREFIX}(.+)h\d+", r"(.+)"):
        m = re.fullmatch(pattern, name)
        if m and tag_subnet(m.group(1)) is not None:
            return m.group(1)
    return None


# -- the lock -------------------------------------------------------------------------------------


class ClusterLock:
    """At most one netns cluster per subnet and network namespace.

    The lock is a bound abstract unix socket named after the subnet: its name is scoped to the
    network namespace, the very thing the clusters compete for, so it also holds between a
    chroot/container sharing the machine's network and the machine itself; and the kernel drops it
    when the holder dies, so a crashed run never blocks the next one. The holder's pid is noted in
    /run/lkcluster/lock-N.
    """

    def __init__(self, subnet: Subnet) -> None:
        self.subnet = subnet
        self.name = f"\0launchkit-test-cluster-{subnet.cidr}".encode()
        STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._note = STATE_ROOT / f"lock-{subnet.index}"
        self._sock: socket.socket | None = None

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec: not inherited
            try:
                sock.bind(self.name)
            except OSError as e:
                sock.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
                continue
            self._sock = sock
            with contextlib.suppress(OSError):
                self._note.write_text(f"{os.getpid()}\n")
            return True

    def holder(self) -> str:
        try:
            return self._note.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()  # closing the socket frees the name
            self._sock = None


# -- what exists, and the sweep -------------------------------------------------------------------


def ip(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; on failure raise ClusterSetupError with ip's message."""
    proc = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        what = " ".join(args) if stdin is None else f"{' '.join(args)} <<{stdin!r}"
        raise ClusterSetupError(f"`ip {what}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def kill_netns_processes(netns: str) -> None:
    for pid in ip("netns", "pids", netns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def links(prefixes: tuple[str, ...]) -> list[str]:
    out = ip("-o", "link", "show", check=False).stdout
    names = [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)[@:]", out, re.M)]
    return [n for n in names if n.startswith(prefixes)]


def netns_names() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _leftovers() -> list[tuple[str, str, str]]:
    """(kind, name, tag) of every namespace, link and state dir with the cluster prefixes."""
    found = [("netns", n) for n in netns_names() if n.startswith(NS_PREFIX)]
    found += [("link", n) for n in links((BRIDGE_PREFIX, VETH_PREFIX))]
    if STATE_ROOT.is_dir():
        found += [("dir", str(d)) for d in STATE_ROOT.iterdir() if d.is_dir()]
    return [(kind, name, tag) for kind, name in found if (tag := tag_of(Path(name).name)) is not None]


def sweep_stale(subnet: Subnet, keep_tag: str | None = None) -> list[str]:
    """Remove the namespaces, links and state dirs of `subnet`'s clusters, except `keep_tag`'s.

    Call only while holding the subnet's ClusterLock (then nothing else on it is live). Returns
    what was removed.
    """
    removed: list[str] = []
    for kind, name, tag in _leftovers():
        if tag == keep_tag or tag_subnet(tag) != subnet.index:
            continue
        if kind == "netns":
            kill_netns_processes(name)
            ip("netns", "delete", name, check=False)
        elif kind == "link":
            ip("link", "delete", name, check=False)
        else:
            shutil.rmtree(name, ignore_errors=True)
        removed.append(f"{kind} {name}")
    return removed


def sweep_if_idle() -> list[str]:
    """Session-start sweep: clean the leftovers of crashed runs on every subnet no live run holds."""
    removed: list[str] = []
    for index in sorted({tag_subnet(tag) or 0 for _, _, tag in _leftovers()}):
        subnet = Subnet(index)
        lock = ClusterLock(subnet)
        if lock.acquire(timeout=0):
            try:
                removed += sweep_stale(subnet)
            finally:
                lock.release()
    return removed
