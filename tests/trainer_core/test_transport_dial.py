"""The channel factory (transport/dial.py): which channels reach a peer from its entry of the
book (``same_host``, ``choose``: pure), and opening them (``open_link``: real listeners in this
process, served on a thread of their own while the factory connects)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.transport.channel import Channel, Poller, Trace
from trainer_core.transport.control import Transport, ZmqChannel
from trainer_core.transport.dial import Link, choose, open_link, same_host
from trainer_core.transport.host import machine_identity
from trainer_core.transport.tcp import TcpChannel, TcpListener
from trainer_core.transport.unix import UnixChannel, UnixListener

LOG = logging.getLogger("test_transport_dial")
SECRET = "dial-test-secret"
HOST = "127.0.0.1"
MINE = machine_identity(HOST)


@dataclass(frozen=True)
class Entry:
    """An entry of the book as the factory reads it (``node.book.NodeInfo``'s addresses)."""

    endpoint: str = ""
    host_key: str = MINE
    local: str = ""
    data: str = ""


def config(shm: bool = True) -> NodeConfig:
    return NodeConfig.from_environ(
        {
            "DMLC_ROLE": "worker",
            "DMLC_PS_ROOT_URI": HOST,
            "DMLC_PS_ROOT_PORT": "9",
            "DMLC_NODE_HOST": HOST,
            "DMLC_NUM_SERVER": "0",
            "DMLC_NUM_WORKER": "2",
            "LAUNCHKIT_JOB_SECRET": SECRET,
            "LAUNCHKIT_JOB_ID": "dial",
            "PS_SHM": "1" if shm else "0",
        }
    )


# -- choosing (pure) ---------------------------------------------------------------------------


def test_a_peer_is_tried_on_its_same_host_channel_only_on_this_machine_with_shm_on() -> None:
    assert same_host(Entry(local="u"), True, MINE)
    assert not same_host(Entry(local="u"), False, MINE)  # PS_SHM=0
    assert not same_host(Entry(local="u", host_key="other|boot"), True, MINE)
    assert not same_host(Entry(), True, MINE)  # it publishes none


def _links_rule(p: Entry, shared: bool) -> str | None:
    """How the node layer's links chose before the factory (a worker's channels to the servers)."""
    if p.data and (not shared or not p.endpoint):
        return "tcp"
    if p.endpoint:
        return "zmq"
    return "local" if shared else None


def _collective_rule(p: Entry, shared: bool) -> str | None:
    """How the collectives chose the channel between two workers before the factory."""
    if shared:
        return "local"
    return "tcp" if p.data else None


CASES = [
    (Entry(endpoint=e, local="u" if shared else "", data=d), shared)
    for e, d, shared in itertools.product(["", "tcp://h:1"], ["", "tcp://h:2"], [False, True])
]


@pytest.mark.parametrize(("peer", "shared"), CASES)
def test_the_choice_is_the_one_both_callers_made_before(peer: Entry, shared: bool) -> None:
    assert choose(peer, shared) == _links_rule(peer, shared)
    assert choose(peer, shared, frames=False, zmq=False) == _collective_rule(peer, shared)


def test_what_carries_data_frames() -> None:
    both = Entry(endpoint="tcp://h:1", local="u", data="tcp://h:2")
    assert choose(both, shared=False) == "tcp"  # another host: the data stream
    assert choose(both, shared=True) == "zmq"  # this host: headers go on the same-host channel
    assert choose(Entry(local="u", data="tcp://h:2"), shared=True) == "tcp"  # a worker: no endpoint
    assert choose(Entry(endpoint="tcp://h:1"), shared=False) == "zmq"  # PS_ENCRYPT=1: CURVE only
    assert choose(Entry(endpoint="tcp://h:1"), shared=False, zmq=False) is None
    assert choose(Entry(local="u"), shared=True) == "local"  # headers only
    assert choose(Entry(local="u", data="tcp://h:2"), shared=True, frames=False) == "local"
    assert choose(Entry(), shared=False) is None


# -- opening -------------------------------------------------------------------------------------


@pytest.fixture
def listeners() -> Iterator[tuple[UnixListener, TcpListener]]:
    trace = Trace(LOG)
    ul = UnixListener("dial", SECRET, trace)
    tl = TcpListener(HOST, SECRET, trace)
    yield ul, tl
    ul.close()
    tl.close()


def _served(listening: list, connect: Callable[[], Link]) -> tuple[Link, list[Channel]]:
    """``connect()`` on a thread while this one accepts on ``listening`` and drives the handshakes;
    returns the link and the accepted ends."""
    poller = Poller()
    for listener in listening:
        poller.add(listener)
    box: list[Link | BaseException] = []

    def run() -> None:
        try:
            box.append(connect())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while not box:
        poller.serve(lambda _m: None, 0.05)
        assert time.monotonic() < deadline, "the factory did not return"
    t.join(20)
    accepted = [s for s in poller.sources() if isinstance(s, Channel)]
    poller.close()
    got = box[0]
    if isinstance(got, BaseException):
        for ch in accepted:
            ch.close()
        raise got
    return got, accepted


def _close(link: Link, accepted: list[Channel]) -> None:
    for ch in [*link.channels(), *accepted]:
        ch.close()


def test_a_peer_on_this_host_gets_its_same_host_channel_and_its_data_stream(
    listeners: tuple[UnixListener, TcpListener],
) -> None:
    ul, tl = listeners
    peer = Entry(local=ul.name, data=f"tcp://{HOST}:{tl.port}")
    link, accepted = _served([ul, tl], lambda: open_link(peer, config(), "worker 1", LOG, Trace(LOG)))
    try:
        assert isinstance(link.fast, UnixChannel) and isinstance(link.framed, TcpChannel)
        assert link.shares_memory and len(accepted) == 2
    finally:
        _close(link, accepted)


def test_with_shm_off_or_no_frames_needed_one_channel_is_opened(
    listeners: tuple[UnixListener, TcpListener],
) -> None:
    ul, tl = listeners
    peer = Entry(local=ul.name, data=f"tcp://{HOST}:{tl.port}")
    link, accepted = _served([ul, tl], lambda: open_link(peer, config(shm=False), "w", LOG, Trace(LOG)))
    try:
        assert isinstance(link.fast, TcpChannel) and link.channels() == [link.framed]
    finally:
        _close(link, accepted)
    link, accepted = _served([ul, tl], lambda: open_link(peer, config(), "w", LOG, Trace(LOG), frames=False))
    try:
        assert isinstance(link.fast, UnixChannel) and link.channels() == [link.framed]
        assert len(accepted) == 1
    finally:
        _close(link, accepted)


def test_a_same_host_channel_that_cannot_connect_falls_back_to_tcp(
    listeners: tuple[UnixListener, TcpListener], caplog: pytest.LogCaptureFixture
) -> None:
    _, tl = listeners
    peer = Entry(local="launchkit-dial-nobody", data=f"tcp://{HOST}:{tl.port}")
    with caplog.at_level(logging.WARNING, LOG.name):
        link, accepted = _served([tl], lambda: open_link(peer, config(), "worker 1", LOG, Trace(LOG)))
    try:
        assert isinstance(link.fast, TcpChannel) and link.fast is link.framed
        assert "worker 1: no same-host channel" in caplog.text
    finally:
        _close(link, accepted)


def test_the_zeromq_endpoint_carries_frames_beside_a_same_host_channel(
    listeners: tuple[UnixListener, TcpListener],
) -> None:
    ul, _ = listeners
    transport = Transport(SECRET, LOG)
    try:
        peer = Entry(endpoint=f"tcp://{HOST}:9", local=ul.name, data="tcp://h:2")
        link, accepted = _served(
            [ul], lambda: open_link(peer, config(), "server 0", LOG, transport.trace, transport)
        )
        assert isinstance(link.fast, UnixChannel) and isinstance(link.framed, ZmqChannel)
        _close(link, accepted)
    finally:
        transport.close()


def test_a_peer_with_nothing_to_reach_it_on_is_a_clear_error() -> None:
    with pytest.raises(KVError, match=r"^server 0 publishes no channel to reach it on \(the TCP data"):
        open_link(Entry(endpoint="tcp://h:1"), config(), "server 0", LOG, Trace(LOG))  # no ZeroMQ


def test_what_was_opened_is_closed_when_the_data_stream_fails(
    listeners: tuple[UnixListener, TcpListener], monkeypatch: pytest.MonkeyPatch
) -> None:
    ul, tl = listeners
    port = tl.port
    tl.close()  # nothing listens there any more
    opened: list[Channel] = []
    closed: list[Channel] = []
    real_connect, real_close = UnixChannel.connect, UnixChannel.close

    def connect(endpoint: str, secret: str, trace: Trace) -> UnixChannel:
        opened.append(real_connect(endpoint, secret, trace))
        return opened[-1]

    def close(self: UnixChannel, flush_s: float = 0.0) -> None:
        closed.append(self)
        real_close(self, flush_s)

    monkeypatch.setattr(UnixChannel, "connect", connect)
    monkeypatch.setattr(UnixChannel, "close", close)
    peer = Entry(local=ul.name, data=f"tcp://{HOST}:{port}")
    with pytest.raises(KVError):
        _served([ul], lambda: open_link(peer, config(), "worker 1", LOG, Trace(LOG)))
    assert len(opened) == 1 and opened[0] in closed  # the same-host channel it had connected
