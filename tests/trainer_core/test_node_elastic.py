"""An elastic job's node layer with real processes (a scheduler process and workers that join
through ``Postoffice.join``): a worker killed mid-job is dropped and the survivors, keeping their
processes, get the next epoch's book (dense ranks) and go on with barriers and finish; a worker
started later is admitted at the next epoch; below MIN the job fails naming the lost worker.
In one process: the Postoffice tells every customer of a new book, ``wait_book`` and
``changed_since`` (the ``MembershipChanged`` of an operation begun in an earlier epoch), and
``abort`` from another thread while the main thread waits at the scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from dmlc_env import JobEnv, TaskEnv, build_env
from trainer_core.errors import MembershipChanged
from trainer_core.node import protocol
from trainer_core.node.book import Book, NodeInfo
from trainer_core.node.liveness import Health
from trainer_core.node.postoffice import Postoffice
from trainer_core.transport import wire
from trainer_core.transport.memory import MemoryChannel

from .cluster import REPO, Job, Proc, run_job

LOG = logging.getLogger("test_node_elastic")
ELASTIC = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "1.5", "PS_START_TIMEOUT": "30"}

#: a worker: join, a barrier, then (worker 2) die; the others wait for each new book and go on
WORKER = """
import json, os, sys
from trainer_core.config import NodeConfig
from trainer_core.log import get_logger
from trainer_core.node.postoffice import Postoffice
cfg = NodeConfig.from_environ()
node = Postoffice.join(cfg, get_logger(0))
def emit(**v):
    print("RESULT " + json.dumps(v), flush=True)
emit(at="joined", name=node.name, rank=node.rank, epoch=node.book.epoch, size=node.book.num_workers)
want = [int(x) for x in os.environ["TEST_EPOCHS"].split(",")]
if node.book.epoch == 0:
    node.barrier()
    if node.name == os.environ.get("TEST_DIES"):
        os._exit(3)
for epoch in want:
    if node.book.epoch < epoch:
        got = node.wait_book(epoch - 1, 30)
        assert got is not None, "no new book"
    b = node.book
    emit(at="epoch", name=node.name, rank=b.rank, epoch=b.epoch, size=b.num_workers, left=list(b.left),
         joined=list(b.joined), names=[b.worker_name(r) for r in range(b.num_workers)], pid=os.getpid())
