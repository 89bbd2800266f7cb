"""The scheduler with 2000 simulated nodes in one process (issue 28): registration, the book,
heartbeats through the run loop, a barrier and an abort cost work linear in the nodes. Checked by
counting (records visited, bytes encoded, messages), never by the clock; timed at 10,000 nodes in
bench/scale_scheduler.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainer_core.config import NodeConfig
from trainer_core.node import book, protocol
from trainer_core.node.scheduler import NodeRecord, Scheduler
from trainer_core.transport import wire
from trainer_core.transport.channel import Payload, Peer, Received, Source

LOG = logging.getLogger("test_scheduler_scale")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
N = 2000


class SimNode(Peer):
    """A node as the scheduler's reply target: each header encoded as a socket would, counted."""

    def __init__(self, role: str, index: int) -> None:
        self.role, self.index, self.name = role, index, ""
        self.header_bytes = 0
        self.got: list[tuple[bytes, list[bytes]]] = []

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        raw = wire.encode(header)
        self.header_bytes += len(raw)
        if header.op == protocol.BOOK:
            self.name = str(header.body["name"])
        self.got.append((raw, [bytes(memoryview(f).cast("B")) for f in frames] if self.index < 2 else []))

    def register(self) -> Received:
        ip = f"10.0.{self.index // 250}.{self.index % 250 + 1}"
        body = {
            "role": self.role,
            "rank": self.index,
            "host": ip,
            "endpoint": "",
            "pid": 1000 + self.index,
            "host_key": f"{ip}|0f3c2a9e-55d1-4b7e-9a3c-5f0e2d7c1b4a",
            "local": f"lk-s-{self.index:08x}",
            "data": f"tcp://{ip}:45000",
        }
        return Received(wire.Header(op=protocol.REGISTER, body=body), [], self)


class Counted(list[NodeRecord]):
    """A list that counts the records its iterations visit."""

    visited = 0

    def __iter__(self) -> Iterator[NodeRecord]:
        for r in super().__iter__():
            Counted.visited += 1
            yield r


class CountedNodes(dict[str, NodeRecord]):
    """The scheduler's nodes by name, counting the records its scans visit."""

    visited = 0

    def values(self) -> Any:
        def each() -> Iterator[NodeRecord]:
            for r in super(CountedNodes, self).values():
                CountedNodes.visited += 1
                yield r

        return each()


class OneAtATime(Source):
    """``run``'s router: one queued message per wake (the worst case for a scan after each wake)."""

    def __init__(self, queue: list[Received]) -> None:
        self.queue, self.at = queue, 0

    def pollable(self) -> Any:
        return -1

    def wait(self, timeout: float) -> bool:
        return self.at < len(self.queue)

    def receive(self, handle: Callable[[Received], None]) -> bool:
        self.at += 1
        handle(self.queue[self.at - 1])
        return True

    def close(self) -> None:
        return None


def config(workers: int, servers: int = 0) -> NodeConfig:
    env = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_JOB_SECRET": "s",
        "PS_HEARTBEAT_INTERVAL": "1",
        "PS_HEARTBEAT_TIMEOUT": "600",
    }
    return NodeConfig.from_environ(env)


def started(router: Source | None = None) -> tuple[Scheduler, list[SimNode]]:
    sched = Scheduler(config(N), LOG, router=router or OneAtATime([]))
    sched.pending = Counted()
    Counted.visited = 0
    nodes = [SimNode("worker", i) for i in range(N)]
    for n in nodes:
        sched.handle(n.register())
    return sched, nodes


def test_registration_and_the_book_are_linear_in_the_nodes() -> None:
    """Failed on the old code: each registration counted its role's nodes by a scan (2 million
    records visited at 2000 nodes), and each node's book was encoded into its header again (330 KB
    each, 660 MB in all; past about 6000 nodes the book passed the 1 MiB header limit)."""
    sched, nodes = started()
    assert all(n.name for n in nodes) and sched.exit_code is None
    assert Counted.visited <= 10 * N, Counted.visited
    assert sum(n.header_bytes for n in nodes) < 200 * N  # the headers: role, rank, name, counts
    raw, frames = nodes[1].got[-1]
    got = book._book(wire.decode(raw, protocol.SCHEMA), [Payload(memoryview(f)) for f in frames])
    assert (got.name, got.num_workers, len(got.workers)) == ("worker 1", N, N)
    assert got.workers[917].local == "lk-s-00000395" and got.workers[917].data == "tcp://10.0.3.168:45000"


