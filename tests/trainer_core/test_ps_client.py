"""The worker side (ps/client.py, and kv/dist.py on top of it) in one process, on in-memory channels.

``InProcessJob`` plays the rest of a job without sockets or subprocesses: ``RequestHandler`` servers
and a scheduler stand-in (barriers, finish, aborts), served by one thread over ``MemoryChannel``
pairs, the way the real server's loop serves its channels. Each worker is a ``WorkerClient`` built
on ``Route``s of memory channels (frames read in place, or a same-host route with shared memory).
Covered: requests and replies, pushes confirmed by later replies, replies read into the caller's
buffers, error replies (synchronous and to a push), a server whose channel closes (the client
blames it and aborts the job), a job failure seen between waits, and the whole KV API
(``DistKVStore``) with sync rounds of two workers, split keys, the same-host path, compression
and async mode; ``kv.rank``/``kv.num_workers`` read from the current book.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError, NodeFailure
from trainer_core.kv.dist import DistKVStore
from trainer_core.node import protocol as node_protocol
from trainer_core.node.agree import Meeting, Waiter
from trainer_core.node.book import Book, NodeInfo
from trainer_core.node.liveness import Health
from trainer_core.ps import protocol as wire
from trainer_core.ps.client import WorkerClient
from trainer_core.ps.handler import RequestHandler
from trainer_core.ps.protocol import SCHEMA
from trainer_core.ps.routes import Route
from trainer_core.transport.channel import Caps, Channel, Poller, Received
from trainer_core.transport.devshm import job_prefix
from trainer_core.transport.memory import MemoryChannel

LOG = logging.getLogger("test_ps_client")
JOB = "unit-ps-client"
FRAMED = Caps(frames=True, direct=True)
AS_ZMQ = Caps(frames=True)  # frames, but not read in place
SAME_HOST = Caps(frames=False, shared_memory=True)


class InProcessJob:
    """Servers and a scheduler stand-in for ``num_workers`` in-process workers."""

    def __init__(self, num_workers: int, num_servers: int, shm: bool = False, framed: Caps = FRAMED) -> None:
        self.num_workers, self.num_servers, self.shm, self.framed = num_workers, num_servers, shm, framed
        self.handlers = [
            RequestHandler(num_workers, job_prefix(JOB), LOG, shared=shm, name=f"server {i}")
            for i in range(num_servers)
        ]
        self.serving: list[tuple[Poller, Callable[[Received], None]]] = [
            (Poller(), h.handle) for h in self.handlers
        ]
        self.sched = Poller()
        self.meeting = Meeting(num_workers)  # the workers in a barrier or an agreement
        self.finished: list[Received] = []
        self.aborts: list[dict] = []
        self.channels: list[Channel] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def client(self, rank: int, grace_s: float = 0.1) -> WorkerClient:
        routes = []
        for i, (poller, _) in enumerate(self.serving):
            framed, framed_end = MemoryChannel.pair(self.framed, log=LOG, schema=SCHEMA)
            framed_end.place = self.handlers[i].place
            poller.add(framed_end)
            fast = framed
            if self.shm:
                fast, fast_end = MemoryChannel.pair(SAME_HOST, log=LOG, schema=SCHEMA)
                poller.add(fast_end)
                self.channels.append(fast_end)
            routes.append(Route(framed=framed, fast=fast))
            self.channels.append(framed_end)
        sched, sched_end = MemoryChannel.pair(AS_ZMQ, log=LOG, schema=SCHEMA)
        self.sched.add(sched_end)
        self.channels.append(sched_end)
        book = Book(
            role="worker",
            rank=rank,
            name=f"worker {rank}",
            num_workers=self.num_workers,
            num_servers=self.num_servers,
            servers=tuple(NodeInfo(i, f"memory:{i}", "this machine") for i in range(self.num_servers)),
        )
        return WorkerClient(book, routes, sched, Health(f"worker {rank}", LOG), LOG, grace_s=grace_s)

    def start(self) -> InProcessJob:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            for poller, handle in self.serving:
                poller.serve(handle, 0.002)
            self.sched.serve(self._scheduler, 0.002)

    def _scheduler(self, msg: Received) -> None:
        h = msg.header
        if h.op in (wire.BARRIER, node_protocol.AGREE):  # as the scheduler does (``node/agree.py``)
            rank = int(h.src.split()[-1])
            value = h.body.get("value") if h.op == node_protocol.AGREE else None
            self.meeting.add(Waiter(rank, h.body.get("at", "barrier()"), h.op, value, msg.reply, h.seq))
            if len(self.meeting.waiting) == self.num_workers:
                body, waiters = self.meeting.outcome()
                for w in waiters:
                    op = wire.BARRIER_DONE if w.op == wire.BARRIER else node_protocol.AGREED
                    w.peer.send(wire.Header(op=op, seq=w.seq, body=body))
        elif h.op == wire.FINISH:
            self.finished.append(msg)
            if len(self.finished) == self.num_workers:
                for m in self.finished:
                    m.reply.send(wire.Header(op=wire.FINISHED, seq=m.header.seq))
        elif h.op == wire.ABORT:
            self.aborts.append(dict(h.body))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for ch in self.channels:
            ch.close()
        for h in self.handlers:
            h.close()


@pytest.fixture
def job() -> Iterator[Callable[..., InProcessJob]]:
    made: list[InProcessJob] = []

    def make(*args: object, **kwargs: object) -> InProcessJob:
        made.append(InProcessJob(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for j in made:
        j.stop()


def entry(key: wire.Key = "w", n: int = 4) -> wire.Entry:
    return wire.Entry(key, 0, n, "<f4")


def test_requests_get_their_replies_and_pushes_are_confirmed_by_later_ones(
    job: Callable[..., InProcessJob],
) -> None:
    j = job(1, 1)
    c = j.client(0)
    j.start()
    (reply,) = c.wait([c.send(0, wire.INIT, (entry(),), [np.arange(4, dtype=np.float32)])]).values()
    assert reply.header.op == wire.REPLY
    push = c.send(0, wire.PUSH, (entry(),), [np.ones(4, np.float32)], keep=False)
    assert not c.handled(0, push) and c.outstanding == set()
    c.confirm(0, push)  # an empty pull: its reply proves the push was handled
    assert c.handled(0, push)
    out = c.wait([c.send(0, wire.PULL, (entry(),))])
    assert np.frombuffer(bytes(next(iter(out.values())).frames[0].buffer), np.float32).tolist() == [1.0] * 4
    c.drain()
    c.close()


def test_reply_frames_are_read_into_the_callers_buffer(job: Callable[..., InProcessJob]) -> None:
    j = job(1, 1)
    c = j.client(0)
    j.start()
    c.wait([c.send(0, wire.INIT, (entry(),), [np.full(4, 6.0, np.float32)])])
    assert c.sends_directly(0)
    dst = np.zeros(4, np.float32)
    seq = c.send(0, wire.PULL, (entry(),), into=[dst.view(np.uint8).data])
    (frame,) = c.wait([seq])[seq].frames
    assert frame.placed and dst.tolist() == [6.0] * 4
    c.close()


def test_an_error_reply_raises_and_an_error_to_a_push_surfaces_at_the_next_call(
    job: Callable[..., InProcessJob],
) -> None:
    j = job(1, 1)
    c = j.client(0)
    j.start()
    with pytest.raises(KVError, match=r"server refused the request: .*not initialized"):
        c.wait([c.send(0, wire.PULL, (entry("nokey"),))])
    c.send(0, wire.PUSH, (entry("nokey"),), [np.ones(4, np.float32)], keep=False)
    with pytest.raises(KVError, match="server refused a push"):
        c.drain()
    c.close()


def test_a_request_refused_after_a_refused_push_raises_the_push_error_first(
    job: Callable[..., InProcessJob],
) -> None:
    """The server refuses a push, then the pull after it, and the worker reads both replies in one
    wait: the push's error (the earlier, and the cause) is raised, not the pull's."""
    j = job(1, 1)
    c = j.client(0)
    both = threading.Event()
    poller, handle = j.serving[0]

    def answered(msg: Received) -> None:
        handle(msg)
        if msg.header.op == wire.PULL:
            both.set()

    j.serving[0] = (poller, answered)
    c.send(0, wire.PUSH, (entry("nokey"),), [np.ones(4, np.float32)], keep=False)
    seq = c.send(0, wire.PULL, (entry("nokey"),))
    j.start()
    assert both.wait(10)
    with pytest.raises(KVError, match="server refused a push: key 'nokey'"):
        c.wait([seq])
    c.check()  # raised once, not again
    c.close()


def test_a_server_whose_channel_closes_is_blamed_and_the_job_aborted(
    job: Callable[..., InProcessJob],
) -> None:
    j = job(1, 2)
    c = j.client(0)
    j.start()
    j.channels[1].close()  # server 1's end of its channel to this worker: it died
    t = time.monotonic()
    with pytest.raises(NodeFailure, match="server 1 closed its connection") as err:
        c.wait([c.send(1, wire.PULL)])
    assert err.value.node == "server 1" and time.monotonic() - t < 5
    deadline = time.monotonic() + 5
    while not j.aborts:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert j.aborts == [{"reason": "server 1 closed its connection: it died", "node": "server 1"}]
    with pytest.raises(NodeFailure):
        c.send(0, wire.PULL)  # the store cannot be used any more
    c.close()


def test_a_reply_announcing_buffers_that_did_not_come_ends_the_job(job: Callable[..., InProcessJob]) -> None:
    """Dropping such a reply would leave its request waiting for ever: the server is blamed at once."""
    j = job(1, 1, shm=True)
    c = j.client(0)
    seq = c.send(0, wire.PULL)  # no frames: on the same-host channel
    server_end = j.channels[0]
    server_end.receive(lambda msg: None)
    server_end.send(wire.Header(wire.REPLY, seq, body={"fds": [[7, 64]]}))  # and no descriptor
    t = time.monotonic()
    with pytest.raises(NodeFailure, match="server 0: a reply announced shared buffers") as err:
        c.wait([seq])
    assert err.value.node == "server 0" and time.monotonic() - t < 1
    aborts: list[dict] = []
    j.channels[-1].receive(lambda msg: aborts.append(dict(msg.header.body)))
    assert [a["node"] for a in aborts] == ["server 0"]
    c.close()


def test_a_job_failure_ends_a_wait(job: Callable[..., InProcessJob]) -> None:
    j = job(2, 1)
    c = j.client(0)
    j.client(1)
    j.start()
    c.wait([c.send(0, wire.INIT, (entry(),), [np.zeros(4, np.float32)])])
    seq = c.send(0, wire.PUSHPULL, (entry(),), [np.ones(4, np.float32)])  # waits for worker 1
    threading.Timer(0.2, lambda: c.live.fail(NodeFailure("worker 1 died", node="worker 1"))).start()
    with pytest.raises(NodeFailure, match="worker 1 died"):
        c.wait([seq])
    c.close()


# -- the KV API on top, two workers in threads -------------------------------------------------------


def cfg(bound: int = 1000) -> NodeConfig:
    env = {
        "DMLC_ROLE": "worker",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": "2",
        "DMLC_NUM_WORKER": "2",
        "LAUNCHKIT_JOB_SECRET": "s",
        "LAUNCHKIT_JOB_ID": JOB,
        "MXNET_KVSTORE_BIGARRAY_BOUND": str(bound),
    }
    return NodeConfig.from_environ(env)


def run_workers(j: InProcessJob, kind: str, body: Callable[[DistKVStore], object]) -> list[object]:
    """``body(kv)`` on every worker, each in its own thread; their results (or exceptions), by rank."""
    clients = [j.client(r) for r in range(j.num_workers)]
    j.start()
    results: list[object] = [None] * j.num_workers

    def run(rank: int) -> None:
        kv = DistKVStore(kind, cfg(), client=clients[rank])
        try:
            results[rank] = body(kv)
        except BaseException as exc:
            results[rank] = exc
        finally:
            kv.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(j.num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def sync_rounds(kv: DistKVStore) -> dict:
    kv.init(["small", "big"], [np.zeros(5, np.float32), np.zeros(3000, np.float32)])
    out_small, out_big = np.empty(5, np.float32), np.empty(3000, np.float32)
    hist = []
    for step in range(3):
        g = np.full(3000, kv.rank + 1.0 + step, np.float32)
        kv.push("big", g)
        g[:] = -1e9  # reusable as soon as push returns
        kv.pull("big", out_big)
        kv.pushpull("small", np.full(5, 10.0 * (kv.rank + 1), np.float32), out_small)
        hist.append((np.unique(out_big).tolist(), out_small.tolist()))
    return {"hist": hist, "parts": [p.server for p in kv.meta["big"].parts], "stats": kv.wire_stats()}


@pytest.mark.parametrize("shm", [False, True])
def test_dist_sync_rounds_sum_every_workers_push(job: Callable[..., InProcessJob], shm: bool) -> None:
    j = job(2, 2, shm=shm)
    res = run_workers(j, "dist_sync", sync_rounds)
    for r in res:
        assert isinstance(r, dict)
        assert r["parts"] == [0, 1]  # 3000 >= the bound: split over both servers
        for step, (big, small) in enumerate(r["hist"]):
            assert big == [3.0 + 2 * step]  # (1 + step) + (2 + step)
            assert small == [30.0] * 5
        assert r["stats"]["raw_sent"] == 3 * (3000 + 5) * 4
    if shm:  # arrays went through shared memory; the servers kept values in their own buffers
        assert all(h.segments for h in j.handlers) and all(h.buffers for h in j.handlers)
    else:
        assert not any(h.segments for h in j.handlers)


def test_dist_sync_over_a_channel_that_does_not_send_in_place(job: Callable[..., InProcessJob]) -> None:
    """As over CURVE: a push's frames leave after ``send`` returns, so the worker sends a private copy."""
    j = job(2, 2, framed=AS_ZMQ)
    for r in run_workers(j, "dist_sync", sync_rounds):
        assert isinstance(r, dict)
        assert [big for big, _ in r["hist"]] == [[3.0], [5.0], [7.0]]


