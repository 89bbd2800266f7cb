"""The Channel contract (transport/channel.py), run against every implementation that is cheap here:
the in-process pair (memory), the same-host channel (unix) and the TCP data channel (tcp, loopback).

Each case gets a connected (client end, server end) pair and checks what the roles rely on:
headers round-trip byte-identically through ``wire``, replies go back on ``Received.reply``,
frames where ``caps.frames`` (and in place where ``caps.direct``), descriptors where
``caps.shared_memory``, malformed messages are dropped without losing the next one, and a closed
peer ends ``receive``.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.trainer_core.chanpair import accept_pair
from trainer_core.errors import KVError
from trainer_core.ps import protocol as wire
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport.channel import (
    HANDSHAKE_TIMEOUT_S,
    Caps,
    Channel,
    ChannelClosed,
    Listener,
    Payload,
    Poller,
    Received,
    Trace,
)
from trainer_core.transport.devshm import MemBuffer
from trainer_core.transport.memory import MemoryChannel
from trainer_core.transport.tcp import TcpChannel, TcpListener
from trainer_core.transport.unix import UnixChannel, UnixListener

SECRET = "channel-contract-secret"
LOG = logging.getLogger("test_transport_channel")
TRACE = Trace(LOG, schema=SCHEMA)
KINDS = ["memory", "memory-shm", "unix", "tcp"]


@pytest.fixture(params=KINDS)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[Channel, Channel]]:
    kind = request.param
    listener: Listener | None = None
    client: Channel
    server: Channel
    if kind == "memory":
        client, server = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    elif kind == "memory-shm":  # as the unix channel: headers only, shared memory
        client, server = MemoryChannel.pair(Caps(frames=False, shared_memory=True), log=LOG, schema=SCHEMA)
    elif kind == "unix":
        unix = listener = UnixListener("contract", SECRET, TRACE)
        client, server = accept_pair(unix, lambda: UnixChannel.connect(unix.name, SECRET, TRACE))
    else:
        tcp = listener = TcpListener("127.0.0.1", SECRET, TRACE)
        client, server = accept_pair(
            tcp, lambda: TcpChannel.connect(f"tcp://127.0.0.1:{tcp.port}", SECRET, TRACE)
        )
    yield client, server
    client.close()
    server.close()
    if listener is not None:
        listener.close()


def collect(ch: Channel, n: int = 1, timeout: float = 5.0) -> list[Received]:
    """Receive until ``n`` messages came (each copied out of buffers a later message may reuse)."""
    got: list[Received] = []

    def keep(msg: Received) -> None:
        frames = [np.frombuffer(bytes(f.buffer), np.uint8) for f in msg.frames]
        got.append(Received(msg.header, frames, msg.reply))

    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
        if ch.wait(0.1):
            assert ch.receive(keep), "the channel closed"
    return got


def header(seq: int, **body: object) -> wire.Header:
    return wire.Header(
        op=wire.PULL, seq=seq, src="worker 0", entries=(wire.Entry("w", 0, 4, "<f4"),), body=dict(body)
    )


def test_a_header_round_trips_and_the_reply_goes_back_on_the_channel(pair: tuple[Channel, Channel]) -> None:
    client, server = pair
    sent = header(7, rank=0)
    client.send(sent)
    (msg,) = collect(server)
    assert msg.header == sent and msg.frames == []
    assert wire.encode(msg.header) == wire.encode(sent)
    msg.reply.send(wire.Header(op=wire.REPLY, seq=7))
    (reply,) = collect(client)
    assert reply.header.op == wire.REPLY and reply.header.seq == 7 and reply.reply is client


def test_messages_keep_their_order(pair: tuple[Channel, Channel]) -> None:
    client, server = pair
    for seq in range(1, 41):
        client.send(header(seq))
    assert [m.header.seq for m in collect(server, 40)] == list(range(1, 41))


def test_frames_travel_where_the_channel_carries_them(pair: tuple[Channel, Channel]) -> None:
    client, server = pair
    a = np.arange(1000, dtype=np.float32)
    b = np.arange(7, dtype=np.int64)
    if not client.caps.frames:
        with pytest.raises(KVError, match="headers only"):
            client.send(header(1), [a])
        return
    client.send(header(1), [a, b])
    if client.caps.direct:
        a[:] = -1  # the bytes left before send returned: the caller may reuse its array
    (msg,) = collect(server)
    assert np.array_equal(msg.frames[0].view(np.float32), np.arange(1000, dtype=np.float32))
    assert np.array_equal(msg.frames[1].view(np.int64), b)
    server.send(wire.Header(op=wire.REPLY, seq=1), [b[::-1]])  # not contiguous: sent as its values
    (reply,) = collect(client)
    assert reply.frames[0].view(np.int64).tolist() == b[::-1].tolist()


def test_a_direct_channel_reads_frames_into_the_place_given(pair: tuple[Channel, Channel]) -> None:
    client, server = pair
    if not client.caps.direct:
        pytest.skip("frames are not read in place on this channel")
    dst = np.zeros(3000, np.float32)
    asked: list[tuple[int, list[int]]] = []

    def place(h: wire.Header, lens: list[int]) -> list[memoryview | None]:
        asked.append((h.seq, lens))
        return [dst[1000:2000].view(np.uint8).data, np.zeros(3, np.uint8).data]  # the 2nd: wrong size

    server.place = place
    src = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    client.send(header(3), [src, src[:20]])
    frames: list[Payload] = []
    while not frames:
        if server.wait(0.1):
            server.receive(lambda m: frames.extend(m.frames))
    first, second = frames
    assert asked == [(3, [4000, 80])]
    assert first.placed and np.array_equal(dst[1000:2000], src)
    assert dst[:1000].sum() == 0 and dst[2000:].sum() == 0
    assert not second.placed
    assert np.array_equal(np.frombuffer(second.buffer, np.float32), src[:20])


def test_descriptors_pass_only_where_memory_is_shared(pair: tuple[Channel, Channel]) -> None:
    client, server = pair
    buf = MemBuffer(64)
    try:
        buf.view(np.dtype("<f4"), 16)[:] = 2.5
        assert buf.fd is not None
        if not server.caps.shared_memory:
            with pytest.raises(KVError, match="descriptors"):
                server.send(wire.Header(op=wire.REPLY, seq=1), fds=[buf.fd])
            return
        server.send(wire.Header(op=wire.REPLY, seq=1, body={"fds": [[buf.id, 64]]}), fds=[buf.fd])
        (msg,) = collect(client)
        assert msg.header.body["fds"] == [[buf.id, 64]]
        (fd,) = client.take_fds(1)
        assert fd != buf.fd  # a descriptor of its own, as SCM_RIGHTS gives
        mapped = MemBuffer(64, fd=fd, ident=buf.id)
        assert mapped.view(np.dtype("<f4"), 16).tolist() == [2.5] * 16
        mapped.close()
        with pytest.raises(KVError, match="did not arrive"):
            client.take_fds(1)
    finally:
        buf.close()


def _send_garbage(client: Channel) -> None:
    """A header that is not JSON, sent below the Channel interface (as a peer with the secret could)."""
    raw = b"{not json"
    if isinstance(client, MemoryChannel):
        assert client.other is not None
        client.other._deliver(raw, [], [])
    elif isinstance(client, UnixChannel):
        client.sock.sendall(struct.pack("<I", len(raw)) + raw)
    else:
        assert isinstance(client, TcpChannel)
        client.write(raw)


def test_a_malformed_message_is_dropped_and_the_next_one_arrives(
    pair: tuple[Channel, Channel], caplog: pytest.LogCaptureFixture
) -> None:
    client, server = pair
    _send_garbage(client)
    client.send(header(9))
    with caplog.at_level(logging.WARNING):
        (msg,) = collect(server)
    assert msg.header.seq == 9
    assert "dropped a malformed message" in caplog.text


def test_a_closed_peer_ends_receive_and_a_closed_channel_refuses_to_send(
    pair: tuple[Channel, Channel],
) -> None:
    client, server = pair
    client.send(header(1))
    client.close()
    got: list[Received] = []
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline
        if server.wait(0.1) and not server.receive(got.append):
            break
    assert [m.header.seq for m in got] == [1]  # what was sent before the close still arrives
    with pytest.raises(ChannelClosed):
        client.send(header(2))


def test_the_poller_hands_each_ready_channel_its_messages() -> None:
    (a_client, a_server), (b_client, b_server) = (
        MemoryChannel.pair(schema=SCHEMA),
        MemoryChannel.pair(schema=SCHEMA),
    )
    poller = Poller()
    poller.add(a_server)
    poller.add(b_server)
    assert poller.poll(0.01) == []
    b_client.send(header(5))
    assert poller.poll(1.0) == [b_server]
    seen: list[int] = []
    closed: list[object] = []
    poller.serve(lambda m: seen.append(m.header.seq), 1.0, closed.append)
    assert seen == [5] and closed == []
    a_client.close()
    poller.serve(lambda m: seen.append(m.header.seq), 1.0, closed.append)
    assert closed == [a_server] and poller.sources() == [b_server]
    for ch in (a_server, b_client, b_server):
        ch.close()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_the_poller_accepts_and_drops_connections_that_never_authenticate(kind: str) -> None:
    """A peer that connects and never answers the nonce is closed once its handshake is older than
    the bound, on the same-host listener as on the TCP one (the unix one kept such a peer for ever)."""
    listener: UnixListener | TcpListener
    if kind == "unix":
        listener = UnixListener("stale", SECRET, TRACE)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect("\0" + listener.name)
    else:
        listener = TcpListener("127.0.0.1", SECRET, TRACE)
        raw = socket.create_connection(("127.0.0.1", listener.port))
    poller = Poller()
    poller.add(listener)
    accepted: list[Channel] = []
    listener.on_accept = accepted.append
    deadline = time.monotonic() + 5
    while not accepted:
        assert time.monotonic() < deadline
        poller.serve(lambda m: None, 0.1)
    assert len(raw.recv(16)) == 16  # the nonce; the peer never proves the secret
    (conn,) = accepted
    assert conn in poller.sources()
    poller.serve(lambda m: None, 0.01)
    assert not conn.closed  # within the bound it may still answer
    listener.handshakes.age(HANDSHAKE_TIMEOUT_S + 1)  # its handshake started long ago
    poller.serve(lambda m: None, 0.01)
    assert conn.closed and poller.sources() == []
    raw.settimeout(2)
    assert raw.recv(10) == b""
    raw.close()
    listener.close()


def test_a_listener_closes_the_oldest_handshakes_beyond_the_most_it_holds() -> None:
    listener = UnixListener("crowd", SECRET, TRACE)
    listener.handshakes.most = 2
    poller = Poller()
    poller.add(listener)
    accepted: list[Channel] = []
    listener.on_accept = accepted.append
    raws = []
    for _ in range(3):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect("\0" + listener.name)
        raws.append(raw)
    deadline = time.monotonic() + 5
    while len(accepted) < 3:
        assert time.monotonic() < deadline
        poller.serve(lambda m: None, 0.1)
    poller.serve(lambda m: None, 0.01)
    assert [c.closed for c in accepted] == [True, False, False]
    for ch in accepted:
        ch.close()
    for raw in raws:
        raw.close()
    listener.close()


def test_memory_channels_are_pollable_eventfds_and_closing_one_ends_the_other() -> None:
    a, b = MemoryChannel.pair(schema=SCHEMA)
    fds = {a.pollable(), b.pollable()}
    assert len(fds) == 2
    assert all(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]" for fd in fds)
    assert not b.wait(0.0)
    a.send(header(1))
    assert b.wait(0.0)
    b.close()
    assert a.wait(0.0)  # woken: b is gone
    assert not a.receive(lambda m: None) and a.peer_closed
    with pytest.raises(ChannelClosed):
        a.send(header(2))
    a.close()
    assert not a.receive(lambda m: None)


def test_a_channel_decodes_its_peers_repeated_header_once(pair: tuple[Channel, Channel]) -> None:
    """Each channel remembers its own peer's headers, whatever the node's other channels decode."""
    client, server = pair
    for seq in (1, 2):
        client.send(header(seq, rank=0))
    collect(server, 2)
    for rank in range(1, 1000):  # the node's decoder (a ROUTER's peers) sees many other workers
        server.trace.decode(wire.encode(header(1, rank=rank)))
    client.send(header(3, rank=0))
    (msg,) = collect(server)
    assert msg.header == header(3, rank=0)
    assert server.headers.parsed == 1


def test_a_server_of_1000_workers_parses_each_workers_headers_once() -> None:
    """The server's channels share one ``Trace``, as a server node's do; its 1000 workers repeat
    two headers each (push, pull). With one decoder of 256 headers for the node (before), every
    request was parsed in full again: 4000 of 4000 in two rounds, against 2000 now."""
    trace = Trace(LOG, schema=SCHEMA)
    pairs = []
    for _ in range(1000):
        worker, server = MemoryChannel(Caps(), Trace(LOG, schema=SCHEMA)), MemoryChannel(Caps(), trace)
        worker.other, server.other = server, worker
        pairs.append((worker, server))
    got: list[wire.Header] = []
    for round_ in (1, 2):
        for rank, (worker, server) in enumerate(pairs):
            worker.send(wire.Header(wire.PUSH, 2 * round_, f"worker {rank}", body={"rank": rank}))
            worker.send(wire.Header(wire.PULL, 2 * round_ + 1, f"worker {rank}", body={"rank": rank}))
            assert server.receive(lambda msg: got.append(msg.header))
    assert len(got) == 4000 and got[-1] == wire.Header(wire.PULL, 5, "worker 999", body={"rank": 999})
    assert sum(server.headers.parsed for _, server in pairs) == 2000
    assert trace.headers.parsed == 0
    for worker, server in pairs:
        worker.close()
        server.close()
