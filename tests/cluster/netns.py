"""Helpers for a test cluster of "hosts" made with Linux namespaces, each running a real sshd.

Layout (see docs/testing.md): on the process's subnet 10.231.N.0/24 (tests/cluster/subnets.py: N is
the pytest-xdist worker's number, else 0), a bridge `lkbr<tag>` at 10.231.N.1/24 in the root
namespace; host i (from 1) is network namespace `lkns-<tag>-<i>` with `eth0` at 10.231.N.(10+i)/24,
joined to the bridge by a veth pair whose root-side end is `lkv<tag>h<i>`. Its sshd runs as PID 1
of a new PID namespace, with its own mount (private tmpfs on /root, /dev/shm, /srv and by default
/tmp), IPC and UTS (hostname `node<i>`) namespaces. Keys, configs and logs live in
/run/lkcluster/<tag>/, outside those private mounts.

Only one cluster exists on a subnet at a time: creating one takes the subnet's lock (ClusterLock),
held until the cluster is closed. While holding it, anything of that subnet that is not ours is a
leftover of a crashed run and is swept away.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .sshd import (
    REQUIRED_COMMANDS,
    SSHD,
    ClusterSetupError,
    client_options,
    ensure_privsep_dir,
    keygen,
    port_open,
    require_commands,
    spawn_daemon,
    tail,
    write_sshd_config,
)
from .subnets import (
    BRIDGE_PREFIX,
    NS_PREFIX,
    STATE_ROOT,
    VETH_PREFIX,
    ClusterLock,
    Subnet,
    ip,
    kill_netns_processes,
    links,
    netns_names,
    sweep_stale,
)

MAX_HOSTS = 200  # addresses 10.231.N.11-210; bench/scale.py builds 128
NETNS_COMMANDS = {"ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux", "hostname": "hostname"}
#: Minimal environment for commands run inside a host, so nothing of the test's env leaks in.
HOST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}

# Lists the processes of the host's PID namespace whose environment holds the exact entry $1
# (not zombies, not this scan). Plain sh + coreutils, so it needs nothing installed in the host.
_PIDS_WITH_ENV_SH = r"""
needle=$1
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] && continue
  tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qxF -- "$needle" || continue
  state=$(sed 's/.*) //' "$d/stat" 2>/dev/null | cut -d' ' -f1)
  case "$state" in Z|X|'') continue ;; esac
  echo "$p"