def test_heartbeats_through_the_run_loop_do_not_scan_every_node_each_time() -> None:
    """Failed on the old code: after each wake the loop checked every node's last heartbeat
    (4 million records visited for one heartbeat from each of 2000 nodes)."""
    queue: list[Received] = []
    sched, nodes = started(OneAtATime(queue))
    sched.nodes = CountedNodes(sched.nodes)
    CountedNodes.visited = 0
    queue += [Received(wire.Header(op=protocol.HEARTBEAT, src=n.name), [], n) for n in nodes]
    last = nodes[-1]
    queue.append(Received(wire.Header(op=protocol.ABORT, src=last.name, body={"reason": "end"}), [], last))
    assert sched._run() == 1
    # a scan every 0.2 s at most: a few, where the old loop made one per message (2000)
    assert CountedNodes.visited < 0.05 * N * N, CountedNodes.visited
    told = sum(1 for n in nodes for raw, _ in n.got if wire.decode(raw, protocol.SCHEMA).op == protocol.ABORT)
    assert told == N - 1  # every other node, once


def test_a_barrier_of_2000_workers_answers_each_once() -> None:
    sched, nodes = started()
    for n in nodes:
        sched.handle(Received(wire.Header(op=protocol.BARRIER, seq=7, src=n.name), [], n))
    done = [wire.decode(raw, protocol.SCHEMA) for n in nodes for raw, _ in n.got[1:]]
    assert len(done) == N and all(h.op == protocol.BARRIER_DONE and h.seq == 7 for h in done)


class Sized(SimNode):
    """A node that counts the book's bytes it receives (header and frames) and asks for ``needs``."""

    def __init__(self, role: str, index: int, needs: str | None) -> None:
        super().__init__(role, index)
        self.needs, self.received = needs, 0

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        super().send(header, frames, fds)
        self.received += len(wire.encode(header)) + sum(len(memoryview(f).cast("B")) for f in frames)

    def register(self) -> Received:
        msg = super().register()
        if self.needs is not None:
            msg.header.body["book"] = self.needs
        if self.role == "server":
            msg.header.body["endpoint"] = f"tcp://10.9.0.{self.index}:40000"
        return msg


def test_a_node_that_reaches_the_servers_only_is_sent_the_servers_only() -> None:
    """Failed on the old code: every node was sent every node's addresses (330 KB each at 2000
    nodes, 660 MB in all), though the parameter server's workers reach the servers only and the
    servers nobody. A collective worker (``"all"``, or a node that names no part) gets all."""
    sched = Scheduler(config(N - 16, servers=16), LOG, router=OneAtATime([]))
    nodes = [Sized("server", i, "servers") for i in range(16)]
    nodes += [Sized("worker", i, "all" if i == 1 else None if i == 2 else "servers") for i in range(N - 16)]
    for n in nodes:
        sched.handle(n.register())
    assert all(n.name for n in nodes) and sched.exit_code is None
    pw = [n for n in nodes if n.role == "worker" and n.index not in (1, 2)]
    assert max(n.received for n in pw) < 16 * 200, max(n.received for n in pw)
    whole = 200 * N  # more than the bytes of a whole book (132 a node here)
    assert sum(n.received for n in nodes) < N * 16 * 200 + 2 * whole  # two whole books, the rest the servers
    assert nodes[18].received > N * 100  # worker 2 named no part: all, as from a node of before
    for n in [nodes[16], nodes[17]]:  # workers 0 (the servers only) and 1 (all)
        raw, frames = n.got[-1]
        got = book._book(wire.decode(raw, protocol.SCHEMA), [Payload(memoryview(f)) for f in frames])
        assert len(got.servers) == 16 and got.servers[3].endpoint == "tcp://10.9.0.3:40000"
        assert len(got.workers) == (0 if n.index == 0 else N - 16)


def test_a_registration_asking_for_an_unknown_part_of_the_book_is_refused() -> None:
    sched = Scheduler(config(2), LOG, router=OneAtATime([]))
    bad = Sized("worker", 0, "neighbours")
    sched.handle(bad.register())
    ((raw, _),) = bad.got
    h = wire.decode(raw, protocol.SCHEMA)
    assert h.op == protocol.ERROR and h.body["reason"] == "book must be one of all, servers, not 'neighbours'"
    assert sched.pending == [] and sched.registered["worker"] == 0
