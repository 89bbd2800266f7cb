"""The parameter server in an elastic job, with real processes (a scheduler, a server, workers
through ``kv.create("dist_sync")``): a worker killed mid-training is dropped, and the sync rounds
then close with the pushes of the live workers; the survivors keep their processes and train on. Each worker's KV store tells the launcher that it
handles the changes in its process (``dmlc_env.ELASTIC_IN_PROCESS_FIGURE``).
"""

from __future__ import annotations

import pytest

import dmlc_env

from .cluster import run_job, worker_script
from .test_collective_elastic import Endpoint

ELASTIC = {
    "PS_HEARTBEAT_INTERVAL": "0.2",
    "PS_HEARTBEAT_TIMEOUT": "1.5",
    "LAUNCHKIT_ELASTIC": "2:3",
}

#: 3 rounds at 3 workers; worker 2 dies after a barrier; 2 more rounds (each worker pushes id + 1)
BODY = """
me = int(os.environ["LAUNCHKIT_ROLE_RANK"])
kv.init("w", np.zeros(4, np.float32))
seen = []
for step in range(5):
    if step == 3:
        kv.barrier()
        if me == 2:
            os._exit(3)
    out = np.empty(4, np.float32)
    kv.pushpull("w", np.full(4, me + 1, np.float32), out)
    seen.append(float(out[0]))
emit(seen=seen, pid=os.getpid(), epoch=kv.client.book.epoch, workers=kv.client.book.num_workers)
"""


@pytest.mark.proc
def test_a_killed_worker_leaves_the_sync_rounds_and_the_others_train_on() -> None:
    endpoint = Endpoint()
    env = {**ELASTIC, "LAUNCHKIT_METRICS_ADDR": endpoint.addr}
    job = run_job(worker_script(BODY), 3, 1, extra_env=env, timeout=60)
    out = job.outputs()
    codes = job.codes()
    assert codes == {"scheduler 0": 0, "server 0": 0, "worker 0": 0, "worker 1": 0, "worker 2": 3}, out
    for w in job.workers[:2]:
        (r,) = w.results()
        # rounds 0..2: 1 + 2 + 3; rounds 3, 4: worker 2 is gone, 1 + 2
        assert r["seen"] == [6.0, 6.0, 6.0, 3.0, 3.0], out
        assert (r["pid"], r["epoch"], r["workers"]) == (w.popen.pid, 1, 2)
    assert "worker 2 (host 127.0.0.1" in job.of("scheduler")[0].output()
    assert job.leftover_shm == []
    figures = endpoint.figure(job.job_id, dmlc_env.ELASTIC_IN_PROCESS_FIGURE)
    assert {r: figures.get(r) for r in (0, 1)} == {0: 1.0, 1: 1.0}, figures  # (the KV store's)
