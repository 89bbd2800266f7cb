"""A node's listeners hold a handshake for every node of the job at once (issue 28).

Every worker connects to a server as the book reaches it, and the book reaches them all at the
same moment: a listener that closed the oldest pending handshakes beyond 64 (``MAX_PENDING``)
closed workers' connections, and a job of 256 workers on one host failed to start ("connection
closed during the handshake", bench/scale_server_real.py). Real listeners and sockets; connections
that never authenticate stand for the workers still in their handshake."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from trainer_core.config import NodeConfig
from trainer_core.node.listen import listen
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport.channel import MAX_PENDING, Channel, Listener, Poller, Trace
from trainer_core.transport.tcp import TcpListener
from trainer_core.transport.unix import UnixListener

SECRET = "server-handshakes-secret"
TRACE = Trace(logging.getLogger("test_server_handshakes"), schema=SCHEMA)
WORKERS = 150


def connect(listener: Listener) -> socket.socket:
    if isinstance(listener, UnixListener):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect("\0" + listener.name)
        return raw
    assert isinstance(listener, TcpListener)
    return socket.create_connection(("127.0.0.1", listener.port))


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_every_worker_may_be_in_its_handshake_at_once(kind: str) -> None:
    listener: Listener = (
        UnixListener("crowd150", SECRET, TRACE, WORKERS)
        if kind == "unix"
        else TcpListener("127.0.0.1", SECRET, TRACE, WORKERS)
    )
    poller = Poller()
    poller.add(listener)
    accepted: list[Channel] = []
    listener.on_accept = accepted.append
    raws = [connect(listener) for _ in range(WORKERS + MAX_PENDING + 2)]
    try:
        deadline = time.monotonic() + 10
        while len(accepted) < len(raws):
            assert time.monotonic() < deadline, f"{len(accepted)} of {len(raws)} accepted"
            poller.serve(lambda m: None, 0.1)
        poller.serve(lambda m: None, 0.01)
        # the workers' and MAX_PENDING more stay; beyond, the oldest go (a flood still cannot hold
        # descriptors); before, every one but the newest 64 was closed
        assert [c.closed for c in accepted] == [True] * 2 + [False] * (WORKERS + MAX_PENDING)
    finally:
        for ch in accepted:
            ch.close()
        for raw in raws:
            raw.close()
        listener.close()


def test_a_nodes_listeners_expect_every_node_of_the_job() -> None:
    """``postoffice.listen`` sizes each listener by the job (every worker and server), before the
    book: the book and the workers' connections arrive together."""
    env = {
        "DMLC_ROLE": "server",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NODE_HOST": "127.0.0.1",
        "DMLC_NUM_SERVER": "3",
        "DMLC_NUM_WORKER": "300",
        "LAUNCHKIT_JOB_SECRET": SECRET,
        "LAUNCHKIT_JOB_ID": "crowd303",
    }
    listeners: list[Listener] = []
    try:
        local, data = listen(NodeConfig.from_environ(env), TRACE, listeners)
        assert local and data and len(listeners) == 2
        assert [lst.handshakes.most for lst in listeners] == [303 + MAX_PENDING] * 2
        assert [lst.handshakes.backlog for lst in listeners] == [303 + MAX_PENDING] * 2
    finally:
        for lst in listeners:
            lst.close()
