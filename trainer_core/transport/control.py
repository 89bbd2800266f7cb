"""ZeroMQ sockets: bind, connect, send, receive. The only module that touches sockets.

Every socket is a CURVE socket with keys derived from the job secret (``auth.py``): bound
ROUTER sockets are CURVE servers, connecting DEALER sockets are CURVE clients. Messages are
``[header, *array_frames]`` (``wire.py``); a ROUTER prefixes the peer's routing identity.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from trainer_core.errors import ConfigError, WireError
from trainer_core.transport import wire
from trainer_core.transport.auth import CurveKeys, derive_keys


@dataclass
class Received:
    """One received, validated message: ``ident`` is the peer's routing id on ROUTER sockets
    (or the same-host connection it came from, see ``unixsock``)."""

    ident: Any
    header: wire.Header
    frames: list[Any]  # zmq.Frame, or tcpchan.Payload: each has ``.buffer``


class Transport:
    """One node's ZeroMQ context and CURVE keys; creates its authenticated sockets."""

    def __init__(self, secret: str, log: logging.Logger, verbose: int = 0) -> None:
        self.keys: CurveKeys = derive_keys(secret)
        self.ctx = zmq.Context()
        self.log = log
        self.verbose = verbose
        self._sockets: list[zmq.Socket[Any]] = []

    def bind_router(self, host: str, port: int | None = None) -> tuple[zmq.Socket[Any], str]:
        """A CURVE-server ROUTER bound to ``host`` (``*`` for all) and ``port`` (``None``: any free port).

        A plain ``tcp://`` bind (libzmq sets SO_REUSEADDR), so a port the launcher holds reserved
        with a bound, non-listening SO_REUSEADDR socket can be taken over.
        """
        sock = self._socket(zmq.ROUTER)
        sock.curve_server = True
        sock.curve_secretkey = self.keys.server_secret
        sock.curve_publickey = self.keys.server_public
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        address = f"tcp://{host}:{'*' if port is None else port}"
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            raise ConfigError(f"cannot bind {address}: {exc}") from None
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.verbose:
            self.log.info("bound %s", endpoint)
        return sock, endpoint

    def connect_dealer(self, endpoint: str, identity: bytes | None = None) -> zmq.Socket[Any]:
        """A CURVE-client DEALER connected to ``endpoint`` (``tcp://host:port``)."""
        sock = self._socket(zmq.DEALER)
        sock.curve_serverkey = self.keys.server_public
        sock.curve_publickey = self.keys.client_public
        sock.curve_secretkey = self.keys.client_secret
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(endpoint)
        if self.verbose:
            self.log.info("connecting to %s", endpoint)
        return sock

    def _socket(self, kind: int) -> zmq.Socket[Any]:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 2000)
        self._sockets.append(sock)
        return sock

    def send(
        self,
        sock: zmq.Socket[Any],
        header: wire.Header,
        frames: Sequence[Any] = (),
        ident: bytes | None = None,
    ) -> None:
        """Send ``[ident?, header, *frames]``; array frames go zero-copy."""
        parts: list[Any] = [] if ident is None else [ident]
        parts.append(wire.encode(header))
        parts.extend(frames)
        self.trace_send(header, len(frames))
        sock.send_multipart(parts, copy=False)

    def recv(self, sock: zmq.Socket[Any], router: bool) -> Received | None:
        """Receive one message without blocking; ``None`` when nothing is there or it was malformed (dropped)."""
        try:
            parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        ident: bytes | None = None
        if router:
            if len(parts) < 2:
                self.log.warning("dropped a message without a header")
                return None
            ident = parts[0].bytes
            parts = parts[1:]
        try:
            header = wire.decode(parts[0].buffer)
        except WireError as exc:
            self.log.warning("dropped a malformed message: %s", exc)
            return None
        self.trace_recv(header)
        return Received(ident=ident, header=header, frames=list(parts[1:]))

    def trace_send(self, header: wire.Header, frames: int) -> None:
        """Log a message sent (``PS_VERBOSE=2``), on any channel."""
        if self.verbose >= 2:
            self.log.debug(
                "send %s seq=%d entries=%d frames=%d", header.op, header.seq, len(header.entries), frames
            )

    def trace_recv(self, header: wire.Header) -> None:
        """Log a message received (``PS_VERBOSE=2``), on any channel."""
        if self.verbose >= 2:
            self.log.debug("recv %s seq=%d from %s", header.op, header.seq, header.src)

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket this transport made, then the context."""
        for sock in self._sockets:
            if not sock.closed:
                sock.close(linger=linger_ms)
        self._sockets.clear()
        self.ctx.term()


def poll(sockets: Sequence[zmq.Socket[Any]], timeout_s: float) -> list[zmq.Socket[Any]]:
    """The sockets among ``sockets`` with a message waiting, after at most ``timeout_s``."""
    if len(sockets) == 1:
        return list(sockets) if sockets[0].poll(int(timeout_s * 1000), zmq.POLLIN) else []
    poller = zmq.Poller()
    for s in sockets:
        poller.register(s, zmq.POLLIN)
    return [s for s, _ in poller.poll(int(timeout_s * 1000))]


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux), or ``ConfigError`` naming it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
    except OSError:
        raise ConfigError(f"DMLC_INTERFACE={name!r}: no such interface with an IPv4 address") from None
    finally:
        s.close()
    return socket.inet_ntoa(packed[20:24])


def bind_and_publish_hosts(interface: str | None, node_host: str | None) -> tuple[str, str]:
    """(host to bind, host to publish): the interface's address, else ``DMLC_NODE_HOST``, else this host's name."""
    if interface:
        ip = interface_address(interface)
        return ip, ip
    if node_host:
        try:
            ip = socket.gethostbyname(node_host)
        except OSError:
            return "*", node_host
        return ("*", node_host) if not _is_local(ip) else (ip, ip)
    name = socket.gethostname()
    try:
        return "*", socket.gethostbyname(name)
    except OSError:
        return "*", name


def _is_local(ip: str) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
    except OSError:
        return False
    finally:
        s.close()
    return True
