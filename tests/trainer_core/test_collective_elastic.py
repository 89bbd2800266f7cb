"""The collectives of an elastic job, with real processes (a scheduler process, workers through
``collective.job.join``): when a worker is killed, every survivor's operation in flight fails
with ``MembershipChanged`` naming it, ``reform`` makes the group of the next epoch (dense ranks,
the same-host segment made again) and the survivors keep their processes; a worker started
later joins at the epoch after, and every collective then works at the new size, bit-identical
across ranks. The worker reports ``dmlc_env.ELASTIC_IN_PROCESS_FIGURE`` to the launcher. A
stopped worker (alive, silent) is dropped after the heartbeat timeout.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

import dmlc_env
from dmlc_env import telemetry

from .cluster import Job, run_job
from .test_node_elastic import late_worker, wait_for

ELASTIC = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "1.5", "PS_START_TIMEOUT": "30"}

#: three allreduces, a barrier, worker 2 dies; the others allreduce until the group has
#: TEST_SIZE workers (re-forming at each change), then one of each collective
WORKER = """
import hashlib, json, os, signal, time
import numpy as np
from trainer_core.collective.job import join, reform
from trainer_core.errors import MembershipChanged
g = join()
name = g.node.name
def emit(**v):
    print("RESULT " + json.dumps(v), flush=True)
emit(at="joined", name=name, rank=g.rank, size=g.size, epoch=g.epoch, pid=os.getpid())
if g.epoch == 0:
    for step in range(3):
        g.allreduce(np.full(1000, g.rank + 1, np.float32))
    g.barrier()
    if name == "worker 2":
        if os.environ.get("TEST_STOP"):  # alive but silent: only its heartbeats' end tells
            os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(3)
t0 = time.monotonic()
while True:
    try:
        out = g.allreduce(np.full(1000, g.rank + 1, np.float32))
        if g.size == int(os.environ["TEST_SIZE"]):
            break
    except MembershipChanged as exc:
        emit(at="changed", left=list(exc.left), joined=list(exc.joined), epoch=exc.epoch,
             node=exc.node, s=time.monotonic() - t0)
        g = reform(g)
        emit(at="reformed", rank=g.rank, size=g.size, epoch=g.epoch, local=g.netlinks.local is not None)
x = np.random.default_rng(g.rank).standard_normal(100000).astype(np.float32)
digest = hashlib.sha256(g.allreduce(x).tobytes()).hexdigest()
b = g.broadcast(np.full(3, g.rank, np.float32), root=g.size - 1)
ga = np.asarray(g.allgather(np.full(2, g.rank, np.float32))).reshape(-1)
emit(at="done", rank=g.rank, size=g.size, epoch=g.epoch, sum=float(out[0]), digest=digest,
     b=b.tolist(), ga=ga.tolist(), pid=os.getpid())
g.close()
"""


class Endpoint:
    """A UDP socket standing in for the launcher's metrics endpoint; ``figure(...)``: the workers
    (by launcher rank) that reported a figure, from the datagrams signed with the job's secret."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.data: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.data.append(self.sock.recv(65536))

    def figure(self, job_id: str, name: str) -> dict[int, float]:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        key = telemetry.metrics_key("test-secret")
        reports = [telemetry.decode(key, job_id, d) for d in self.data]
        return {r.rank: r.figures[name] for r in reports if r is not None and name in r.figures}


@pytest.mark.proc
def test_a_killed_worker_fails_the_operation_in_flight_and_the_group_reforms_then_grows() -> None:
    endpoint = Endpoint()
    extra = {**ELASTIC, "LAUNCHKIT_ELASTIC": "2:3", "TEST_SIZE": "3", "LAUNCHKIT_METRICS_ADDR": endpoint.addr}

    def during(job: Job) -> None:
        w0 = job.workers[0]
        wait_for(lambda: any(r.get("at") == "reformed" for r in w0.results()))  # at 2 workers
        job.procs.append(late_worker(job, 3, 3, "2:3", extra, code=WORKER))

    job = run_job(WORKER, 3, 0, extra_env=extra, during=during, timeout=90)
    out = job.outputs()
    assert job.codes() == {"scheduler 0": 0, "worker 0": 0, "worker 1": 0, "worker 2": 3, "worker 3": 0}, out
    w0, w1, _, w3 = job.workers
    for w in (w0, w1):
        rs = w.results()
        changed = [r for r in rs if r["at"] == "changed"]
        assert changed[0]["left"] == ["worker 2"] and changed[0]["node"] == "worker 2", out
        assert changed[0]["s"] < 1.5 + 2, out  # within the heartbeat bound
        assert changed[-1]["joined"] == ["worker 3"], out
        reformed = [(r["rank"], r["size"]) for r in rs if r["at"] == "reformed"]
        assert reformed[0] == (w.rank, 2) and reformed[-1] == (w.rank, 3), out
        assert {r["pid"] for r in rs if "pid" in r} == {w.popen.pid}  # it kept its process
    done = [next(r for r in w.results() if r["at"] == "done") for w in (w0, w1, w3)]
    assert [d["rank"] for d in done] == [0, 1, 2] and {d["size"] for d in done} == {3}, out
    assert {d["epoch"] for d in done} == {2}
    assert {d["digest"] for d in done} == {done[0]["digest"]}  # bit-identical on every rank
    assert {d["sum"] for d in done} == {6.0}
    assert all(d["b"] == [2.0] * 3 and d["ga"] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0] for d in done)
    assert job.leftover_shm == []
    # each worker told the launcher that it handles the changes in its own process
    figures = endpoint.figure(job.job_id, dmlc_env.ELASTIC_IN_PROCESS_FIGURE)
    assert {r: figures.get(r) for r in (0, 1, 3)} == {0: 1.0, 1: 1.0, 3: 1.0}, figures


@pytest.mark.proc
def test_a_stopped_worker_is_dropped_after_the_heartbeat_timeout_and_the_group_reforms() -> None:
    extra = {**ELASTIC, "LAUNCHKIT_ELASTIC": "2:3", "TEST_SIZE": "2", "TEST_STOP": "1"}
    job = run_job(WORKER, 3, 0, extra_env=extra, timeout=60, not_awaited=("worker 2",))
    out = job.outputs()
    assert job.codes() == {"scheduler 0": 0, "worker 0": 0, "worker 1": 0, "worker 2": -9}, out
    for w in job.workers[:2]:
        (changed,) = [r for r in w.results() if r["at"] == "changed"]
        assert changed["left"] == ["worker 2"] and changed["epoch"] == 1, out
        assert changed["s"] < 1.5 + 2, out  # the heartbeat timeout, and a little
        (done,) = [r for r in w.results() if r["at"] == "done"]
        assert (done["rank"], done["size"], done["sum"]) == (w.rank, 2, 3.0), out
    assert "sent no heartbeat for 1.5 s" in job.of("scheduler")[0].output(), out
