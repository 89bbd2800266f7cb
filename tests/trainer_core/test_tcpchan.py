"""The cross-host data channel (transport/tcp.py, framing in transport/stream.py) over real loopback
TCP sockets, at the stream level (raw header bytes); the Channel contract is in test_transport_channel.py."""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.errors import KVError
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport.channel import ChannelClosed, Trace
from trainer_core.transport.tcp import TcpChannel as TcpConn
from trainer_core.transport.tcp import TcpListener

SECRET = "tcpchan-test-secret"
TRACE = Trace(logging.getLogger("test_tcpchan"), schema=SCHEMA)


def _server_side(listener: TcpListener, timeout: float = 20.0) -> TcpConn:
    """Accept one connection and drive its handshake to the end (as the server's loop does)."""
    deadline = time.monotonic() + timeout
    conns: list = []
    while not conns:
        select.select([listener.pollable()], [], [], 0.1)
        conns = listener.accept()
        assert time.monotonic() < deadline
    conn = conns[0]
    assert isinstance(conn, TcpConn)
    while not conn.ready:
        select.select([conn.pollable()], [], [], 0.1)
        assert conn.handshake() is not None, "handshake failed"
        assert time.monotonic() < deadline
    return conn


@pytest.fixture
def pair() -> Iterator[tuple[TcpConn, TcpConn]]:
    listener = TcpListener("127.0.0.1", SECRET, TRACE)
    box: list[TcpConn] = []
    t = threading.Thread(target=lambda: box.append(_server_side(listener)))
    t.start()
    client = TcpConn.connect(f"tcp://127.0.0.1:{listener.port}", SECRET, TRACE)
    t.join(25)
    server = box[0]
    yield client, server
    client.close()
    server.close()
    listener.close()


def _decode(raw: bytes, lens: list[int]) -> tuple[bytes, list[memoryview | None]]:
    return raw, []


