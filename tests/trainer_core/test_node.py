"""The node layer (trainer_core/node/): joining through a real scheduler, the book of all nodes,
workers reaching each other, barriers, finish and aborts; request tracking in one process.

The job here has no servers (``DMLC_NUM_SERVER=0``, a collectives-only job): the workers join a
real ``node.scheduler.Scheduler`` (in a thread, on real sockets), every worker's book lists every
worker with where it listens, and worker 0 reaches worker 1 on the channels the book names.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import NodeFailure
from trainer_core.node import protocol
from trainer_core.node.inflight import Requests
from trainer_core.node.postoffice import Postoffice
from trainer_core.node.reach import open_links
from trainer_core.node.scheduler import Scheduler
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel, Poller, Received
from trainer_core.transport.memory import MemoryChannel

LOG = logging.getLogger("test_node")
SECRET = "node-layer-secret"
#: the node layer's kinds plus two of this test's own (what a protocol above would add)
SCHEMA = protocol.SCHEMA | wire.Schema(frozenset({"hello", "hello_back"}))
WORKERS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(role: str, port: int, job: str, rank: int = -1, **extra: str) -> NodeConfig:
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NODE_HOST": "127.0.0.1",
        "DMLC_NUM_SERVER": "0",
        "DMLC_NUM_WORKER": str(WORKERS),
        "LAUNCHKIT_JOB_SECRET": SECRET,
        "LAUNCHKIT_JOB_ID": job,
        "PS_HEARTBEAT_INTERVAL": "0.1",
        "PS_HEARTBEAT_TIMEOUT": "5",
        "PS_START_TIMEOUT": "20",
        **({"LAUNCHKIT_ROLE_RANK": str(rank)} if rank >= 0 else {}),
        **extra,
    }
    return NodeConfig.from_environ(env)


class Job:
    """A scheduler in a thread and ``WORKERS`` joined ``Postoffice``\\ s (joined at once, in threads)."""

    def __init__(self, **extra: str) -> None:
        self.job = f"node-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.scheduler = Scheduler(config("scheduler", self.port, self.job, **extra), LOG, schema=SCHEMA)
        self.code: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.code.append(self.scheduler.run()), name="test-scheduler"
        )
        self.thread.start()
        self.cfgs = [config("worker", self.port, self.job, rank=r, **extra) for r in range(WORKERS)]
        self.nodes = run_all(lambda r: Postoffice.join(self.cfgs[r], LOG, SCHEMA))

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
            node.close_transport()
        self.thread.join(20)


def run_all(fn, n: int = WORKERS) -> list:  # type: ignore[no-untyped-def]
    """``fn(rank)`` for every rank at once, each in a thread; their results (or the first error)."""
    out: list = [None] * n
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


@pytest.fixture
def job() -> Iterator[Job]:
    j = Job()
    yield j
    j.close()


def test_the_book_lists_every_worker_with_where_it_listens(job: Job) -> None:
    for rank, node in enumerate(job.nodes):
        book = node.book
        assert (book.rank, book.name, book.num_servers, book.servers) == (rank, f"worker {rank}", 0, ())
        assert [w.rank for w in book.workers] == list(range(WORKERS))
        assert book.workers == job.nodes[0].book.workers  # one book for all
        for w in book.workers:
            assert w.data.startswith("tcp://127.0.0.1:") and w.local.startswith(f"launchkit-{job.job}-")
    assert len({w.data for w in job.nodes[0].book.workers}) == WORKERS
    run_all(lambda r: job.nodes[r].finish())  # the scheduler ends now, not after a heartbeat timeout


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_worker_reaches_another_on_the_channels_the_book_names(shm: str) -> None:
    """Worker 0 opens a link to worker 1 (same host: its same-host channel for headers, its TCP data
    channel for frames; with PS_SHM=0 TCP only); worker 1 accepts on its listeners and answers."""
    j = Job(PS_SHM=shm)
    try:
        w0, w1 = j.nodes[0], j.nodes[1]
        assert w0.transport is not None
        transport = w0.transport
        poller = Poller()  # worker 1 serves its listeners while worker 0 connects (the handshakes)
        for listener in w1.listeners:
            poller.add(listener)
        got: list[tuple[str, int]] = []

        def answer(msg: Received) -> None:
            frames = msg.frames
            got.append((msg.header.src, len(frames[0].buffer) if frames else 0))
            msg.reply.post(wire.Header("hello_back", msg.header.seq, w1.name))

        links: list = []
        connecting = threading.Thread(
            target=lambda: links.extend(
                open_links(j.cfgs[0], (w0.book.workers[1],), transport, LOG, "worker")
            )
        )
        connecting.start()
        deadline = time.monotonic() + 20
        while connecting.is_alive() and time.monotonic() < deadline:
            poller.serve(answer, 0.05)
        (link,) = links
        assert link.shares_memory == (shm == "1") and link.framed.caps.frames
        link.framed.post(wire.Header("hello", 1, w0.name), [np.arange(1 << 20, dtype=np.float32)])
        link.fast.post(wire.Header("hello", 2, w0.name))
        while len(got) < 2 and time.monotonic() < deadline:
            poller.serve(answer, 0.1)
        assert sorted(got) == [("worker 0", 0), ("worker 0", 4 << 20)]
        back = [m.header.seq for ch in link.channels() for m in _receive(ch, 1)]
        assert sorted(back) == [1, 2]
        for ch in link.channels():
            ch.close()
        for ch in poller.sources():
            assert isinstance(ch, Channel)
            ch.close()
        run_all(lambda r: j.nodes[r].finish())  # the scheduler ends now, not after a heartbeat timeout
    finally:
        j.close()


def _receive(ch: Channel, n: int) -> list[Received]:
    msgs: list[Received] = []
    deadline = time.monotonic() + 20
    while len(msgs) < n and time.monotonic() < deadline:
        if ch.wait(0.1):
            ch.receive(msgs.append)
    return msgs


def test_barrier_then_finish_ends_the_job(job: Job) -> None:
    run_all(lambda r: job.nodes[r].barrier())
    run_all(lambda r: job.nodes[r].finish())
    job.thread.join(20)
    assert job.code == [0]


def test_an_abort_reaches_every_node_naming_the_culprit(job: Job) -> None:
    # (the scheduler relays aborts on the heartbeat channels: once it has heard each node's first)
    deadline = time.monotonic() + 20
    while any(r.ctl is None for r in list(job.scheduler.nodes.values())) and time.monotonic() < deadline:
        time.sleep(0.01)
    job.nodes[2].abort("it ran out of memory")
    for node in job.nodes[:2]:
        assert node.live.failed.wait(20)
        with pytest.raises(NodeFailure, match="ran out of memory") as err:
            node.raise_failure()
        assert err.value.node == "worker 2"
    job.thread.join(20)
    assert job.code == [1]


def test_a_peer_whose_channel_closes_is_blamed_after_the_grace() -> None:
    """No word from the scheduler within ``grace_s``: the node that left is named, and the abort
    goes to the scheduler."""
    from trainer_core.node.book import Book
    from trainer_core.node.liveness import Health

    sched, sched_end = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    book = Book("worker", 0, "worker 0", 2, 0, (), ())
    node = Postoffice(book, sched, Health("worker 0", LOG), LOG, grace_s=0.05)
    with pytest.raises(NodeFailure, match="worker 1 closed its connection") as err:
        node.peer_lost("worker 1")
    assert err.value.node == "worker 1"
    (abort,) = _receive(sched_end, 1)
    assert abort.header.op == protocol.ABORT and abort.header.body["node"] == "worker 1"


def test_requests_are_numbered_tracked_and_forgotten() -> None:
    reqs = Requests()
    a, b, c = reqs.next(), reqs.next(), reqs.next()
    assert (a, b, c) == (1, 2, 3)
    for s in (a, b, c):
        reqs.expect(s)
    ch, _ = MemoryChannel.pair()
    queue = [Received(wire.Header("reply", s), [], ch) for s in (c, a)]

    def pump() -> None:
        reqs.arrived(queue.pop(0))

    assert reqs.forget(b) is None and b in reqs.unclaimed  # its reply, when it comes, is dropped
    assert not reqs.arrived(Received(wire.Header("reply", b), [], ch)) and not reqs.unclaimed
    replies = reqs.wait([a], pump)  # c comes first and is kept for later
    assert list(replies) == [a] and reqs.wait([c], pump)[c].header.seq == c
    assert not reqs.outstanding and not reqs.replies
