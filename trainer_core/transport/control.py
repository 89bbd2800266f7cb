"""The ZeroMQ channels: CURVE-authenticated ROUTER and DEALER sockets, behind the ``Channel`` interface.

Every socket is a CURVE socket with keys derived from the job secret (``auth.py``): bound ROUTER
sockets are CURVE servers, connecting DEALER sockets are CURVE clients. A message is
``[header, *array_frames]`` (``wire.py``); a ROUTER prefixes the peer's routing identity. This
channel carries the scheduler protocol and heartbeats, and the data messages that use neither the
same-host channel (``unix``) nor the TCP data stream (``tcp``), e.g. every array with
``PS_ENCRYPT=1``. Frames are sent zero-copy by ZeroMQ's I/O thread after ``send`` returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from trainer_core.errors import ConfigError, KVError
from trainer_core.transport import wire
from trainer_core.transport.auth import CurveKeys, derive_keys
from trainer_core.transport.channel import Caps, Channel, Peer, Received, Source, Trace

ZMQ_CAPS = Caps(frames=True)


class Transport:
    """One node's ZeroMQ context and CURVE keys; creates its authenticated channels, which decode
    with ``schema`` (the protocols the node speaks)."""

    def __init__(
        self, secret: str, log: logging.Logger, verbose: int = 0, schema: wire.Schema = wire.OPAQUE
    ) -> None:
        self.keys: CurveKeys = derive_keys(secret)
        self.ctx = zmq.Context()
        self.trace = Trace(log, verbose, schema)
        self._sockets: list[zmq.Socket[Any]] = []

    def bind_router(self, host: str, port: int | None = None) -> tuple[Router, str]:
        """A CURVE-server ROUTER bound to ``host`` (``*`` for all) and ``port`` (``None``: any free
        port), and its endpoint.

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
            self._sockets.remove(sock)
            sock.close(linger=0)
            raise ConfigError(f"cannot bind {address}: {exc}") from None
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.trace.verbose:
            self.trace.log.info("bound %s", endpoint)
        return Router(sock, self.trace), endpoint

    def connect(self, endpoint: str, identity: bytes | None = None) -> ZmqChannel:
        """A CURVE-client DEALER channel connected to ``endpoint`` (``tcp://host:port``)."""
        sock = self._socket(zmq.DEALER)
        sock.curve_serverkey = self.keys.server_public
        sock.curve_publickey = self.keys.client_public
        sock.curve_secretkey = self.keys.client_secret
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:  # a malformed address (a bad DMLC_PS_ROOT_URI, a bad book entry)
            self._sockets.remove(sock)
            sock.close(linger=0)
            raise KVError(f"cannot connect to {endpoint}: {exc}") from None
        if self.trace.verbose:
            self.trace.log.info("connecting to %s", endpoint)
        return ZmqChannel(sock, self.trace)

    def _socket(self, kind: int) -> zmq.Socket[Any]:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 2000)
        self._sockets.append(sock)
        return sock

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket this transport made, then the context."""
        for sock in self._sockets:
            if not sock.closed:
                sock.close(linger=linger_ms)
        self._sockets.clear()
        self.ctx.term()


def _receive(
    sock: zmq.Socket[Any],
    trace: Trace,
    headers: wire.Decoder,
    reply: Callable[[list[zmq.Frame]], tuple[Peer, int] | None],
) -> list[Received]:
    out: list[Received] = []
    while True:
        try:
            parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return out
        whom = reply(parts)
        if whom is None:
            continue
        peer, skip = whom
        header = trace.decode(parts[skip].buffer, headers)
        if header is not None:
            out.append(Received(header, list(parts[skip + 1 :]), peer))


class _ZmqSocket:
    """What a DEALER (``ZmqChannel``) and a ROUTER (``Router``) share as a ``Source``: polling the
    socket, draining it, closing it. ``_peer`` says who answers each message (and where its header is)."""

    sock: zmq.Socket[Any]
    trace: Trace
    headers: wire.Decoder  # a DEALER's own (``Channel``); a ROUTER's peers share the node's
    closed: bool

    def _peer(self, parts: list[zmq.Frame]) -> tuple[Peer, int] | None:
        raise NotImplementedError

    def pollable(self) -> zmq.Socket[Any]:
        return self.sock

    def wait(self, timeout_s: float) -> bool:
        return bool(self.sock.poll(int(timeout_s * 1000), zmq.POLLIN))

    def receive(self, handle: Callable[[Received], None]) -> bool:
        for msg in _receive(self.sock, self.trace, self.headers, self._peer):
            handle(msg)
        return True

    def close(self, flush_s: float = 0.0) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close(linger=int(flush_s * 1000))


class ZmqChannel(_ZmqSocket, Channel):
    """A DEALER socket: a connection to one ROUTER (the scheduler's, or a server's)."""

    def __init__(self, sock: zmq.Socket[Any], trace: Trace) -> None:
        super().__init__(ZMQ_CAPS, trace)
        self.sock = sock

    def _peer(self, parts: list[zmq.Frame]) -> tuple[Peer, int] | None:
        return self, 0

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        if fds:
            raise KVError("a ZeroMQ channel carries no file descriptors")
        if self.trace.on:
            self.trace.sent(header, len(frames))
        self.sock.send_multipart([wire.encode(header), *frames], copy=False)


class Router(_ZmqSocket, Source):
    """A ROUTER socket: messages from many DEALERs; each one's ``reply`` is its sender's ``RouterPeer``."""

    def __init__(self, sock: zmq.Socket[Any], trace: Trace) -> None:
        self.sock = sock
        self.trace = trace
        self.headers = trace.headers

    def _peer(self, parts: list[zmq.Frame]) -> tuple[Peer, int] | None:
        if len(parts) < 2:
            self.trace.log.warning("dropped a message without a header")
            return None
        return RouterPeer(self, parts[0].bytes), 1


class RouterPeer(Peer):
    """One DEALER as a ROUTER sees it: replies go out through the ROUTER to its routing identity."""

    __slots__ = ("ident", "router")
    caps = ZMQ_CAPS

    def __init__(self, router: Router, ident: bytes) -> None:
        self.router = router
        self.ident = ident

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        if fds:
            raise KVError("a ZeroMQ channel carries no file descriptors")
        if self.router.trace.on:
            self.router.trace.sent(header, len(frames))
        self.router.sock.send_multipart([self.ident, wire.encode(header), *frames], copy=False)
