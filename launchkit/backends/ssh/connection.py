"""ssh connections: fabric's ``Connection``, configured the way ``ssh`` would be.

fabric reads ``~/.ssh/config`` (or ``SshOptions.config_file``): a ``Host`` alias's ``HostName``,
``User``, ``Port`` and ``IdentityFile``, and ``ProxyJump`` (each hop one more ``Connection``) or
``ProxyCommand``. launchkit adds: ``user@host:port`` from the hostfile and ``--ssh-port`` win over
the config file; ``-i/--identity`` is tried first, on every hop; ``~/.ssh/id_*`` only when no
identity is named (as ``ssh`` does); a running ssh-agent always. Host keys, on every hop:
``accept-new`` by default (an unknown host's key is appended to the known-hosts file, a changed
key is refused), ``strict`` as an option (unknown hosts are refused); never disabled. Failures
are ``BackendError`` naming the hostfile entry.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import fabric
import paramiko

from launchkit.backends.ssh.options import SshOptions
from launchkit.core.spec import Host
from launchkit.errors import EXIT_USAGE, BackendError

MAX_PARALLEL = 32  # hosts contacted at once
KEEPALIVE = 5  # seconds between ssh keepalives on an open connection
_T = TypeVar("_T")
_R = TypeVar("_R")


def on_each(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``fn`` over ``items`` in parallel, at most MAX_PARALLEL at a time, results in order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        return list(pool.map(fn, items))


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """``StrictHostKeyChecking=accept-new``: append an unknown host's key to the known-hosts file."""

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


_POLICIES: dict[Path, _AcceptNew] = {}
_POLICIES_LOCK = threading.Lock()


def _accept_new(path: Path) -> _AcceptNew:
    """One policy (one lock) per known-hosts file, shared by parallel connections."""
    with _POLICIES_LOCK:
        return _POLICIES.setdefault(path, _AcceptNew(path))


class _Shared(fabric.Config):
    """The fabric settings of one launch, with the known-hosts files parsed once for every
    connection (``host_keys``, ``system_keys``: read-only once made). Each connection parsed them
    again before: at 128 hosts, 128 parses of a 128-line file (paramiko checks every line against
    those before it), 0.8 s of the launcher's CPU while the handshakes wanted the cores."""

    host_keys: paramiko.HostKeys | None = None  # a real attribute, not a config key
    system_keys: paramiko.HostKeys | None = None

    def clone(self, into: Any = None) -> Any:
        new = super().clone(into=into)
        new.host_keys, new.system_keys = self.host_keys, self.system_keys
        return new


def _host_keys(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.is_file():
        try:
            keys.load(str(path))
        except Exception as exc:
            raise BackendError(
                "ssh", f"{path}: cannot read known hosts: {exc}", exit_code=EXIT_USAGE
            ) from None
    return keys


def fabric_config(opts: SshOptions) -> fabric.Config:
    """The fabric settings every connection of a launch shares: the ssh config file, parsed once
    (only that one, as before: not ``/etc/ssh/ssh_config``, and no fabric/invoke config files),
    ``-i``, and the known-hosts files, parsed once. Given as an object, so that fabric's
    ``clone`` does not parse the file again."""
    path = opts.config_path()
    try:
        parsed = paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()
    except Exception as exc:
        raise BackendError(
            "ssh", f"{path}: cannot read the ssh config: {exc}", exit_code=EXIT_USAGE
        ) from None
    overrides: dict[str, Any] = {}
    if opts.identity:
        overrides["connect_kwargs"] = {"key_filename": [str(identity_file(opts.identity))]}
    config = _Shared(ssh_config=parsed, lazy=True, overrides=overrides)
    config.host_keys = _host_keys(opts.known_hosts_path())
    try:
        config.system_keys = _host_keys(Path("~/.ssh/known_hosts").expanduser())
    except BackendError:  # as paramiko's load_system_host_keys: an unreadable one is skipped
        config.system_keys = paramiko.HostKeys()
    return config


def identity_file(identity: str) -> Path:
    """``-i``'s key file, or a usage error (exit 2) that names it: a file that is not there or
    cannot be read is the user's to fix, not a connection failure of every host."""
    path = Path(identity).expanduser()
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc)).lower()
        raise BackendError(
            "ssh", f"-i {identity}: cannot read the key file {path}: {why}", exit_code=EXIT_USAGE
        ) from None
    return path


def _set_up(conn: fabric.Connection, opts: SshOptions, shared: _Shared) -> None:
    """launchkit's host-key policy, identities and timeouts on ``conn`` and every jump host."""
    known = opts.known_hosts_path()
    hop: Any = conn
    while isinstance(hop, fabric.Connection):
        client = hop.client
        # the launch's parsed known hosts, shared: paramiko only looks them up (a host missing from
        # them goes to the policy, which appends it to the file, never to these)
        client._system_host_keys = shared.system_keys
        client._host_keys = shared.host_keys
        client._host_keys_filename = None  # we append new keys ourselves, never rewrite the file
        policy = paramiko.RejectPolicy() if opts.strict_host_keys else _accept_new(known)
        client.set_missing_host_key_policy(policy)
        keys = list(
            dict.fromkeys(str(Path(k).expanduser()) for k in hop.connect_kwargs.get("key_filename") or ())
        )
        t = opts.connect_timeout
        hop.connect_kwargs = {
            "key_filename": keys,
            "look_for_keys": not keys,
            "allow_agent": True,
            "timeout": t,
            "banner_timeout": t,
            "auth_timeout": t,
        }
        hop.connect_timeout = None  # fabric's would be whole seconds; ours is in connect_kwargs
        hop = hop.gateway


