"""An elastic job's sync rounds (ps/rounds.py, through store.Store and handler.RequestHandler)
without sockets: the round closes when the members of the current epoch have pushed; a worker
that leaves mid-round has its push and its waiting requests dropped from that round, which then
closes with the others' pushes; a newcomer's pushes count from the next round it pushes to; the
sum is in worker order whatever the order of arrival; the servers' state saved after a change
restores on another membership. The server's loop (ps/server.py, its
message step alone) holds a newcomer's request that comes before the book admitting it.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from trainer_core.config import NodeConfig
from trainer_core.node.book import Book
from trainer_core.node.liveness import Health
from trainer_core.node.membership import worker_id
from trainer_core.ps import protocol as wire
from trainer_core.ps import rounds
from trainer_core.ps.handler import RequestHandler
from trainer_core.ps.protocol import SCHEMA
from trainer_core.ps.request import KeyState
from trainer_core.ps.server import Server
from trainer_core.ps.store import Store
from trainer_core.transport.channel import Received
from trainer_core.transport.memory import MemoryChannel

from .test_store import ones, req


def elastic(workers: int) -> Store:
    s = Store(num_workers=workers)
    s.elastic = True
    s.handle(req(wire.INIT, 0, ones(0)))
    return s


def test_a_round_the_remaining_members_have_all_pushed_to_closes_when_the_leaver_goes() -> None:
    s = elastic(3)
    a, b = req(wire.PUSHPULL, 0, ones(1)), req(wire.PUSHPULL, 1, ones(2))
    assert s.handle(a) == [] and s.handle(b) == []  # waits for worker 2, which never pushes
    done = s.workers_changed(2, {2})
    assert set(map(id, done)) == {id(a), id(b)}
    assert a.results[0].tolist() == b.results[0].tolist() == [3.0] * 4
    # the next round counts 2 members
    c, d = req(wire.PUSHPULL, 0, ones(5)), req(wire.PUSHPULL, 1, ones(6))
    assert s.handle(c) == [] and set(map(id, s.handle(d))) == {id(c), id(d)}
    assert c.results[0].tolist() == [11.0] * 4


def test_a_leaver_that_pushed_has_its_push_and_requests_dropped_from_the_round() -> None:
    s = elastic(3)
    gone = req(wire.PUSHPULL, 2, ones(100))
    a = req(wire.PUSHPULL, 0, ones(1))
    assert s.handle(gone) == [] and s.handle(a) == []
    assert s.workers_changed(2, {2}) == []  # one of the 2 members pushed: the round stays open
    b = req(wire.PUSHPULL, 1, ones(2))
    done = s.handle(b)
    assert set(map(id, done)) == {id(a), id(b)}  # the leaver's request is not answered
    assert a.results[0].tolist() == [3.0] * 4  # its 100 is not in the sum
    assert gone.results[0] is None


def test_a_newcomer_counts_from_the_epoch_it_joins() -> None:
    s = elastic(2)
    a = req(wire.PUSHPULL, 0, ones(1))
    assert s.handle(a) == []
    assert s.workers_changed(3, set()) == []  # worker 5 joins: this round now waits for 3
    new = req(wire.PULL, 5)
    assert s.handle(new) == [new] and new.results[0].tolist() == [0.0] * 4  # the current value
    b, c = req(wire.PUSHPULL, 1, ones(2)), req(wire.PUSHPULL, 5, ones(4))
    assert s.handle(b) == []
    assert set(map(id, s.handle(c))) == {id(a), id(b), id(c)} and c.results[0].tolist() == [7.0] * 4


def test_the_round_sums_in_worker_order_whatever_the_order_of_arrival() -> None:
    x = np.array([1e8, 1.0, -1e8, 0.5], np.float32)
    y = np.array([1.0, 1e8, 3.0, -0.25], np.float32)
    z = np.array([-1e8, -1e8, 1e8, 1e-3], np.float32)
    results = []
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        st = KeyState(weight=np.zeros(4, np.float32))
        for w in order:
            rounds.keep(st, w, [x, y, z][w])
        results.append(rounds.total(st, lambda dt, n: np.empty(n, dt)).tobytes())
    assert results[0] == results[1] == results[2]
    expected = (x + y) + z
    assert results[0] == expected.tobytes()


def test_the_handler_takes_the_members_by_id_and_refuses_a_leaver() -> None:
    h = RequestHandler(3, "test", logging.getLogger("test_ps_rounds"), elastic=True)
    assert h.store.elastic and h.members == {0, 1, 2}
    h.workers_changed(3, {worker_id("worker 1")}, {worker_id("worker 3")})
    assert h.members == {0, 2, 3} and h.num_workers == 3 and h.store.num_workers == 3
    h.close()


def test_a_round_does_not_wait_for_a_newcomer_that_pushes_to_another_key_first() -> None:
    # keys k and k1 pushed in turn; worker 5 joins while the others wait in k1's round and
    # pushes to k first: k1's round closes with the two, k's next round takes all three
    s = elastic(2)
    s.handle(req(wire.INIT, 0, ones(0), key="k1"))
    for w in (0, 1):
        assert len(s.handle(req(wire.PUSHPULL, w, ones(1)))) == 2 * w  # k's round closes
    a = req(wire.PUSHPULL, 0, ones(1), key="k1")
    assert s.handle(a) == []
    assert s.workers_changed(3, set(), {5}) == []
    new = req(wire.PUSHPULL, 5, ones(4))  # k, the next round
    assert s.handle(new) == []
    b = req(wire.PUSHPULL, 1, ones(2), key="k1")
    assert set(map(id, s.handle(b))) == {id(a), id(b)} and a.results[0].tolist() == [3.0] * 4
    c, d = req(wire.PUSHPULL, 0, ones(1)), req(wire.PUSHPULL, 1, ones(2))
    assert s.handle(c) == []
    assert set(map(id, s.handle(d))) == {id(new), id(c), id(d)} and new.results[0].tolist() == [7.0] * 4
    # from now on k's rounds wait for worker 5 as well; k1's once it has pushed there
    e, f = req(wire.PUSHPULL, 0, ones(1)), req(wire.PUSHPULL, 1, ones(1))
    assert s.handle(e) == [] and s.handle(f) == []


def test_the_servers_loop_holds_a_newcomers_request_until_the_book_that_admits_it() -> None:
    """The scheduler sends the book that admits a worker to the servers (on their heartbeat
    channels) before it answers the worker, but the worker's first request comes on another
    channel and may be first: it is served once the book is there, not refused."""
    env = {
        "DMLC_ROLE": "server",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": "1",
        "DMLC_NUM_WORKER": "2",
        "LAUNCHKIT_JOB_SECRET": "s",
        "LAUNCHKIT_ELASTIC": "1:3",
        "PS_HEARTBEAT_TIMEOUT": "20",
    }
    log = logging.getLogger("test_ps_rounds")
    srv = Server(NodeConfig.from_environ(env), log)
    srv.handler = RequestHandler(2, "test", log, elastic=True)
    srv.live = Health("server 0", log)
    worker, server_end = MemoryChannel.pair(log=log, schema=SCHEMA)
    try:
        srv.handler.store.handle(req(wire.INIT, 0, ones(7)))
        entry = wire.Entry("k", 0, 4, "<f4")
        worker.send(wire.Header(op=wire.PULL, seq=1, src="worker 3", entries=(entry,), body={"rank": 3}))
        got: list[Received] = []
        server_end.receive(got.append)
        admits = Book("server", 0, "server 0", 3, 1, (), epoch=1, joined=("worker 3",))
        threading.Timer(0.3, srv.books.put, (admits,)).start()
        srv._handle(got[0])  # waits for the book
        replies: list[Received] = []
        worker.receive(replies.append)
        assert [m.header.op for m in replies] == [wire.REPLY], replies[0].header.body
        assert np.frombuffer(replies[0].frames[0].buffer, np.float32).tolist() == [7.0] * 4
        assert srv.handler.members == {0, 1, 3}
        # a worker that left is refused at once (no book will name it again)
        srv.books.put(Book("server", 0, "server 0", 2, 1, (), epoch=2, left=("worker 1",)))
        worker.send(wire.Header(op=wire.PULL, seq=2, src="worker 1", entries=(entry,), body={"rank": 1}))
        server_end.receive(got.append)
        srv._handle(got[1])
        worker.receive(replies.append)
        assert replies[1].header.op == wire.ERROR and "bad worker rank 1" in replies[1].header.body["reason"]
    finally:
        worker.close()
        server_end.close()
        srv.handler.close()


def _momentum(workers: int) -> Store:
    s = Store(num_workers=workers)
    s.elastic = True
    s.set_optimizer({"type": "sgd", "learning_rate": 0.1, "momentum": 0.9})
    s.handle(req(wire.INIT, 0, ones(0)))
    return s


def _round(s: Store, pushes: dict[int, float]) -> list[float]:
    """One sync round of ``pushes`` (rank -> value); every pull's result, which must agree."""
    reqs = [req(wire.PUSHPULL, rank, ones(v)) for rank, v in pushes.items()]
    done = [d for r in reqs for d in s.handle(r)]
    assert set(map(id, done)) == set(map(id, reqs))
    results = {tuple(r.results[0].tolist()) for r in reqs}
    assert len(results) == 1
    return list(results.pop())


