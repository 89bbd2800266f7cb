"""The scheduler's protocol (ps/scheduler.py) in one process: each node is a ``MemoryChannel`` pair
whose messages go to ``Scheduler.handle``, which answers on the message's ``reply``.

Covered: the address book once every node registered (ranks from the launcher's hints, else in
registration order), refused registrations, heartbeats, barriers that complete only when every
worker arrived, the normal end (servers told to terminate, workers told they finished, exit 0),
aborts relayed to every other node (exit 1), and a worker that finishes while others wait in a
barrier.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from trainer_core.config import NodeConfig
from trainer_core.node import book
from trainer_core.node.book import NodeInfo
from trainer_core.ps import protocol as wire
from trainer_core.ps.protocol import SCHEMA
from trainer_core.ps.scheduler import Scheduler
from trainer_core.transport.channel import Received
from trainer_core.transport.memory import MemoryChannel

LOG = logging.getLogger("test_ps_scheduler")


class Node:
    """A node's control channel (registration, barriers) and heartbeat channel to the scheduler."""

    def __init__(self, sched: Scheduler, role: str, hint: int = -1, pid: int = 1) -> None:
        self.sched, self.role, self.hint, self.pid = sched, role, hint, pid
        self.ctl, self._ctl_end = MemoryChannel.pair(log=LOG, schema=SCHEMA)
        self.hb, self._hb_end = MemoryChannel.pair(log=LOG, schema=SCHEMA)
        self.name = ""

    def _to_scheduler(self, end: MemoryChannel, channel: MemoryChannel, h: wire.Header) -> None:
        channel.send(h)
        end.receive(self.sched.handle)

    def register(self, **extra: object) -> None:
        body = {"role": self.role, "rank": self.hint, "host": "h", "endpoint": f"tcp://h:{self.pid}"}
        body.update({"host_key": "k", "pid": self.pid, "local": "", "data": "", **extra})
        self._to_scheduler(self._ctl_end, self.ctl, wire.Header(op=wire.REGISTER, body=body))

    def call(self, op: str, seq: int = 1, **body: object) -> None:
        self._to_scheduler(
            self._ctl_end, self.ctl, wire.Header(op=op, seq=seq, src=self.name, body=dict(body))
        )

    def heartbeat(self) -> None:
        self._to_scheduler(self._hb_end, self.hb, wire.Header(op=wire.HEARTBEAT, src=self.name))

    def got(self, channel: MemoryChannel | None = None) -> list[wire.Header]:
        return [m.header for m in self.received(channel)]

    def received(self, channel: MemoryChannel | None = None) -> list[Received]:
        out: list[Received] = []
        (channel or self.ctl).receive(out.append)
        return out

    def close(self) -> None:
        for ch in (self.ctl, self._ctl_end, self.hb, self._hb_end):
            ch.close()


def config(workers: int, servers: int) -> NodeConfig:
    env = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_JOB_SECRET": "s",
    }
    return NodeConfig.from_environ(env)


@pytest.fixture
def job() -> Iterator[tuple[Scheduler, list[Node], list[Node]]]:
    """A scheduler for 1 server and 2 workers, every node registered and its book read."""
    # the scheduler never reads it: the test hands it messages
    router, _ = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    sched = Scheduler(config(2, 1), LOG, router=router)
    servers = [Node(sched, "server", pid=10)]
    workers = [Node(sched, "worker", hint=1, pid=20), Node(sched, "worker", pid=21)]
    for n in [*servers, *workers]:
        n.register()
    for n in [*servers, *workers]:
        (book,) = n.got()
        assert book.op == wire.BOOK
        n.name = book.body["name"]
        n.heartbeat()
        assert [h.op for h in n.got(n.hb)] == [wire.HEARTBEAT_ACK]
    yield sched, servers, workers
    for n in [*servers, *workers]:
        n.close()
    router.close()


def test_the_book_goes_out_once_every_node_registered() -> None:
    router, _ = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    sched = Scheduler(config(2, 1), LOG, router=router)
    nodes = [Node(sched, "worker", pid=1), Node(sched, "server", pid=2), Node(sched, "worker", hint=0, pid=3)]
    nodes[0].register()
    nodes[1].register()
    assert nodes[0].got() == [] and nodes[1].got() == []
    nodes[2].register()
    messages = [n.received()[0] for n in nodes]
    books = [m.header for m in messages]
    assert [b.op for b in books] == [wire.BOOK] * 3
    assert [b.body["name"] for b in books] == ["worker 1", "server 0", "worker 0"]  # hint 0 honoured
    # the lists in the book's frame, one encoding for every node
    read = book._book(books[0], messages[0].frames)
    assert read.servers == (NodeInfo(0, "tcp://h:2", "k", "", ""),) and len(read.workers) == 2
    late = Node(sched, "worker", pid=4)
    late.register()
    (refused,) = late.got()
    assert refused.op == wire.ERROR and refused.body["reason"] == "unexpected registration"
    assert sched.exit_code is None
    for n in [*nodes, late]:
        n.close()
    router.close()


