"""Slow is not dead on the parameter-server path (ps/client.py ``WorkerClient.wait``): a worker
that computes between two sync rounds keeps the others' pulls waiting; they warn, naming the
server and the request they wait on, and again every ``TRAINER_CORE_STALL_CHECK_SECONDS``; the
job succeeds. Made quick: the warning after 1 s, worker 0 away (asleep) for 4 s. (A stopped or killed
worker still ends the job within the heartbeat timeout: test_kv_liveness.py.)"""

from __future__ import annotations

import re

from tests.trainer_core.cluster import run_job, worker_script

BODY = """
import time
kv.init('w', np.zeros(10, np.float32))
out = np.empty(10, np.float32)
kv.pushpull('w', np.ones(10, np.float32), out)
if kv.rank == 0:  # evaluating, saving: alive, not in the sync round
    time.sleep(4.0)  # (asleep, not computing: heartbeats beside a computation, test_kv_liveness.py)
kv.pushpull('w', np.ones(10, np.float32), out)
emit(rank=kv.rank, w=float(out[0]))
"""

WARNING = re.compile(
    r"parameter server stall: worker (\d) has waited ([\d.]+) s for server 0 to answer its \w+ request"
)


def test_a_worker_busy_between_sync_rounds_is_waited_for_with_stall_warnings() -> None:
    job = run_job(worker_script(BODY), 2, 1, {"TRAINER_CORE_STALL_CHECK_SECONDS": "1"}, timeout=60)
    for p in job.workers:
        (res,) = p.results()
        assert p.popen.returncode == 0 and res["w"] == 2.0, job.outputs()
        if p.rank == 0:
            assert "stall" not in p.output()
            continue
        warnings = WARNING.findall(p.output())
        assert len(warnings) >= 2 and all(int(me) == 1 for me, _ in warnings), job.outputs()
    assert job.codes()["scheduler 0"] == 0