node.barrier()
emit(at="barrier", epoch=node.book.epoch)
node.finish()
node.stop()
node.close_transport()
"""


def late_worker(
    job: Job,
    index: int,
    workers: int,
    elastic: str,
    extra: dict[str, str],
    code: str = WORKER,
    servers: int = 0,
) -> Proc:
    """Start worker ``index`` of ``job`` now (running ``code``), with the env of the first ones (the
    launcher's part)."""
    jenv = JobEnv(
        job_id=job.job_id,
        secret="test-secret",
        cluster="local",
        root_uri="127.0.0.1",
        root_port=job.port,
        num_servers=servers,
        num_workers=workers,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    env.update(build_env(jenv, TaskEnv("worker", index, 10 + index, 0, "127.0.0.1")))
    env["LAUNCHKIT_ELASTIC"] = elastic
    log = job.procs[0].log.parent / f"worker-{index}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO)
        )
    return Proc("worker", index, popen, log)


def wait_for(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.proc
def test_a_killed_worker_is_dropped_the_survivors_go_on_and_a_late_worker_joins() -> None:
    extra = {**ELASTIC, "LAUNCHKIT_ELASTIC": "2:4", "TEST_DIES": "worker 2", "TEST_EPOCHS": "1,2"}

    def during(job: Job) -> None:
        w0 = job.workers[0]
        wait_for(lambda: any(r.get("epoch") == 1 for r in w0.results()))  # worker 2 was dropped
        late = late_worker(job, 3, 3, "2:4", {**extra, "TEST_EPOCHS": "2"})
        job.procs.append(late)

    job = run_job(WORKER, 3, 0, extra_env=extra, during=during, timeout=60)
    out = job.outputs()
    codes = job.codes()
    assert codes == {"scheduler 0": 0, "worker 0": 0, "worker 1": 0, "worker 2": 3, "worker 3": 0}, out
    w0, w1, _, w3 = job.workers
    e1 = [r for r in w1.results() if r["at"] == "epoch"]
    assert [(r["epoch"], r["rank"], r["size"]) for r in e1] == [(1, 1, 2), (2, 1, 3)], out
    assert e1[0]["left"] == ["worker 2"] and e1[1]["joined"] == ["worker 3"]
    assert e1[1]["names"] == ["worker 0", "worker 1", "worker 3"]
    assert e1[0]["pid"] == e1[1]["pid"] == w1.popen.pid  # the survivor kept its process
    (joined,) = [r for r in w3.results() if r["at"] == "joined"]
    assert (joined["name"], joined["rank"], joined["epoch"], joined["size"]) == ("worker 3", 2, 2, 3)
    for w in (w0, w1, w3):
        assert [r["epoch"] for r in w.results() if r["at"] == "barrier"] == [2], out
    assert "worker 2 (host 127.0.0.1" in job.of("scheduler")[0].output()


@pytest.mark.proc
def test_below_min_the_elastic_job_fails_naming_the_lost_worker() -> None:
    extra = {**ELASTIC, "LAUNCHKIT_ELASTIC": "3:4", "TEST_DIES": "worker 1", "TEST_EPOCHS": "1"}
    job = run_job(WORKER, 3, 0, extra_env=extra, timeout=45)
    out = job.outputs()
    assert job.codes() == {"scheduler 0": 1, "worker 0": 1, "worker 1": 3, "worker 2": 1}, out
    sched = job.of("scheduler")[0].output()
    assert "worker 1 (host 127.0.0.1" in sched and "fewer than the elastic job's minimum of 3" in sched
    assert "fewer than the elastic job's minimum of 3" in job.workers[0].output()


# -- the Postoffice's books (in one process) ---------------------------------------------------------


def book(epoch: int, workers: int, rank: int = 0, **changes: tuple[str, ...]) -> Book:
    infos = tuple(NodeInfo(r, "", "k", name=f"worker {r}") for r in range(workers))
    return Book("worker", rank, "worker 0", workers, 0, (), infos, epoch=epoch, **changes)


def office() -> tuple[Postoffice, MemoryChannel, MemoryChannel]:
    sched, end = MemoryChannel.pair(log=LOG, schema=protocol.SCHEMA)
    return Postoffice(book(0, 3), sched, Health("worker 0", LOG), LOG), sched, end


def test_every_customer_hears_of_a_new_book_and_an_old_one_is_moot() -> None:
    node, sched, end = office()
    heard: list[tuple[int, int]] = []
    node.subscribe(lambda old, new: heard.append((old.epoch, new.epoch)))
    node.subscribe(lambda old, new: heard.append((-1, new.num_workers)))
    node.live.on_book(book(1, 2, left=("worker 2",)))  # as the heartbeat thread does
    node.new_book(book(1, 2))  # the same epoch again: moot
    assert heard == [(0, 1), (-1, 2)] and node.book.epoch == 1
    sched.close(), end.close()


def test_a_customer_that_subscribes_late_with_replay_hears_every_book_since_the_join_first() -> None:
    """A server subscribes after its join: the books that came in between are not lost."""
    node, sched, end = office()
    node.new_book(book(1, 2, left=("worker 2",)))
    node.new_book(book(2, 3, joined=("worker 3",)))
    heard: list[tuple[int, int, tuple[str, ...], tuple[str, ...]]] = []
    node.subscribe(lambda old, new: heard.append((old.epoch, new.epoch, new.left, new.joined)), replay=True)
    assert heard == [(0, 1, ("worker 2",), ()), (1, 2, (), ("worker 3",))]
    node.new_book(book(3, 2, left=("worker 0",)))
    assert heard[2:] == [(2, 3, ("worker 0",), ())]
    late: list[int] = []
    node.subscribe(lambda old, new: late.append(new.epoch))  # no replay: from now on only
    assert late == []
    sched.close(), end.close()


def test_wait_book_returns_the_next_book_from_another_thread() -> None:
    node, sched, end = office()
    threading.Timer(0.1, lambda: node.new_book(book(1, 4, joined=("worker 3",)))).start()
    got = node.wait_book(0, 10)
    assert got is not None and got.num_workers == 4
    assert node.wait_book(1, 0.05) is None
    sched.close(), end.close()


def test_changed_since_names_every_worker_that_left_or_joined_since_the_epoch() -> None:
    node, sched, end = office()
    assert node.changed_since(0) is None
    node.new_book(book(1, 2, left=("worker 2",)))
    node.new_book(book(2, 3, joined=("worker 3",)))
    err = node.changed_since(0)
    assert isinstance(err, MembershipChanged)
    assert (err.epoch, err.left, err.joined, err.node) == (2, ("worker 2",), ("worker 3",), "worker 2")
    assert "worker 2 left; worker 3 joined; epoch 2, 3 workers" in str(err)
    assert node.changed_since(1).joined == ("worker 3",)  # type: ignore[union-attr]
    assert node.changed_since(2) is None
    sched.close(), end.close()


def test_abort_from_another_thread_while_the_main_thread_waits_at_the_scheduler() -> None:
    node, sched, end = office()
    got: list[wire.Header] = []
    stop = threading.Event()

    class Stop(Exception):
        pass

    def check() -> None:
        if stop.is_set():
            raise Stop

    def waits() -> None:
        with contextlib.suppress(Stop):
            node.scheduler_call(protocol.BARRIER, protocol.BARRIER_DONE, check)

    t = threading.Thread(target=waits)
    t.start()
    wait_for(lambda: end.wait(0) or bool(got), 5)
    end.receive(lambda m: got.append(m.header))
    node.abort("it broke")  # the main thread is in its wait: the abort goes out all the same
    wait_for(lambda: end.wait(0.05), 5)
    end.receive(lambda m: got.append(m.header))
    assert [h.op for h in got] == [protocol.BARRIER, protocol.ABORT]
    assert got[1].body == {"reason": "it broke", "node": "worker 0"}
    stop.set()
    t.join(5)
    sched.close(), end.close()


@pytest.mark.proc
def test_an_elastic_scheduler_no_worker_joins_waits_past_the_start_timeout() -> None:
    """A torch.distributed script's workers never join an elastic job's scheduler (launchkit
    stops it when they have ended): it does not fail at PS_START_TIMEOUT as a fixed job's does."""
    from dmlc_env import JobEnv

    from .cluster import reserve_port

    held = reserve_port()
    port = held.getsockname()[1]
    held.close()
    codes = {}
    for elastic in (None, (2, 3)):
        jenv = JobEnv(
            job_id="nojoin",
            secret="s",
            cluster="local",
            root_uri="127.0.0.1",
            root_port=port,
            num_servers=0,
            num_workers=2,
            elastic=elastic,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_"))}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(
            build_env(
                jenv, TaskEnv(role="scheduler", role_rank=0, task_id=2, local_rank=0, node_host="127.0.0.1")
            )
        )
        env["PS_START_TIMEOUT"] = "1"
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_core.ps.scheduler"], env=env, stderr=subprocess.PIPE
        )
        try:
            codes[elastic] = proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            codes[elastic] = None
        finally:
            proc.kill()
            proc.communicate()
    assert codes[None] not in (0, None) and codes[(2, 3)] is None, codes