def connection(host: Host, opts: SshOptions, config: fabric.Config | None = None) -> fabric.Connection:
    """A fabric ``Connection`` for one hostfile entry, not yet open (``open`` opens it); ``config``
    is ``fabric_config``'s, made once for every connection of a launch."""
    shared = config if isinstance(config, _Shared) else fabric_config(opts)
    try:
        conn = fabric.Connection(
            host.name, user=host.user, port=host.port or opts.port, config=shared.clone()
        )
    except BackendError:
        raise
    except Exception as exc:  # a bad ProxyJump, Port or Match line in the ssh config
        raise BackendError("ssh", f"{host}: {opts.config_path()}: {exc}", exit_code=EXIT_USAGE) from None
    _jump_in_order(conn)
    _set_up(conn, opts, shared)
    return conn


def _jump_in_order(conn: fabric.Connection) -> None:
    """``ProxyJump a,b`` means: reach ``a`` first, then ``b`` through it, then the host through ``b``.
    fabric 3.2 links the hops the other way round (the host's gateway is ``a``, reached through
    ``b``); put them in ssh's order."""
    hops: list[Any] = []
    hop = conn.gateway
    while isinstance(hop, fabric.Connection):
        hops.append(hop)
        hop = hop.gateway
    if len(hops) < 2 or "proxyjump" not in conn.ssh_config:
        return
    hops.reverse()
    conn.gateway = hops[0]
    for near, far in itertools.pairwise(hops):
        near.gateway = far
    hops[-1].gateway = None


def describe(host: Host, conn: fabric.Connection, opts: SshOptions, exc: BaseException) -> str:
    """What went wrong reaching ``host``, for the user (prefixed with the hostfile entry)."""
    if isinstance(exc, BackendError):
        return exc.message.removeprefix("ssh: ")
    gateway = conn.gateway
    if isinstance(gateway, fabric.Connection) and not gateway.is_connected:
        return describe(host, gateway, opts, exc).replace(
            f"{host}: ", f"{host}: jump host {gateway.host}: ", 1
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        which = "" if exc.hostname in (conn.host, f"[{conn.host}]:{conn.port}") else f" of {exc.hostname}"
        return f"{host}: host key{which} does not match {opts.known_hosts_path()} (refusing to connect; fix known_hosts)"
    if isinstance(exc, paramiko.ChannelException) and isinstance(gateway, fabric.Connection):
        return f"{host}: jump host {gateway.host} cannot reach {conn.host}:{conn.port}: {exc.text}"
    if isinstance(exc, paramiko.SSHException):
        return f"{host}: {exc}"
    if isinstance(exc, OSError):
        return f"{host}: cannot connect: {exc.strerror or exc}"
    return f"{host}: {type(exc).__name__}: {exc}"


def open_connection(host: Host, conn: fabric.Connection, opts: SshOptions) -> float:
    """Open ``conn`` (and its jump hosts); returns the milliseconds it took. Raises BackendError."""
    t0 = time.monotonic()
    try:
        _open_hops(conn, opts.connect_timeout)
        conn.open()
    except Exception as exc:
        message = describe(host, conn, opts, exc)
        close(conn)
        raise BackendError("ssh", message) from None
    conn.transport.set_keepalive(KEEPALIVE)
    return (time.monotonic() - t0) * 1000


def _open_hops(conn: fabric.Connection, timeout: float) -> None:
    """Open the jump hosts first, outermost first, each with ``timeout`` for the channels opened
    through it (fabric opens the channel to the next hop with paramiko's default, one hour)."""
    gateway = conn.gateway
    if isinstance(gateway, fabric.Connection):
        _open_hops(gateway, timeout)
        gateway.open()
        gateway.transport.channel_timeout = timeout


def round_trip_ms(host: Host, conn: fabric.Connection, opts: SshOptions) -> float:
    """One ssh round trip on an open connection, in ms: a session channel opened (the server
    confirms it; nothing runs) and closed. Raises BackendError after ``connect_timeout``."""
    t0 = time.monotonic()
    try:
        conn.transport.open_session(timeout=opts.connect_timeout).close()
    except Exception as exc:
        raise BackendError("ssh", describe(host, conn, opts, exc)) from None
    return (time.monotonic() - t0) * 1000


def connect(host: Host, opts: SshOptions, config: fabric.Config | None = None) -> fabric.Connection:
    """An open, authenticated ``fabric.Connection``; raises BackendError naming the host."""
    conn = connection(host, opts, config)
    open_connection(host, conn, opts)
    return conn


def close(conn: fabric.Connection) -> None:
    """Close ``conn`` and the jump hosts it went through (fabric closes only the last hop)."""
    hop: Any = conn
    while isinstance(hop, fabric.Connection):
        with contextlib.suppress(Exception):
            hop.close()
        with contextlib.suppress(Exception):
            hop.client.close()  # also a transport whose authentication failed
        hop = hop.gateway
