"""A ``Peer`` that sends signed metrics reports as UDP datagrams (``dmlc_env.telemetry``).

It carries headers only (``caps.frames`` is false): a header's ``seq`` and its ``body``
(``{"role", "rank", "t", "m": {figure: number}}``) become one datagram, signed with the key
derived from the job's secret. The socket is non-blocking and nothing waits for an answer: a
datagram that cannot leave at once (a full buffer, an endpoint gone, ``ECONNREFUSED`` from an
earlier one) is dropped and counted in ``dropped``. ``send`` never raises: what it carries is
telemetry, and training never waits for it or fails because of it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from dmlc_env import telemetry
from trainer_core.transport import wire
from trainer_core.transport.channel import Caps, Peer


def parse_address(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ``ValueError`` when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, not {addr!r}")
    return host.strip("[]"), int(port)


class DatagramPeer(Peer):
    """Where one process's metrics reports go."""

    caps = Caps(frames=False)

    def __init__(self, address: str, secret: str, job_id: str) -> None:
        host, port = parse_address(address)
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self._sock = socket.socket(info[0], socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._sock.connect(info[4])  # the kernel then drops datagrams from anyone else
        self._key = telemetry.metrics_key(secret)
        self.job_id = job_id
        self.pid = os.getpid()
        self.sent = 0
        self.dropped = 0

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        if self.closed:
            return
        body = header.body
        try:
            data = telemetry.encode(
                self._key,
                telemetry.Report(
                    job=self.job_id,
                    role=str(body.get("role", "")),
                    rank=int(body.get("rank", 0)),
                    seq=header.seq,
                    t=float(body.get("t", time.time())),
                    figures=dict(body.get("m", {})),
                    pid=self.pid,
                ),
            )
            self._sock.send(data)
            self.sent += 1
        except (OSError, ValueError, TypeError):
            self.dropped += 1

    def close(self) -> None:
        self.closed = True
        self._sock.close()
