"""ssh connections with paramiko, configured the way ``ssh`` would be.

Honours ``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyCommand), ``user@host:port``
from the hostfile, ``--ssh-port``, ``-i/--identity`` and a running ssh-agent. Host keys:
``accept-new`` by default (an unknown host's key is recorded in the known-hosts file, a changed
key is refused), ``strict`` as an option (unknown hosts are refused); never disabled.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from launchkit.core.spec import Host
from launchkit.errors import BackendError

MAX_PARALLEL = 32  # hosts contacted at once
_T = TypeVar("_T")
_R = TypeVar("_R")


def on_each(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``fn`` over ``items`` in parallel, at most MAX_PARALLEL at a time, results in order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        return list(pool.map(fn, items))


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None  # --ssh-port: default for hosts without their own port
    identity: str | None = None  # -i/--identity
    known_hosts: str | None = None  # default ~/.ssh/known_hosts
    strict_host_keys: bool = False
    connect_timeout: float = 10.0
    config_file: str | None = None  # default ~/.ssh/config

    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def ssh_command(self, host: Host) -> list[str]:
        """The system ``ssh`` argv prefix with the same options (for rsync's ``-e``)."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.connect_timeout)}"]
        argv += ["-o", f"StrictHostKeyChecking={'yes' if self.strict_host_keys else 'accept-new'}"]
        argv += ["-o", f"UserKnownHostsFile={self.known_hosts_path()}"]
        port = host.port or self.port
        if port:
            argv += ["-p", str(port)]
        if self.identity:
            argv += ["-i", str(Path(self.identity).expanduser())]
        if self.config_file:
            argv += ["-F", self.config_file]
        return argv


@dataclass(frozen=True)
class Resolved:
    hostname: str
    port: int
    user: str
    identities: tuple[str, ...]
    proxy_command: str | None


def resolve(host: Host, opts: SshOptions) -> Resolved:
    """Combine the hostfile entry, the flags and ~/.ssh/config (the entry and flags win)."""
    import paramiko

    cfg: dict[str, Any] = {}
    path = Path(opts.config_file or Path.home() / ".ssh" / "config").expanduser()
    if path.is_file():
        with contextlib.suppress(Exception):
            cfg = dict(paramiko.SSHConfig.from_path(str(path)).lookup(host.name))
    identities = [opts.identity] if opts.identity else list(cfg.get("identityfile", []))
    return Resolved(
        hostname=str(cfg.get("hostname", host.name)),
        port=int(host.port or opts.port or cfg.get("port", 22)),
        user=str(host.user or cfg.get("user") or os.environ.get("USER") or "root"),
        identities=tuple(str(Path(i).expanduser()) for i in identities if i),
        proxy_command=cfg.get("proxycommand"),
    )


class _AcceptNew:
    """paramiko policy for StrictHostKeyChecking=accept-new: record unknown keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}"
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if line in self.path.read_text().splitlines():
                    return
            with open(self.path, "a") as f:
                f.write(line + "\n")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


_POLICIES: dict[Path, _AcceptNew] = {}
_POLICIES_LOCK = threading.Lock()


def _accept_new(path: Path) -> _AcceptNew:
    """One policy (one lock) per known-hosts file, shared by parallel connections."""
    with _POLICIES_LOCK:
        return _POLICIES.setdefault(path, _AcceptNew(path))


def connect(host: Host, opts: SshOptions) -> Any:
    """An authenticated ``paramiko.SSHClient``; raises BackendError naming the host."""
    import paramiko

    r = resolve(host, opts)
    client = paramiko.SSHClient()
    known = opts.known_hosts_path()
    with contextlib.suppress(OSError):
        client.load_system_host_keys()
    if known.is_file():
        try:
            client.load_host_keys(str(known))
        except Exception as exc:
            raise BackendError("ssh", f"{known}: cannot read known hosts: {exc}", exit_code=2) from None
    client._host_keys_filename = None  # we append new keys ourselves, never rewrite the file
    if opts.strict_host_keys:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(_accept_new(known))
    sock = paramiko.ProxyCommand(r.proxy_command) if r.proxy_command else None
    try:
        client.connect(
            r.hostname,
            port=r.port,
            username=r.user,
            key_filename=list(r.identities) or None,
            allow_agent=True,
            look_for_keys=not r.identities,
            timeout=opts.connect_timeout,
            banner_timeout=opts.connect_timeout,
            auth_timeout=opts.connect_timeout,
            sock=sock,
        )
    except paramiko.BadHostKeyException:
        raise BackendError(
            "ssh", f"{host}: host key does not match {known} (refusing to connect; fix known_hosts)"
        ) from None
    except paramiko.SSHException as exc:
        raise BackendError("ssh", f"{host}: {exc}") from None
    except OSError as exc:
        raise BackendError("ssh", f"{host}: cannot connect: {exc.strerror or exc}") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(5)
    return client


def run(client: Any, argv: list[str], stdin: bytes = b"", timeout: float = 30.0) -> tuple[int, bytes, bytes]:
    """Run one command (an argv, quoted for the remote shell) and collect its output."""
    chan = client.get_transport().open_session(timeout=timeout)
    chan.settimeout(timeout)
    chan.exec_command(shlex.join(argv))
    if stdin:
        chan.sendall(stdin)
    chan.shutdown_write()
    out, err = bytearray(), bytearray()
    stdout, stderr = chan.makefile("rb"), chan.makefile_stderr("rb")
    out += stdout.read()
    err += stderr.read()
    code = chan.recv_exit_status()
    chan.close()
    return code, bytes(out), bytes(err)