def test_too_many_nodes_of_a_role_are_refused() -> None:
    router, _ = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    sched = Scheduler(config(1, 1), LOG, router=router)
    a, b = Node(sched, "worker", pid=1), Node(sched, "worker", pid=2)
    a.register()
    b.register()
    (refused,) = b.got()
    assert refused.op == wire.ERROR and "more than 1 workers" in refused.body["reason"]
    a.close()
    b.close()
    router.close()


def test_a_barrier_completes_only_when_every_worker_arrived(
    job: tuple[Scheduler, list[Node], list[Node]],
) -> None:
    sched, _, (w1, w0) = job
    w0.call(wire.BARRIER, seq=5)
    assert w0.got() == []
    w1.call(wire.BARRIER, seq=8)
    (d0,), (d1,) = w0.got(), w1.got()
    assert (d0.op, d0.seq, d1.op, d1.seq) == (wire.BARRIER_DONE, 5, wire.BARRIER_DONE, 8)
    assert sched.exit_code is None


def test_the_job_ends_when_every_worker_finished(job: tuple[Scheduler, list[Node], list[Node]]) -> None:
    sched, (server,), (w1, w0) = job
    w0.call(wire.FINISH, seq=3)
    assert sched.exit_code is None and w0.got() == []
    w1.call(wire.FINISH, seq=4)
    assert sched.exit_code == 0
    assert [h.op for h in server.got(server.hb)] == [wire.TERMINATE]  # on its heartbeat channel
    assert [(h.op, h.seq) for h in w0.got()] == [(wire.FINISHED, 3)]
    assert [(h.op, h.seq) for h in w1.got()] == [(wire.FINISHED, 4)]


def test_an_abort_is_relayed_to_every_other_node(job: tuple[Scheduler, list[Node], list[Node]]) -> None:
    sched, (server,), (w1, w0) = job
    w0.call(wire.ABORT, reason="uncaught ValueError: x", node="worker 0")
    assert sched.exit_code == 1
    for n in (server, w1):
        (abort,) = n.got(n.hb)
        assert abort.op == wire.ABORT and abort.body["node"] == "worker 0"
        assert "uncaught ValueError: x" in abort.body["reason"]
    assert w0.got(w0.hb) == []  # the failed node itself is not told
    w1.call(wire.BARRIER)  # after the end, nothing more is served
    assert w1.got() == []


def test_a_worker_that_finishes_while_others_wait_in_a_barrier_ends_the_job(
    job: tuple[Scheduler, list[Node], list[Node]],
) -> None:
    """The job aborts naming worker 1; its finish is answered (it did its part and ends with 0, the
    launcher names it as worker 0's line says it waited for it) and it is told no abort."""
    sched, _, (w1, w0) = job
    w0.call(wire.BARRIER)
    w1.call(wire.FINISH, seq=5)
    assert sched.exit_code == 1
    (abort,) = w0.got(w0.hb)
    assert (
        abort.body["node"] == "worker 1" and "finished while the other workers wait" in abort.body["reason"]
    )
    assert [(h.op, h.seq) for h in w1.got()] == [(wire.FINISHED, 5)]
    assert w1.got(w1.hb) == []


def test_messages_of_unknown_nodes_are_ignored(job: tuple[Scheduler, list[Node], list[Node]]) -> None:
    sched, (server,), _ = job
    stranger = Node(sched, "worker", pid=99)
    stranger.name = "worker 7"
    stranger.call(wire.ABORT, reason="x", node="server 0")
    assert sched.exit_code is None and server.got(server.hb) == [] and stranger.got() == []
    stranger.close()


def test_a_malformed_registration_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    router, _ = MemoryChannel.pair(log=LOG, schema=SCHEMA)
    sched = Scheduler(config(1, 1), LOG, router=router)
    node = Node(sched, "worker")
    with caplog.at_level(logging.WARNING):
        node.ctl.send(wire.Header(op=wire.REGISTER, body={"role": "worker", "rank": "x"}))
        node._ctl_end.receive(sched.handle)
    assert "dropped a bad register message" in caplog.text
    assert node.got() == [] and sched.pending == [] and sched.exit_code is None
    node.close()
    router.close()
