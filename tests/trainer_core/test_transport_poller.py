"""transport.channel.Poller at scale (issue 28): a wake costs the ready items, not every item
watched (a server with 1000 idle workers and one ready examines one), counted by the poller's
``examined``, never by the clock; ZeroMQ sockets beside the descriptors miss no message (their
descriptor signals edges, so they wait in ZeroMQ's own poll); a removed item whose descriptor
number was reused does not take its successor with it. Timed in bench/scale_server.py."""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Iterator

import pytest

from trainer_core.ps import protocol as ps
from trainer_core.transport.channel import FEW_FDS, Poller, Received
from trainer_core.transport.control import Transport
from trainer_core.transport.memory import MemoryChannel

LOG = logging.getLogger("test_transport_poller")
IDLE = 1000


def header(seq: int) -> ps.Header:
    return ps.Header(op=ps.PULL, seq=seq, src="worker 0", entries=(ps.Entry("w", 0, 4, "<f4"),))


@pytest.fixture
def pairs() -> Iterator[list[tuple[MemoryChannel, MemoryChannel]]]:
    """``IDLE`` + 1 in-process channel pairs (two eventfds each: the soft open-file limit is raised
    for them, as a server's launcher does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * IDLE + 256
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.fail(f"the hard open-file limit ({hard}) is below the {want} this test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    made = [MemoryChannel.pair(schema=ps.SCHEMA) for _ in range(IDLE + 1)]
    yield made
    for a, b in made:
        a.close()
        b.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def served(poller: Poller, want: int, bound_s: float = 10.0) -> list[int]:
    """The seqs of the messages the poller serves until ``want`` came (each turn waits for one)."""
    seen: list[int] = []
    deadline = time.monotonic() + bound_s
    while len(seen) < want:
        assert time.monotonic() < deadline, f"served {seen}, waited for {want}"
        poller.serve(lambda m: seen.append(m.header.seq), 1.0)
    return seen


def test_a_wake_examines_the_ready_channel_not_the_1000_idle_ones(
    pairs: list[tuple[MemoryChannel, MemoryChannel]],
) -> None:
    pairs[0][0].send(header(1))  # waiting while its descriptor moves to the epoll set (FEW_FDS)
    poller = Poller()
    for _, server_end in pairs:
        poller.add(server_end)
    assert served(poller, 1) == [1]
    before = poller.examined
    pairs[IDLE // 2][0].send(header(7))
    assert served(poller, 1) == [7]
    assert poller.examined - before <= 2  # the one ready (zmq.Poller: every one of the 1001, each wake)
    poller.close()


def test_a_server_s_router_beside_1000_idle_channels_misses_no_message(
    pairs: list[tuple[MemoryChannel, MemoryChannel]],
) -> None:
    """The server's shape: its ROUTER (a ZeroMQ socket, edge-signalled) and a descriptor per worker.
    Messages on the ROUTER, one at a time (each sent while the poller may be waiting) and in a
    burst, and on a channel, are all served, and each wake examines a handful of items."""
    transport = Transport("poller-secret", LOG, schema=ps.SCHEMA)
    router, endpoint = transport.bind_router("127.0.0.1")
    dealer = transport.connect(endpoint)
    poller = Poller()
    poller.add(router)
    for _, server_end in pairs:
        poller.add(server_end)
    replies: list[Received] = []
    try:
        for seq in range(1, 101):  # one at a time, from another thread: an edge each
            sender = threading.Thread(target=dealer.send, args=(header(seq),))
            sender.start()
            before, wakes = poller.examined, 0
            got: list[int] = []
            deadline = time.monotonic() + 10
            while not got:
                assert time.monotonic() < deadline, f"message {seq} on the ROUTER was not served"
                poller.serve(replies.append, 1.0)
                got = [m.header.seq for m in replies]
                wakes += 1
            sender.join()
            replies.clear()
            assert got == [seq]
            assert poller.examined - before <= 4 * wakes  # the ROUTER, the epoll set's descriptor
        for seq in range(200, 250):  # a burst: several messages behind one edge
            dealer.send(header(seq))
        pairs[3][0].send(header(999))
        assert sorted(served(poller, 51)) == [*range(200, 250), 999]
        poller.serve(replies.append, 0)
        assert replies == []
    finally:
        poller.close()
        transport.close()


@pytest.mark.parametrize("crowd", [0, FEW_FDS + 1], ids=["zmq-poll", "epoll"])
def test_removing_an_item_whose_descriptor_was_reused_keeps_its_successor(crowd: int) -> None:
    """A channel closed before its removal frees its descriptor number; a new channel may get it.
    Removing the old one must not stop the poller watching the new one (a zmq.Poller keyed by the
    number unregistered the successor, whose messages were then never served); with few
    descriptors (ZeroMQ's poll) and with many (the epoll set)."""
    poller = Poller()
    others = [MemoryChannel.pair(schema=ps.SCHEMA) for _ in range(crowd)]
    for _, s in others:
        poller.add(s)
    a_client, a_server = MemoryChannel.pair(schema=ps.SCHEMA)
    poller.add(a_server)
    reused = a_server.pollable()
    a_server.close()
    a_client.close()
    pairs = [MemoryChannel.pair(schema=ps.SCHEMA) for _ in range(4)]
    b_client, b_server = next((c, s) for c, s in pairs if s.pollable() == reused)
    poller.add(b_server)
    poller.remove(a_server)
    assert poller.sources()[-1:] == [b_server] and a_server not in poller.sources()
    b_client.send(header(5))
    assert served(poller, 1) == [5]
    poller.close()
    for c, s in pairs + others:
        c.close()
        s.close()
