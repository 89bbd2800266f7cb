"""The parameter server in an elastic job, with real processes (a scheduler, a server, workers
through ``kv.create("dist_sync")``): a worker killed mid-training is dropped, and the sync rounds
then close with the pushes of the live workers; the survivors keep their processes and train on.
A worker started later takes the keys' current values in its ``init`` (it pulls them: no
agreement with the others, who are training) and its pushes count from the round it joins. Each worker's KV store tells the launcher that it
handles the changes in its process (``dmlc_env.ELASTIC_IN_PROCESS_FIGURE``).
"""

from __future__ import annotations

import pytest

import dmlc_env

from .cluster import Job, run_job, worker_script
from .test_collective_elastic import Endpoint
from .test_node_elastic import late_worker, wait_for

ELASTIC = {
    "PS_HEARTBEAT_INTERVAL": "0.2",
    "PS_HEARTBEAT_TIMEOUT": "1.5",
    "LAUNCHKIT_ELASTIC": "2:3",
}

#: 3 rounds at 3 workers; worker 2 dies after a barrier; rounds at 2 workers until a worker that
#: joins later pushes to them too, then 2 more (each worker pushes id + 1); a late worker's init
#: takes the current values, then it pushes 3 rounds
BODY = """
import time
me = int(os.environ["LAUNCHKIT_ROLE_RANK"])
w = np.zeros(4, np.float32)
kv.init("w", w)
seen = []
def step():
    out = np.empty(4, np.float32)
    kv.pushpull("w", np.full(4, me + 1, np.float32), out)
    seen.append(float(out[0]))
if kv.late:
    for _ in range(3):
        step()
else:
    for i in range(3):
        step()
    kv.barrier()
    if me == 2:
        os._exit(3)
    deadline = time.monotonic() + 40
    while (not seen or seen[-1] != 7.0) and time.monotonic() < deadline:
        step()
    step()
    step()
emit(seen=seen, init=float(w[0]), pid=os.getpid(), epoch=kv.client.book.epoch, workers=kv.client.book.num_workers)
"""


@pytest.mark.proc
def test_a_killed_worker_leaves_the_sync_rounds_and_a_late_worker_joins_them() -> None:
    endpoint = Endpoint()
    env = {**ELASTIC, "LAUNCHKIT_METRICS_ADDR": endpoint.addr}
    code = worker_script(BODY)

    def during(job: Job) -> None:  # once worker 2 was dropped, worker 3 starts
        wait_for(lambda: "the job goes on without it" in job.of("scheduler")[0].output())
        job.procs.append(late_worker(job, 3, 3, "2:3", env, code=code, servers=1))

    job = run_job(code, 3, 1, extra_env=env, during=during, timeout=60)
    out = job.outputs()
    codes = job.codes()
    assert codes == {
        "scheduler 0": 0,
        "server 0": 0,
        "worker 0": 0,
        "worker 1": 0,
        "worker 2": 3,
        "worker 3": 0,
    }, out
    for w in job.workers[:2]:
        (r,) = w.results()
        # rounds 0..2: 1 + 2 + 3; worker 2 gone: 1 + 2, until worker 3 joins: 1 + 2 + 4 (3 rounds)
        seen = r["seen"]
        assert seen[:3] == [6.0] * 3 and seen[-3:] == [7.0] * 3, out
        assert set(seen[3:-3]) == {3.0}, out
        assert (r["pid"], r["init"], r["epoch"], r["workers"]) == (w.popen.pid, 0.0, 2, 3)
    (late,) = job.workers[3].results()
    assert late["init"] == 3.0 and late["seen"] == [7.0] * 3, out  # the current value, then the rounds
    assert "worker 2 (host 127.0.0.1" in job.of("scheduler")[0].output()
    assert job.leftover_shm == []
    figures = endpoint.figure(job.job_id, dmlc_env.ELASTIC_IN_PROCESS_FIGURE)
    assert {r: figures.get(r) for r in (0, 1)} == {0: 1.0, 1: 1.0}, figures  # (the KV store's)
