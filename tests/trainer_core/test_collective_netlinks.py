"""``NetLinks`` in one process: three workers joined through a real scheduler (in a thread, on
real sockets, as test_node.py does), each with its links; matching by (peer, tag), early
arrivals, length mismatches, timeouts and misbehaving connections."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from tests.trainer_core.test_node import WORKERS, config, free_port, run_all
from trainer_core.collective import Ctx, LinkError, PeerTimeout, SubLinks
from trainer_core.collective.job import SCHEMA
from trainer_core.collective.sockets import protocol as coll_protocol
from trainer_core.collective.sockets.netlinks import NetLinks
from trainer_core.errors import NodeFailure
from trainer_core.node import protocol
from trainer_core.node.postoffice import Postoffice
from trainer_core.node.scheduler import Scheduler
from trainer_core.transport import wire
from trainer_core.transport.channel import ChannelClosed, Trace
from trainer_core.transport.tcp import TcpChannel

LOG = logging.getLogger("test_collective_netlinks")


class Net:
    """A scheduler in a thread, ``WORKERS`` joined nodes and their links."""

    def __init__(self, timeout: float = 10.0, shm: str = "1") -> None:
        self.job = f"net-{uuid.uuid4().hex[:8]}"
        port = free_port()
        self.scheduler = Scheduler(config("scheduler", port, self.job, PS_SHM=shm), LOG, schema=SCHEMA)
        self.thread = threading.Thread(target=self.scheduler.run, name="test-scheduler")
        self.thread.start()
        self.cfgs = [config("worker", port, self.job, rank=r, PS_SHM=shm) for r in range(WORKERS)]
        self.nodes: list[Postoffice] = run_all(lambda r: Postoffice.join(self.cfgs[r], LOG, SCHEMA))
        self.links: list[NetLinks] = run_all(lambda r: NetLinks(self.nodes[r], self.cfgs[r], timeout, LOG))

    def close(self) -> None:
        run_all(lambda r: self.nodes[r].finish())  # the scheduler ends the job at once
        for links in self.links:
            links.close()
        for node in self.nodes:
            node.stop()
            node.close_transport()
        self.thread.join(20)


@pytest.fixture(params=["1", "0"], ids=["same-host", "tcp"])
def net(request: pytest.FixtureRequest) -> Iterator[Net]:
    n = Net(shm=request.param)
    assert all(ch.caps.frames == (request.param == "0") for x in n.links for ch in x._chan.values())
    yield n
    n.close()


def until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_messages_match_by_peer_and_tag_in_order_also_before_their_receive(net: Net) -> None:
    a, b, c = net.links
    assert [(x.rank, x.size) for x in net.links] == [(r, WORKERS) for r in range(WORKERS)]
    a.send(1, 5, np.arange(10, dtype=np.int64)).wait()
    a.send(1, 5, np.arange(10, 20, dtype=np.int64)).wait()
    c.send(1, 5, np.full(3, 7, dtype=np.float32)).wait()
    until(lambda: (0, 5) in b._early and (2, 5) in b._early, "the messages arrived before their receives")
    first, second, other = np.empty(10, np.int64), np.empty(10, np.int64), np.empty(3, np.float32)
    for h in (b.recv(2, 5, other), b.recv(0, 5, first), b.recv(0, 5, second)):
        h.wait()
    assert first.tolist() == list(range(10)) and second.tolist() == list(range(10, 20))
    assert other.tolist() == [7, 7, 7]
    # posted first: read straight into the buffer; an empty message too
    big, empty = np.empty(1 << 20, np.float32), np.empty(0, np.float32)
    handles = [a.recv(2, 9, big), a.recv(1, 9, empty)]
    c.send(0, 9, np.ones(1 << 20, np.float32))
    b.send(0, 9, np.empty(0, np.float32))
    for h in handles:
        h.wait()
    assert big.sum() == 1 << 20 and all(h.done() for h in handles)


def test_a_process_sets_tag_space_keeps_its_messages_apart_and_drops_only_its_own(net: Net) -> None:
    a, b, _ = net.links
    sa, sb = SubLinks(a, [0, 1], space=3), SubLinks(b, [0, 1], space=3)
    tag = Ctx.for_op(sa, 7).tag(0)
    a.send(1, tag, np.array([0], np.int64)).wait()  # the whole group's operation 7
    sa.send(1, tag, np.array([3], np.int64)).wait()  # the set's operation 7, same tag in its space
    mine, whole = np.empty(1, np.int64), np.empty(1, np.int64)
    sb.recv(0, tag, mine).wait()
    b.recv(0, tag, whole).wait()
    assert (mine[0], whole[0]) == (3, 0)
    # the set's operation 8 is dropped (the ranks disagreed on it), not the whole group's
    tag8 = Ctx.for_op(sa, 8).tag(0)
    sa.send(1, tag8, np.array([3], np.int64)).wait()
    a.send(1, tag8, np.array([0], np.int64)).wait()
    until(lambda: (0, tag8) in b._early, "the whole group's message arrived")
    until(lambda: (0, tag8 | (3 << 60)) in b._early, "the set's message arrived")
    sb.drop(8)
    assert (0, tag8 | (3 << 60)) not in b._early and (0, tag8) in b._early
    b.recv(0, tag8, whole).wait()


def test_a_goodbye_says_the_operations_of_each_process_set() -> None:
    h = coll_protocol.bye(5, {1: 3, 2: 0})
    assert coll_protocol.ops_of(h) == 5 and coll_protocol.sets_of(h) == {1: 3, 2: 0}
    assert coll_protocol.sets_of(coll_protocol.bye(5)) == {}
    odd = wire.Header(coll_protocol.BYE, body={"ops": 1, "sets": {"1": 2, "x": 1, "2": -1, "3": "4"}})
    assert coll_protocol.sets_of(odd) == {1: 2}
    assert coll_protocol.sets_of(wire.Header(coll_protocol.BYE, body={"sets": [1]})) == {}


def test_a_length_mismatch_and_a_silent_peer_fail_naming_the_peer(net: Net) -> None:
    a, b, _ = net.links
    handle = b.recv(0, 1, np.empty(4, np.float32))
    a.send(1, 1, np.empty(5, np.float32))
    with pytest.raises(LinkError, match=r"rank 0 \(worker 0 on 127\.0\.0\.1\) sent 20 bytes .* expected 16"):
        handle.wait()
    with pytest.raises(PeerTimeout, match=r"rank 2 .* sent nothing to rank 1 within 0\.2 s") as err:
        b.recv(2, 2, np.empty(1, np.float32)).wait(0.2)
    assert err.value.node == "rank 2" and not b._posted
    with pytest.raises(ValueError, match="no link to rank 1"):
        b.send(1, 0, np.empty(1))


def test_a_connection_that_claims_a_rank_it_is_not_is_closed(net: Net) -> None:
    """Rank 1 accepts only ranks below it, each once: a connection with the secret that says it
    is rank 2 (which rank 1 connects to itself) or rank 0 again is closed; the links work on."""
    _, b, _ = net.links
    trace = Trace(LOG, schema=SCHEMA)
    for claimed in (2, 0):
        ch = TcpChannel.connect(net.nodes[1].book.workers[1].data, net.cfgs[0].secret, trace)
        ch.post(coll_protocol.hello(claimed))
        assert ch.wait(10)
        assert not ch.receive(lambda m: None)  # closed on it
        ch.close()
    net.links[0].send(1, 3, np.ones(2, np.float32))
    out = np.empty(2, np.float32)
    b.recv(0, 3, out).wait()
    assert out.tolist() == [1, 1]


def test_links_need_a_node_that_knows_the_collectives_kinds() -> None:
    port = free_port()
    job = f"net-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(config("scheduler", port, job), LOG)
    thread = threading.Thread(target=sched.run)
    thread.start()
    cfgs = [config("worker", port, job, rank=r) for r in range(WORKERS)]
    nodes = run_all(lambda r: Postoffice.join(cfgs[r], LOG, protocol.SCHEMA))
    try:
        with pytest.raises(ValueError, match="without the collectives' message kinds"):
            NetLinks(nodes[0], cfgs[0])
    finally:
        run_all(lambda r: nodes[r].finish())
        for node in nodes:
            node.stop()
            node.close_transport()
        thread.join(20)


def test_the_hosts_segment_is_shared_at_set_up_or_by_nobody(net: Net) -> None:
    """Same host: rank 0 made one segment and each other rank maps the same file (a counter posted
    by one is seen by all); with PS_SHM=0 nobody has one."""
    locs = [x.local for x in net.links]
    if all(ch.caps.frames for x in net.links for ch in x._chan.values()):
        assert locs == [None] * WORKERS
        return
    assert all(loc is not None for loc in locs)
    assert [loc.rank for loc in locs] == list(range(WORKERS))  # type: ignore[union-attr]
    assert {loc.members for loc in locs} == {tuple(range(WORKERS))}  # type: ignore[union-attr]
    locs[1].post(5)  # type: ignore[union-attr]
    for loc in locs:
        loc.wait_for(1, 5, "post")  # type: ignore[union-attr]


class _ClosedUnderneath:
    """A channel whose peer is gone, as a send finds out first (EPIPE) while the receiving thread
    has not yet seen the connection close."""

    def __init__(self, ch: object) -> None:
        self._ch = ch

    def __getattr__(self, name: str) -> object:
        return getattr(self._ch, name)

    def post(self, *args: object, **kw: object) -> None:
        raise ChannelClosed("the channel closed: [Errno 32] Broken pipe")  # as unix and tcp raise it

    def send(self, *args: object, **kw: object) -> None:
        raise ChannelClosed("the same-host channel closed: [Errno 32] Broken pipe")


@pytest.mark.parametrize("shm", ["1", "0"], ids=["same-host", "tcp"])
def test_a_send_that_finds_the_peer_gone_ends_the_job_naming_the_peer_not_itself(shm: str) -> None:
    """A send that failed with EPIPE before the receiving thread saw the peer's channel close
    raised a plain LinkError and told nobody, so the sender exited with its own error and the
    launcher named the sender as the root cause (a Grid Engine run: worker 0 named for worker 1's
    SIGKILL). Now the scheduler is told, as when a connection closes: every node's failure names
    the peer."""
    net = Net(shm=shm)
    a = net.links[0]
    real = a._chan[1]
    a._chan[1] = _ClosedUnderneath(real)  # type: ignore[assignment]
    try:
        with pytest.raises(NodeFailure) as err:
            a.send(1, 7, np.ones(3, np.float32))
        assert err.value.node == "worker 1", err.value
        until(lambda: net.nodes[2].failure is not None, "worker 2 heard of the failure")
        assert net.nodes[2].failure is not None and net.nodes[2].failure.node == "worker 1"
        with pytest.raises((LinkError, NodeFailure)):
            a.send(1, 8, np.ones(1, np.float32))  # the group stays broken
    finally:
        a._chan[1] = real
        for links in net.links:  # the job failed: no finish
            links.close()
        for node in net.nodes:
            node.stop()
            node.close_transport()
        net.thread.join(20)
