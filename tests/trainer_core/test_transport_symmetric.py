"""Symmetric channels (transport/outbox.py, docs/wire.md "Channels"): either end of a channel may
send while it receives, whichever end connected, without deadlock.

A ring of 5 nodes, each with its own thread, each connected to its right neighbour (so every
node holds one connecting end and one accepting end): every node posts a large message to both
neighbours at once and then receives one from each. Were sends synchronous and unbuffered, every
node would wait in its send for a neighbour that is itself waiting in its send.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.trainer_core.chanpair import accept_pair
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel, Poller, Received, Trace
from trainer_core.transport.devshm import MemBuffer
from trainer_core.transport.memory import MemoryChannel
from trainer_core.transport.tcp import TcpChannel, TcpListener
from trainer_core.transport.unix import UnixChannel, UnixListener

LOG = logging.getLogger("test_transport_symmetric")  # channels of no protocol: any kind, no entries
SECRET = "ring-test-secret"
NODES = 5
BOUND_S = 60.0  # what "completes" means here: far above the second or so it takes
BIG = 24 << 20  # bytes of a framed message: far beyond a socket's buffers
BIG_HEADER = 900_000  # characters of a header-only message (the same-host channel): above its buffer


def _ring(kind: str) -> list[tuple[Channel, Channel]]:
    """Per node: (the end reaching its right neighbour, the end reaching its left one)."""
    trace = Trace(LOG)
    links: list[tuple[Channel, Channel]] = []  # link i: node i's connecting end, node i+1's accepted end
    for _ in range(NODES):
        if kind == "memory":
            a, b = MemoryChannel.pair(log=LOG)
            links.append((a, b))
        elif kind == "tcp":
            tl = TcpListener("127.0.0.1", SECRET, trace)
            try:
                links.append(
                    accept_pair(
                        tl, lambda tl=tl: TcpChannel.connect(f"tcp://127.0.0.1:{tl.port}", SECRET, trace)
                    )
                )
            finally:
                tl.close()
        else:
            ul = UnixListener(f"ring{os.getpid()}", SECRET, trace)
            try:
                links.append(accept_pair(ul, lambda ul=ul: UnixChannel.connect(ul.name, SECRET, trace)))
            finally:
                ul.close()
    return [(links[i][0], links[(i - 1) % NODES][1]) for i in range(NODES)]


@pytest.fixture(params=["memory", "unix", "tcp"])
def ring(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[tuple[Channel, Channel]]]]:
    nodes = _ring(request.param)
    yield request.param, nodes
    for right, left in nodes:
        right.close()
        left.close()


def _message(kind: str, rank: int, to: str) -> tuple[wire.Header, list[np.ndarray]]:
    if kind == "unix":  # headers only: the size is in the header
        return wire.Header("ring", rank, f"node {rank}", body={"to": to, "pad": "x" * BIG_HEADER}), []
    return wire.Header("ring", rank, f"node {rank}", body={"to": to}), [np.full(BIG // 4, rank, np.int32)]


def test_a_ring_where_every_node_sends_both_ways_at_once_completes(
    ring: tuple[str, list[tuple[Channel, Channel]]],
) -> None:
    kind, nodes = ring
    got: list[dict[str, tuple[int, int]]] = [{} for _ in range(NODES)]
    errors: list[BaseException] = []
    done = [threading.Event() for _ in range(NODES)]

    def node(rank: int) -> None:
        right, left = nodes[rank]
        try:
            for ch, to in ((right, "right"), (left, "left")):  # both at once, then receive
                header, frames = _message(kind, rank, to)
                ch.post(header, frames)
            poller = Poller()
            poller.add(right)
            poller.add(left)

            def take(msg: Received) -> None:
                frames = msg.frames
                value = int(np.frombuffer(frames[0].buffer, np.int32)[-1]) if frames else msg.header.seq
                size = len(frames[0].buffer) if frames else len(msg.header.body["pad"])
                got[rank][msg.header.body["to"]] = (value, size)

            deadline = time.monotonic() + BOUND_S
            while len(got[rank]) < 2 and time.monotonic() < deadline:
                poller.serve(take, 0.1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done[rank].set()

    threads = [threading.Thread(target=node, args=(r,), daemon=True) for r in range(NODES)]
    for t in threads:
        t.start()
    for r in range(NODES):
        assert done[r].wait(BOUND_S + 10), f"node {r} is stuck: the ring deadlocked"
    assert not errors, errors
    size = BIG_HEADER if kind == "unix" else BIG
    for r in range(NODES):
        # node r's left neighbour sent it a message going right, its right neighbour one going left
        assert got[r] == {"right": ((r - 1) % NODES, size), "left": ((r + 1) % NODES, size)}, (r, got[r])


def _receive(ch: Channel, n: int) -> list[Received]:
    """The next ``n`` messages on ``ch`` (fewer if they do not come within the bound)."""
    msgs: list[Received] = []
    deadline = time.monotonic() + BOUND_S
    while len(msgs) < n and time.monotonic() < deadline:
        if ch.wait(0.1):
            ch.receive(msgs.append)
    return msgs


def test_a_blocking_send_waits_for_what_was_posted_before() -> None:
    """``send`` after ``post`` on the same end: the messages arrive in the order they were given."""
    trace = Trace(LOG)
    tl = TcpListener("127.0.0.1", SECRET, trace)
    try:
        client, server = accept_pair(
            tl, lambda: TcpChannel.connect(f"tcp://127.0.0.1:{tl.port}", SECRET, trace)
        )
    finally:
        tl.close()
    try:
        for end, other in ((client, server), (server, client)):
            end.post(wire.Header("a", 1), [np.full(BIG // 4, 1, np.int32)])  # more than the kernel takes
            sender = threading.Thread(
                target=lambda end=end: end.send(wire.Header("b", 2), [np.ones(4, np.int32)])
            )
            sender.start()
            seen = [m.header.op for m in _receive(other, 2)]
            sender.join(BOUND_S)
            assert seen == ["a", "b"]
    finally:
        client.close()
        server.close()


def test_either_end_of_a_same_host_channel_takes_descriptors() -> None:
    """The accepting end receives a descriptor from the connecting one, as the other way round."""
    trace = Trace(LOG)
    ul = UnixListener(f"fds{os.getpid()}", SECRET, trace)
    try:
        client, server = accept_pair(ul, lambda: UnixChannel.connect(ul.name, SECRET, trace))
    finally:
        ul.close()
    try:
        for end, other in ((client, server), (server, client)):
            buf = MemBuffer(64)
            buf.view(np.uint8, 64)[:] = 7
            end.post(wire.Header("fd", 1), fds=[buf.fd])
            assert [m.header.op for m in _receive(other, 1)] == ["fd"]
            (fd,) = other.take_fds(1)
            seen = MemBuffer(64, fd=fd)
            assert (seen.view(np.uint8, 64) == 7).all()
            seen.close()
            buf.close()
    finally:
        client.close()
        server.close()
