"""Observing a refusal: on a raw stream socket, the peer closing it (EOF or a reset); on a ZeroMQ
socket, its handshake failing on its monitor. Never silence.

Shared by the security probes (run inside a job's worker, see test_kv_security.py) and the wire
fuzz suite (tests/faults/test_wire_fuzz.py). Standard library only, but for ``handshake_fails``,
which imports pyzmq when called.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

WITHIN = 10.0  # generous: a refusal must be seen within it, never inferred from its passing


def closed_by_peer(sock: socket.socket, within: float = WITHIN) -> bytes | None:
    """Read until the peer closes (EOF or a reset): what it sent before, or ``None`` when it neither
    closed nor went quiet within ``within``."""
    sock.settimeout(within)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        return got
    except TimeoutError:
        return None


def send_until_closed(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; the peer closing before it is all sent is no error here (it is the refusal)."""
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        sock.sendall(data)


def handshake_fails(sock: Any, endpoint: str, messages: list[list[bytes]], within: float = WITHIN) -> bool:
    """Connect the ZeroMQ ``sock`` (monitored from before the connection) and queue ``messages``
    (each a list of frames): whether its ZMTP/CURVE handshake is seen to fail within ``within``
    (``False`` when it succeeds, or nothing is seen)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    failed = {
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    }
    mon = sock.get_monitor_socket()
    try:
        sock.connect(endpoint)
        for m in messages:
            sock.send_multipart(m)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if mon.poll(100):
                event = recv_monitor_message(mon)["event"]
                if event in failed:
                    return True
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return False
        return False
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
