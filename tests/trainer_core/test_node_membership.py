"""An elastic job's rosters (node/membership.py, pure) and the scheduler that keeps them
(node/scheduler.py) in one process: each node a ``MemoryChannel`` pair whose messages go to
``Scheduler.handle`` (as tests/trainer_core/test_ps_scheduler.py).

Covered: admitting and dropping make the next epoch with dense ranks and stable names; a newcomer's
name; the scheduler of an elastic job admits a late worker up to MAX, drops one that another node
reports gone or whose heartbeats stop (its book of the next epoch to every node, barriers and
finish counting the members), aborts below MIN naming the root cause, and tells a dropped worker
that is alive after all to end; a worker that registers at MAX waits for a dead member's drop; one
of the workers' next restart drops the stopped group; a job that is not elastic still refuses a
late registration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from trainer_core.config import NodeConfig
from trainer_core.node import book
from trainer_core.node.membership import Roster, below_min, describe, newcomer_name
from trainer_core.ps import protocol as wire
from trainer_core.ps.protocol import SCHEMA
from trainer_core.ps.scheduler import Scheduler
from trainer_core.transport.memory import MemoryChannel

from .test_ps_scheduler import Node

LOG = logging.getLogger("test_node_membership")


# -- the rosters (pure) ----------------------------------------------------------------------------


def test_a_drop_makes_the_next_epoch_with_dense_ranks_and_the_same_names() -> None:
    r0 = Roster(0, ("worker 0", "worker 1", "worker 2", "worker 3"))
    r1 = r0.drop("worker 1")
    assert r1 == Roster(1, ("worker 0", "worker 2", "worker 3"), left=("worker 1",))
    assert [r1.rank_of(n) for n in r1.workers] == [0, 1, 2]
    assert r1.renumbered(r0) == {0: 0, 2: 1, 3: 2}  # a survivor's rank only goes down
    with pytest.raises(ValueError, match="worker 1 is not a member"):
        r1.drop("worker 1")


def test_an_admission_appends_the_newcomer_as_the_last_rank() -> None:
    r1 = Roster(1, ("worker 0", "worker 2"))
    r2 = r1.admit("worker 4")
    assert r2 == Roster(2, ("worker 0", "worker 2", "worker 4"), joined=("worker 4",))
    assert r2.rank_of("worker 4") == 2 and r2.renumbered(r1) == {0: 0, 1: 1}
    with pytest.raises(ValueError, match="member already"):
        r2.admit("worker 0")
    assert describe(r2) == "epoch 2: 3 workers (worker 4 joined)"
    assert describe(r1.drop("worker 0")) == "epoch 2: 1 workers (worker 0 left)"


def test_a_newcomer_is_named_by_its_launcher_index_never_by_a_name_used_before() -> None:
    used = {"worker 0", "worker 1", "worker 2"}
    assert newcomer_name(3, used) == "worker 3"
    assert newcomer_name(1, used) == "worker 3"  # (worker 1 was someone else: never reused)
    assert newcomer_name(-1, used | {"worker 7"}) == "worker 8"
    assert newcomer_name(-1, set()) == "worker 0"


def test_below_min_only_in_an_elastic_job() -> None:
    assert below_min(1, (2, 4)) and not below_min(2, (2, 4)) and not below_min(0, None)


# -- the scheduler of an elastic job (in one process) ------------------------------------------------


def config(workers: int, servers: int, elastic: str | None) -> NodeConfig:
    env = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_JOB_SECRET": "s",
        "PS_HEARTBEAT_INTERVAL": "0.05",
        "PS_HEARTBEAT_TIMEOUT": "0.2",
        **({"LAUNCHKIT_ELASTIC": elastic} if elastic else {}),
    }
    return NodeConfig.from_environ(env)


def books(node: Node) -> list[book.Book]:
    """The books that reached ``node`` on its heartbeat channel."""
    return [book._book(m.header, m.frames) for m in node.received(node.hb) if m.header.op == wire.BOOK]


class Elastic:
    """A scheduler of an elastic job (``2:4``) with 1 server and 3 workers, all joined."""

    def __init__(self, elastic: str = "2:4", workers: int = 3) -> None:
        self.router, _ = MemoryChannel.pair(log=LOG, schema=SCHEMA)
        self.sched = Scheduler(config(workers, 1, elastic), LOG, router=self.router)
        self.server = Node(self.sched, "server", pid=10)
        self.workers = [Node(self.sched, "worker", hint=i, pid=20 + i) for i in range(workers)]
        self.nodes = [self.server, *self.workers]
        for n in self.nodes:
            n.register()
        for n in self.nodes:
            (first,) = n.got()
            n.name = first.body["name"]
            n.heartbeat()
            assert [h.op for h in n.got(n.hb)] == [wire.HEARTBEAT_ACK]

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        self.router.close()


@pytest.fixture
def job() -> Iterator[Elastic]:
    j = Elastic()
    yield j
    j.close()


def test_a_worker_reported_gone_is_dropped_and_every_node_gets_the_next_book(job: Elastic) -> None:
    w0, w1, w2 = job.workers
    w2.call(wire.ABORT, reason="worker 1 closed its connection: it died", node="worker 1")
    assert job.sched.exit_code is None  # the job goes on
    for n in (job.server, w0, w2):
        (b,) = books(n)
        assert (b.epoch, b.num_workers, b.left, b.joined) == (1, 2, ("worker 1",), ())
    assert books(w0) == []  # (read once above: nothing more came)
    assert [h.op for h in w1.got(w1.hb)] == [wire.ABORT]  # alive after all: it must end
    # the survivors' ranks are dense again, their names unchanged
    assert job.sched.nodes["worker 2"].rank == 1 and job.sched.nodes["worker 0"].rank == 0
    # a second report of the same worker is moot (it must not drop the reporter)
    w0.call(wire.ABORT, reason="worker 1 closed its connection: it died", node="worker 1")
    assert job.sched.exit_code is None and "worker 0" in job.sched.nodes


def test_the_book_of_the_next_epoch_lists_the_workers_by_name(job: Elastic) -> None:
    w0, _, w2 = job.workers
    w0.call(wire.ABORT, reason="gone", node="worker 1")
    (b,) = books(w2)
    assert b.rank == 1 and b.name == "worker 2"
    assert [b.worker_name(r) for r in range(b.num_workers)] == ["worker 0", "worker 2"]
    (s,) = books(job.server)
    assert (s.role, s.name, s.num_workers, s.epoch) == ("server", "server 0", 2, 1)


def test_a_barrier_counts_the_members_of_the_epoch(job: Elastic) -> None:
    w0, _, w2 = job.workers
    w0.call(wire.BARRIER, seq=5)
    w2.call(wire.BARRIER, seq=6)
    assert w0.got() == [] and w2.got() == []  # worker 1 is still a member
    w0.call(wire.ABORT, reason="gone", node="worker 1")
    (done0,) = w0.got()
    (done2,) = w2.got()
    assert (done0.op, done0.seq, done2.op, done2.seq) == (wire.BARRIER_DONE, 5, wire.BARRIER_DONE, 6)


def test_finish_counts_the_members_of_the_epoch(job: Elastic) -> None:
    w0, w1, w2 = job.workers
    w0.call(wire.FINISH, seq=3)
    w1.call(wire.FINISH, seq=3)  # it finished, then died: its finish no longer counts
    w2.call(wire.ABORT, reason="gone", node="worker 1")
    assert job.sched.exit_code is None
    w2.call(wire.FINISH, seq=4)
    assert job.sched.exit_code == 0
    assert [h.op for h in job.server.got(job.server.hb)][-1] == wire.TERMINATE


def test_a_late_worker_is_admitted_as_the_last_rank_up_to_max(job: Elastic) -> None:
    late = Node(job.sched, "worker", hint=3, pid=30)
    job.nodes.append(late)
    late.register()
    (b,) = [book._book(m.header, m.frames) for m in late.received()]
    assert (b.epoch, b.rank, b.name, b.num_workers, b.joined) == (1, 3, "worker 3", 4, ("worker 3",))
    assert [w.name for w in b.workers] == ["worker 0", "worker 1", "worker 2", "worker 3"]
    for n in job.workers:
        (nb,) = books(n)
        assert nb.epoch == 1 and nb.num_workers == 4
    fifth = Node(job.sched, "worker", hint=4, pid=31)
    job.nodes.append(fifth)
    fifth.register()
    assert fifth.got() == []  # at MAX it waits for a member to leave, within the heartbeat bound
    job.sched._lobby_moves(time.monotonic() + 1.0)  # (0.2 + 2 x 0.05 s) and none left
    (refused,) = fifth.got()
    assert refused.op == wire.ERROR and "maximum of 4 workers" in refused.body["reason"]
    assert "none left within 0.3 s" in refused.body["reason"] and job.sched.roster.size == 4


def test_a_worker_that_registers_at_max_is_admitted_when_a_dead_member_is_dropped() -> None:
    """The launcher's replacement of a dead worker may register before the scheduler has dropped
    it (the heartbeat bound is about the launcher's cool-down): it waits, and takes the place."""
    j = Elastic("2:3")
    try:
        late = Node(j.sched, "worker", hint=3, pid=30)
        j.nodes.append(late)
        late.register()
        assert late.got() == [] and j.sched.roster.size == 3
        now = time.monotonic()
        for n in j.nodes[:-1]:
            j.sched.nodes[n.name].last_seen = now
        j.sched.nodes["worker 2"].last_seen = now - 1.0  # it died: its heartbeats stopped
        assert j.sched.scan(now) is None
        (b,) = [book._book(m.header, m.frames) for m in late.received()]
        assert (b.epoch, b.rank, b.name, b.num_workers, b.joined) == (2, 2, "worker 3", 3, ("worker 3",))
        assert [(x.epoch, x.left, x.joined) for x in books(j.server)] == [
            (1, ("worker 2",), ()),
            (2, (), ("worker 3",)),
        ]
    finally:
        j.close()


def test_a_worker_of_the_next_restart_drops_the_stopped_group_even_below_min() -> None:
    """launchkit's restart mode stops every worker and, once all ended, starts the group again with
    ``TORCHELASTIC_RESTART_COUNT`` one higher: the first of them to register drops the old group at
    once (no wait for their heartbeats, no MIN abort: the launcher counted MIN) and is admitted."""
    j = Elastic("2:3")
    try:
        new = [Node(j.sched, "worker", hint=3 + i, pid=30 + i) for i in range(3)]
        j.nodes.extend(new)
        new[0].register(restarts=1)
        assert j.sched.exit_code is None
        (b,) = [book._book(m.header, m.frames) for m in new[0].received()]
        assert (b.epoch, b.rank, b.name, b.num_workers) == (4, 0, "worker 3", 1)
        assert [x.left or x.joined for x in books(j.server)] == [
            ("worker 0",),
            ("worker 1",),
            ("worker 2",),
            ("worker 3",),
        ]
        assert "stopped for restart 1 of the workers" in j.sched.dropped["worker 0"]
        for n in new[1:]:
            n.register(restarts=1)
        assert [n.got()[0].body["rank"] for n in new[1:]] == [1, 2]
        assert j.sched.roster.workers == ("worker 3", "worker 4", "worker 5")
    finally:
        j.close()


def test_a_newcomer_whose_heartbeat_channel_is_not_known_yet_gets_the_book_at_its_first_beat(
    job: Elastic,
) -> None:
    late = Node(job.sched, "worker", hint=3, pid=30)
    job.nodes.append(late)
    late.register()
    late.got()
    late.name = "worker 3"
    job.workers[0].call(wire.ABORT, reason="gone", node="worker 1")  # epoch 2, before its first beat
    late.heartbeat()
    ops = [m.header for m in late.received(late.hb)]
    assert [h.op for h in ops] == [wire.HEARTBEAT_ACK, wire.BOOK] and ops[1].body["epoch"] == 2
    assert ops[1].body["rank"] == 2


def test_a_worker_whose_heartbeats_stop_is_dropped(job: Elastic) -> None:
    now = time.monotonic()
    for n in job.nodes:
        job.sched.nodes[n.name].last_seen = now
    job.sched.nodes["worker 0"].last_seen = now - 1.0  # (the timeout is 0.2 s)
    assert job.sched.scan(now) is None  # the job goes on
    assert "no heartbeat for 0.2 s" in job.sched.dropped["worker 0"]
    (b,) = books(job.workers[2])
    assert (b.epoch, b.rank, b.left) == (1, 1, ("worker 0",))


def test_below_min_the_job_aborts_naming_the_root_cause() -> None:
    j = Elastic("3:4")
    try:
        j.workers[0].call(wire.ABORT, reason="worker 2 closed its connection: it died", node="worker 2")
        assert j.sched.exit_code == 1
        (abort,) = [h for h in j.workers[1].got(j.workers[1].hb) if h.op == wire.ABORT]
        assert abort.body["node"] == "worker 2"
        assert "2 workers remain, fewer than the elastic job's minimum of 3" in abort.body["reason"]
    finally:
        j.close()


def test_a_server_that_dies_ends_an_elastic_job() -> None:
    j = Elastic()
    try:
        j.workers[0].call(wire.ABORT, reason="gone", node="server 0")
        assert j.sched.exit_code == 1
    finally:
        j.close()


def test_a_job_that_is_not_elastic_refuses_a_late_worker_and_aborts_on_a_lost_one() -> None:
    j = Elastic(elastic="", workers=2)
    try:
        late = Node(j.sched, "worker", hint=2, pid=30)
        late.register()
        (refused,) = late.got()
        assert refused.op == wire.ERROR and refused.body["reason"] == "unexpected registration"
        j.workers[0].call(wire.ABORT, reason="gone", node="worker 1")
        assert j.sched.exit_code == 1
        late.close()
    finally:
        j.close()


def test_a_dropped_worker_that_beats_again_is_told_to_end(job: Elastic) -> None:
    w0, w1, _ = job.workers
    w0.call(wire.ABORT, reason="gone", node="worker 1")
    w1.got(w1.hb)  # (the abort sent at the drop)
    w1.heartbeat()  # it was stopped, not dead: it resumes
    (abort,) = w1.got(w1.hb)
    assert abort.op == wire.ABORT and abort.body["node"] == "worker 1"
    assert abort.body["reason"] == "dropped from the elastic job: gone (seen by worker 0)"
    assert "worker 1" not in job.sched.nodes and job.sched.roster.size == 2