def test_compressed_pushes_and_pulls_through_the_kv_api(job: Callable[..., InProcessJob]) -> None:
    def body(kv: DistKVStore) -> dict:
        kv.set_gradient_compression({"type": "1bit"})
        kv.init("w", np.zeros(4096, np.float32))
        out = np.empty(4096, np.float32)
        kv.pushpull("w", np.full(4096, 1.0 + kv.rank, np.float32), out)
        return {"v": np.unique(out).tolist(), "stats": kv.wire_stats()}

    for r in run_workers(job(2, 2), "dist_sync", body):
        assert isinstance(r, dict)
        assert r["v"] == [3.0]
        assert r["stats"]["sent"] * 20 < r["stats"]["raw_sent"]  # ~31x smaller


def test_dist_async_applies_each_push_at_once(job: Callable[..., InProcessJob]) -> None:
    def body(kv: DistKVStore) -> list:
        kv.init(0, np.zeros(3, np.float32))
        kv.barrier()
        if kv.rank == 1:
            kv.push(0, np.full(3, 7.0, np.float32))
        kv.barrier()
        return kv.pull(0, np.empty(3, np.float32)).tolist()

    assert run_workers(job(2, 2), "dist_async", body) == [[7.0] * 3, [7.0] * 3]


def test_kv_rank_and_num_workers_follow_the_current_book(job: Callable[..., InProcessJob]) -> None:
    """As MXNet's properties, read each time: after an elastic job's change (the scheduler's next
    book: worker 0 left, worker 1 is rank 0 of 1) they are the new book's, not the creation's."""

    def body(kv: DistKVStore) -> tuple:
        before = (kv.rank, kv.num_workers)
        b = kv.client.book
        if b.rank == 1:
            kv.client.node.new_book(replace(b, rank=0, num_workers=1, epoch=1, left=("worker 0",)))
        return before, (kv.rank, kv.num_workers)

    assert run_workers(job(2, 1), "dist_sync", body) == [((0, 2), (0, 2)), ((1, 2), (0, 1))]