def test_a_message_round_trips_with_frames_in_order(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    a = np.arange(1000, dtype=np.float32)
    b = np.arange(7, dtype=np.int64)
    client.write(b'{"op":"x"}', [a, b, b""])
    header, frames = server.read_message(_decode)
    assert header == b'{"op":"x"}'
    assert [len(f.buffer) for f in frames] == [4000, 56, 0]
    assert np.array_equal(np.frombuffer(frames[0].buffer, np.float32), a)
    assert np.array_equal(np.frombuffer(frames[1].buffer, np.int64), b)
    assert not any(f.placed for f in frames)


def test_frames_land_in_the_buffers_the_caller_places_them_in(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    dst = np.zeros(3000, np.float32)
    wrong_size = np.zeros(10, np.float32)

    def place(raw: bytes, lens: list[int]) -> tuple[bytes, list[memoryview | None]]:
        return raw, [dst[1000:2000].view(np.uint8).data, wrong_size.view(np.uint8).data]

    src = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    client.write(b"h", [src, src[:20]])
    _, frames = server.read_message(place)
    assert frames[0].placed and np.array_equal(dst[1000:2000], src)
    assert dst[:1000].sum() == 0 and dst[2000:].sum() == 0
    assert not frames[1].placed and np.array_equal(np.frombuffer(frames[1].buffer, np.float32), src[:20])
    assert wrong_size.sum() == 0


def test_a_big_message_while_the_reader_is_slow(pair: tuple[TcpConn, TcpConn]) -> None:
    """64 MB: the sender blocks in slices until the reader drains it; nothing is lost."""
    client, server = pair
    big = np.random.default_rng(1).integers(0, 255, 64 << 20, dtype=np.uint8)
    sender = threading.Thread(target=lambda: client.write(b"big", [big]))
    sender.start()
    time.sleep(0.3)
    _, frames = server.read_message(_decode)
    sender.join(10)
    assert np.array_equal(np.frombuffer(frames[0].buffer, np.uint8), big)


def test_posted_replies_are_sent_in_order_by_the_sender_thread(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    for i in range(20):
        server.post(str(i).encode(), [np.full(50_000, i, np.float32)])
    for i in range(20):
        header, frames = client.read_message(_decode)
        assert header == str(i).encode()
        assert np.frombuffer(frames[0].buffer, np.float32)[-1] == i


def test_a_reply_the_kernel_takes_at_once_needs_no_sender_thread(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    for i in range(5):
        server.post(str(i).encode(), [np.full(1000, i, np.int32)])
    assert server._outbox.thread is None  # each went out from the posting thread
    for i in range(5):
        header, frames = client.read_message(_decode)
        assert header == str(i).encode() and np.frombuffer(frames[0].buffer, np.int32)[0] == i


def test_posting_never_waits_for_a_reader_that_does_not_read(pair: tuple[TcpConn, TcpConn]) -> None:
    """48 MB posted to a reader that reads nothing: what the kernel cannot take now goes from the
    sender thread, posts return at once, and every reply arrives whole and in order."""
    client, server = pair
    t0 = time.monotonic()
    for i in range(24):
        server.post(str(i).encode(), [np.full(1 << 19, i, np.float32)])
    assert time.monotonic() - t0 < 2.0
    assert server._outbox.thread is not None
    for i in range(24):
        header, frames = client.read_message(_decode)
        got = np.frombuffer(frames[0].buffer, np.float32)
        assert header == str(i).encode() and got.size == 1 << 19 and (got == i).all()
    for i in range(3):  # the sender thread is idle again: replies go out at once, still in order
        server.post(b"after" + str(i).encode(), [np.full(10, i, np.float32)])
    for i in range(3):
        assert client.read_message(_decode)[0] == b"after" + str(i).encode()


def test_a_borrowed_frame_may_change_once_post_returns(pair: tuple[TcpConn, TcpConn]) -> None:
    """``post(..., borrowed=True)`` of one buffer rewritten after every post, to a reader that
    reads nothing until the end: the first messages go (in part) at once and their rest is copied
    for the sender thread, the later ones are queued whole, as copies; every one arrives as it was
    when it was posted."""
    client, server = pair
    buf = np.empty(1 << 19, np.float32)
    for i in range(12):
        buf.fill(i)
        server.post(str(i).encode(), [buf], borrowed=True)
    buf.fill(-1)
    assert server._outbox.thread is not None  # (the kernel did not take it all at once)
    for i in range(12):
        header, frames = client.read_message(_decode)
        got = np.frombuffer(frames[0].buffer, np.float32)
        assert header == str(i).encode() and got.size == buf.size and (got == i).all()


def test_a_wait_is_cut_short_by_the_alive_check(pair: tuple[TcpConn, TcpConn]) -> None:
    client, _ = pair
    calls = []

    def alive() -> None:
        calls.append(1)
        if len(calls) >= 3:
            raise KVError("the job failed")

    t = time.monotonic()
    with pytest.raises(KVError, match="the job failed"):
        client.read_message(_decode, alive)
    assert time.monotonic() - t < 2.0


def test_the_peer_closing_is_reported(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    server.close()
    with pytest.raises(ChannelClosed):
        client.read_message(_decode)
    assert client.closed


def test_a_length_out_of_bounds_closes_the_connection(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    client.sock.sendall(struct.pack("<II", 1 << 30, 0))
    with pytest.raises(ChannelClosed, match="out of bounds"):
        server.read_message(_decode)
    assert server.closed
    client.sock.settimeout(2)
    assert client.sock.recv(10) == b""


def test_a_client_without_the_secret_is_refused() -> None:
    listener = TcpListener("127.0.0.1", SECRET, TRACE)
    results: list[bool | None] = []

    def serve() -> None:
        deadline = time.monotonic() + 20
        conns: list = []
        while not conns and time.monotonic() < deadline:
            select.select([listener.pollable()], [], [], 0.1)
            conns = listener.accept()
        state: bool | None = False
        while state is False and time.monotonic() < deadline:
            select.select([conns[0].pollable()], [], [], 0.1)
            state = conns[0].handshake()
        results.append(state)

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(KVError, match="data channel"):
        TcpConn.connect(f"tcp://127.0.0.1:{listener.port}", "another-secret", TRACE)
    t.join(25)
    assert results == [None]
    # garbage instead of a proof: refused the same way, nothing is read past it
    raw = socket.create_connection(("127.0.0.1", listener.port))
    results.clear()
    t = threading.Thread(target=serve)
    t.start()
    assert len(raw.recv(16)) == 16
    raw.sendall(b"\0" * 32 + b'{"op":"pull"}')
    t.join(25)
    assert results == [None]
    raw.close()
    listener.close()


def test_connecting_to_nothing_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(KVError, match=f"data channel tcp://127.0.0.1:{port}"):
        TcpConn.connect(f"tcp://127.0.0.1:{port}", SECRET, TRACE)


def test_a_client_keeps_every_received_frame_a_server_reuses_its_buffer(
    pair: tuple[TcpConn, TcpConn],
) -> None:
    client, server = pair
    server.post(b"1", [np.full(1000, 1, np.int32)])
    server.post(b"2", [np.full(1000, 2, np.int32)])
    _, first = client.read_message(_decode)
    _, second = client.read_message(_decode)
    assert set(np.frombuffer(first[0].buffer, np.int32)) == {1}  # not overwritten by the second reply
    assert set(np.frombuffer(second[0].buffer, np.int32)) == {2}
    client.write(b"a", [np.full(1000, 1, np.int32)])
    client.write(b"b", [np.full(1000, 2, np.int32)])
    _, a = server.read_message(_decode)
    _, b = server.read_message(_decode)
    assert (
        np.frombuffer(a[0].buffer, np.uint8).ctypes.data == np.frombuffer(b[0].buffer, np.uint8).ctypes.data
    )


def _raw_message(conn: TcpConn, header: bytes, lens: list[int], tag: bytes | None = None) -> bytes:
    """The bytes ``conn.send`` would put before the frames (for cutting a message off by hand)."""
    head = struct.pack("<II", len(header), len(lens)) + b"".join(struct.pack("<Q", n) for n in lens) + header
    good = conn._tag(conn._tag_out, conn._count_out, head)
    conn._count_out += 1
    return head + (good if tag is None else tag)


def test_an_altered_or_replayed_message_closes_the_connection(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    client.write(b"first")
    assert server.read_message(_decode)[0] == b"first"
    client.sock.sendall(_raw_message(client, b"forged", [], tag=bytes(16)))
    with pytest.raises(ChannelClosed, match="wrong tag") as err:
        server.read_message(_decode)
    assert err.value.violation and server.closed


def test_a_message_is_tagged_for_its_connection_and_place_in_the_stream(
    pair: tuple[TcpConn, TcpConn],
) -> None:
    client, server = pair
    replay = _raw_message(client, b"once", [])
    client.sock.sendall(replay)
    assert server.read_message(_decode)[0] == b"once"
    client.sock.sendall(replay)  # the same bytes again: the counter moved on
    with pytest.raises(ChannelClosed, match="wrong tag"):
        server.read_message(_decode)


def test_giving_up_before_a_message_keeps_the_stream_giving_up_inside_one_closes_it(
    pair: tuple[TcpConn, TcpConn],
) -> None:
    client, server = pair

    def fail() -> None:
        raise KVError("job failed")

    with pytest.raises(KVError, match="job failed"):
        client.read_message(_decode, fail)  # nothing had arrived
    assert not client.closed and not client.interrupted
    server.write(b"next", [np.arange(10, dtype=np.float32)])
    assert client.read_message(_decode)[0] == b"next"
    # half a message, then the wait is given up: the rest could never be framed
    server.sock.sendall(_raw_message(server, b"half", [4000]) + bytes(1000))
    with pytest.raises(KVError, match="job failed"):
        client.read_message(_decode, fail)
    assert client.closed and "cut off" in client.interrupted
    with pytest.raises(ChannelClosed, match="cut off"):
        client.write(b"more")


def test_a_frame_too_big_for_memory_closes_the_connection(pair: tuple[TcpConn, TcpConn]) -> None:
    client, server = pair
    server.sock.sendall(_raw_message(server, b"huge", [1 << 39]))
    with pytest.raises(ChannelClosed, match="more than fit in memory"):
        client.read_message(_decode)
    assert client.closed