@pytest.mark.parametrize("later", [1, 4])
def test_a_checkpoint_of_the_servers_state_taken_after_a_change_restores_on_another_membership(
    later: int,
) -> None:
    """The servers' state (value, optimizer slots) saved after a worker left and another joined
    restores in a job of any other number of workers: the next round there, with the same sum of
    pushes, gives bit-identical values."""
    s = _momentum(3)
    _round(s, {0: 1.0, 1: 2.0, 2: 3.0})
    gone = req(wire.PUSHPULL, 2, ones(50.0))
    assert s.handle(gone) == []
    assert s.workers_changed(2, {2}) == []  # worker 2 leaves mid-round: its push is dropped
    _round(s, {0: 0.5, 1: 0.25})
    assert s.workers_changed(3, set(), {7}) == []  # worker 7 joins
    _round(s, {7: -4.0, 0: 1.0, 1: 1.0})  # (a newcomer counts from its first push)
    entries, arrays, slots, scalars = s.get_state()
    assert sorted(slots) == ["opt/mom", "value"]
    t = _momentum(later)
    t.set_state(tuple(entries), arrays, slots, [(k, p, n, v) for k, p, n, v in scalars])
    restored = t.get_state()
    assert [a.tolist() for a in restored[1]] == [a.tolist() for a in arrays]
    # the next round: the same sum of pushes, spread over the other membership
    expected = _round(s, {0: 1.5, 1: 2.0, 7: 0.5})
    spread = {r: 0.0 for r in range(later)}
    spread[0] = 4.0
    assert _round(t, spread) == expected
