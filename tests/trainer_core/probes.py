"""Observing a refusal on a raw stream socket: the peer closing it (EOF or a reset), never silence.

Shared by the security probes (run inside a job's worker, see test_kv_security.py) and the wire
fuzz suite (tests/faults/test_wire_fuzz.py). Standard library only.
"""

from __future__ import annotations

import contextlib
import socket

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