done
"""


def preflight() -> None:
    """Check privileges and tools up front, so a missing one fails with a clear message."""
    if os.geteuid() != 0:
        raise ClusterSetupError(
            "the netns test cluster needs root (network, PID and mount namespaces, veth, bridge)"
        )
    require_commands({**REQUIRED_COMMANDS, **NETNS_COMMANDS})


# -- hosts ----------------------------------------------------------------------------------------


def _parent_pids() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc (this kernel has no /proc/PID/task/TID/children)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


@dataclass
class NetnsHost:
    """One namespace host. `pid` is its sshd's pid as seen from the real machine (PID 1 inside)."""

    index: int
    name: str  # node<i>, also its hostname
    address: str  # 10.231.N.(10+i)
    netns: str  # network namespace name, for `ip netns exec` / `ip -n`
    veth: str  # root-namespace end of its veth pair: `ip link set VETH down` cuts the host off
    dir: Path  # its sshd config, host key and sshd.log (outside the host's private mounts)
    identity: Path
    known_hosts: Path
    port: int = 22
    user: str = "root"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int | None = None

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    def hostfile_line(self) -> str:
        """'root@10.231.N.1I:22', as a launchkit hostfile line."""
        return f"{self.user}@{self.address}:{self.port}"

    def ssh_options(self) -> list[str]:
        return client_options(self.identity, self.known_hosts, self.port)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(
        self, cmd: str | Sequence[str], *, timeout: float = 20, check: bool = False, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside this host: its network, PID, mount, UTS and IPC namespaces.

        `cmd` is a shell line (run with sh -c) or an argv list. It sees the host's own process
        table, hostname and private /root, /srv, /tmp, /dev/shm, and gets a minimal environment
        (HOST_ENV), nothing of the test's. Output is captured as text.
        """
        if self.pid is None or not self.alive():
            raise RuntimeError(f"{self.name} is not running")
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(
            # -r -w: the root and cwd of the host's sshd, which differ from the mount namespace's
            # own root when the tests themselves run in a chroot.
            ["nsenter", "-t", str(self.pid), "-n", "-p", "-m", "-u", "-i", "-r", "-w", "--", *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            env=HOST_ENV,
        )

    def pids_with_env(self, needle: str) -> list[int]:
        """PIDs (as numbered inside this host) of live processes whose environment has the exact
        entry `needle` ("NAME=VALUE"). The scan runs inside the host's PID namespace."""
        proc = self.run(["sh", "-c", _PIDS_WITH_ENV_SH, "pids_with_env", needle], check=True)
        return sorted(int(p) for p in proc.stdout.split())

    def ssh(self, command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run `command` (a remote shell line) through the system ssh client and this host's sshd."""
        return subprocess.run(
            ["ssh", *self.ssh_options(), f"{self.user}@{self.address}", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """Power the host off: SIGKILL its sshd (PID 1 of its PID namespace), which kills every
        process in it. Idempotent. The network namespace and veth stay until the group closes."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        # `unshare --kill-child` takes its child (sshd) down with it.
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class HostGroup:
    """The hosts of one netns cluster, sharing one client key and one known_hosts file."""

    tag: str
    dir: Path
    bridge: str
    subnet: Subnet
    hosts: list[NetnsHost] = field(default_factory=list)
    private_tmp: bool = True
    closed: bool = False
    #: Seconds from holding the subnet's lock to every sshd accepting (lock wait excluded).
    startup_s: float = 0.0
    _lock: ClusterLock | None = field(default=None, repr=False)

    @property
    def identity(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def bridge_address(self) -> str:
        """This machine's address on the hosts' subnet (10.231.N.1): what the hosts reach it by."""
        return self.subnet.bridge_address

    @property
    def cidr(self) -> str:
        """The hosts' subnet, 10.231.N.0/24 (Open MPI's `--mca oob_tcp_if_include`, ...)."""
        return self.subnet.cidr

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def __iter__(self) -> Iterator[NetnsHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> NetnsHost:
        return self.hosts[i]

    def ssh_options(self) -> list[str]:
        """`-p 22 -i KEY -o UserKnownHostsFile=... -o StrictHostKeyChecking=accept-new -o BatchMode=yes`."""
        return client_options(self.identity, self.known_hosts, 22)

    def hostfile_lines(self) -> list[str]:
        return [h.hostfile_line() for h in self.hosts]

    def write_hostfile(self, path: str | os.PathLike[str], slots: int | None = None) -> Path:
        """Write a launchkit hostfile with one `root@ADDRESS:22` line per host (`slots=N` if given)."""
        suffix = f" slots={slots}" if slots is not None else ""
        out = Path(path)
        out.write_text("".join(f"{line}{suffix}\n" for line in self.hostfile_lines()))
        return out

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, n: int, *, private_tmp: bool = True, lock_timeout: float = 30.0, subnet: Subnet | None = None
    ) -> HostGroup:
        """Build `n` hosts on `subnet` (default: this process's, `Subnet.of_process()`), start their
        sshds in parallel and wait until all accept."""
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be between 1 and {MAX_HOSTS}, not {n}")
        preflight()
        subnet = subnet or Subnet.of_process()
        lock = ClusterLock(subnet)
        if not lock.acquire(lock_timeout):
            raise ClusterSetupError(
                f"another test run (pid {lock.holder()}) holds the netns cluster on {subnet.cidr} "
                f"for more than {lock_timeout:g}s; only one may exist per subnet"
            )
        t0 = time.monotonic()
        tag = subnet.new_tag()
        group = cls(
            tag=tag,
            dir=STATE_ROOT / tag,
            bridge=f"{BRIDGE_PREFIX}{tag}",
            subnet=subnet,
            private_tmp=private_tmp,
            _lock=lock,
        )
        try:
            sweep_stale(subnet, keep_tag=tag)
            group.dir.mkdir(mode=0o700)
            group._build(n)
            group.startup_s = time.monotonic() - t0
        except BaseException:
            with contextlib.suppress(Exception):
                group.close()
            raise
        return group

    def _build(self, n: int) -> None:
        ensure_privsep_dir()
        keygen(self.identity, "launchkit-test-client")
        self.known_hosts.touch()
        authorized = self.dir / "authorized_keys"
        shutil.copyfile(self.identity.with_suffix(".pub"), authorized)
        for i in range(1, n + 1):
            hdir = self.dir / f"node{i}"
            hdir.mkdir()
            host = NetnsHost(
                index=i,
                name=f"node{i}",
                address=self.subnet.host_address(i),
                netns=f"{NS_PREFIX}{self.tag}-{i}",
                veth=f"{VETH_PREFIX}{self.tag}h{i}",
                dir=hdir,
                identity=self.identity,
                known_hosts=self.known_hosts,
            )
            self.hosts.append(host)
        # Host keys: one ssh-keygen per host, run concurrently.
        keygens = [
            subprocess.Popen(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(h.dir / "host_key")],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for h in self.hosts
        ]
        for h in self.hosts:
            write_sshd_config(
                h.dir / "sshd_config",
                listen=h.address,
                port=h.port,
                host_key=h.dir / "host_key",
                authorized_keys=authorized,
                pid_file=h.dir / "sshd.pid",
            )
        self._build_network()
        for kg in keygens:
            _, err = kg.communicate(timeout=30)
            if kg.returncode != 0:
                raise ClusterSetupError(f"ssh-keygen failed: {err.decode(errors='replace')}")
        for h in self.hosts:
            self._start_sshd(h)
        self._wait_ready(timeout=max(5.0, 0.5 * n))

    def _build_network(self) -> None:
        # Root namespace: one `ip -batch` for the bridge, the namespaces and the veth pairs.
        root = [
            f"link add {self.bridge} type bridge forward_delay 0",
            f"addr add {self.bridge_address}/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for h in self.hosts:
            root += [
                f"netns add {h.netns}",
                f"link add {h.veth} type veth peer name eth0 netns {h.netns}",
                f"link set {h.veth} master {self.bridge} up",
            ]
        try:
            ip("-batch", "-", stdin="\n".join(root) + "\n")
        except ClusterSetupError as e:
            raise ClusterSetupError(
                f"{e}\n(the netns cluster needs network namespaces, veth and bridge support in the kernel, and root)"
            ) from None
        for h in self.hosts:
            ip(
                "-n",
                h.netns,
                "-batch",
                "-",
                stdin=f"link set lo up\naddr add {h.address}/24 dev eth0\nlink set eth0 up\n",
            )

    def _start_sshd(self, h: NetnsHost) -> None:
        mounts = ["/root", "/dev/shm", "/srv"] + (["/tmp"] if self.private_tmp else [])
        modes = {"/root": "0700", "/srv": "0755"}
        steps = ["set -e", f"hostname {h.name}"]
        steps += [f"mount -t tmpfs -o mode={modes.get(m, '1777')} lk-{h.name} {m}" for m in mounts]
        steps.append(f"exec {SSHD} -D -e -f {h.dir / 'sshd_config'}")
        # `ip netns exec` execs unshare; unshare forks sh (-> sshd) as PID 1 of the new PID
        # namespace and, with --kill-child, takes it down if unshare itself is killed.
        unshare = "unshare --pid --fork --kill-child --mount-proc --mount --ipc --uts --propagation private"
        h.proc = spawn_daemon(
            ["ip", "netns", "exec", h.netns, *unshare.split(), "sh", "-c", "; ".join(steps)], h.log
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.hosts)
        while pending:
            for h in list(pending):
                assert h.proc is not None
                if h.proc.poll() is not None:
                    raise ClusterSetupError(
                        f"{h.name}'s sshd exited with status {h.proc.returncode}; its log:\n{tail(h.log)}"
                    )
                if port_open(h.address, h.port):
                    pending.remove(h)
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{h.name} ({h.address})" for h in pending)
                raise ClusterSetupError(
                    f"sshd did not accept within {timeout:.0f}s on {names}; log of {pending[0].name}:\n"
                    + tail(pending[0].log)
                )
            time.sleep(0.02)
        children = _parent_pids()
        for h in self.hosts:
            assert h.proc is not None
            kids = children.get(h.proc.pid, [])
            if len(kids) != 1:
                raise ClusterSetupError(
                    f"cannot find {h.name}'s sshd under unshare (pid {h.proc.pid}): {kids}"
                )
            h.pid = kids[0]

    def close(self) -> None:
        """Stop every host, delete namespaces, veths, bridge and state dir; release the subnet's lock.

        Safe to call twice and after a partial build; raises at the end if something remained.
        """
        if self.closed:
            return
        self.closed = True
        try:
            for h in self.hosts:
                with contextlib.suppress(Exception):
                    h.stop()
            for h in self.hosts:
                if h.netns in netns_names():
                    kill_netns_processes(h.netns)
                    ip("netns", "delete", h.netns, check=False)
            leftover_links = links((f"{BRIDGE_PREFIX}{self.tag}", f"{VETH_PREFIX}{self.tag}h"))
            for link in leftover_links:
                ip("link", "delete", link, check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
            left = [n for n in netns_names() if n.startswith(f"{NS_PREFIX}{self.tag}-")]
            left += links((f"{BRIDGE_PREFIX}{self.tag}", f"{VETH_PREFIX}{self.tag}h"))
            if left:
                raise RuntimeError(f"netns cluster {self.tag}: could not remove {left}")
        finally:
            if self._lock is not None:
                self._lock.release()
