"""Slow is not dead, among real worker processes (collective/primitives/stall.py, the waits of
sockets/handles.py and primitives/hostsegment.py; docs/collectives.md, "Slow is not dead").

A rank that computes between two collectives for longer than any fixed limit is waited for: the
others log stall warnings naming it and the operation, again and again, and the job succeeds. A
stopped rank (no heartbeats) still fails every wait within the heartbeat timeout + 2 s, naming
it, however long the stall settings are. Made quick: the stall warning after 1 s, the links'
fixed limit (``join(timeout=...)``, which only a job without heartbeats keeps) lowered to 2 s,
and the busy rank computing for 6 s.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.trainer_core.cluster import FAST_LIVENESS, Job, run_job

BUSY_S = 6.0

SLOW_CODE = """
import json, time
import numpy as np
from trainer_core.collective import join
g = join(timeout=2.0)
r = g.rank
g.allreduce(np.ones(10, np.float32))
if r == 0:  # evaluating, saving: alive (its heartbeats go on), not in a collective
    end = time.monotonic() + %(busy)r
    while time.monotonic() < end:
        sum(range(1000))
started = time.monotonic()
total = g.allreduce(np.full(1000, r + 1, np.float32))
waited = time.monotonic() - started
g.close()
print("RESULT " + json.dumps({"rank": r, "sum": float(total[0]), "waited": waited}), flush=True)
"""

WARNING = re.compile(
    r"collective stall: rank (\d) has waited (\d+) s in allreduce \(operation \d+\) for ([^;]*)"
)


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_rank_busy_between_collectives_is_waited_for_with_stall_warnings(shm: str) -> None:
    """Rank 0 computes for 6 s between two allreduces, three times the links' fixed limit (2 s)
    and six times the stall warning's time (1 s): the others warn (more than once) naming rank 0
    as the one whose part is missing and the operation they are in, then finish with it."""
    env = {"PS_SHM": shm, "TRAINER_CORE_STALL_CHECK_SECONDS": "1"}
    job = run_job(SLOW_CODE % {"busy": BUSY_S}, 3, 0, env, timeout=60)
    for p in job.workers:
        (res,) = p.results()
        assert p.popen.returncode == 0 and res["sum"] == 6.0, job.outputs()
        if p.rank == 0:
            assert "collective stall" not in p.output()
            continue
        assert res["waited"] > BUSY_S - 2, res
        warnings = WARNING.findall(p.output())
        assert len(warnings) >= 2, job.outputs()  # repeated every check_s
        assert all(int(me) == p.rank for me, _, _ in warnings)
        assert [int(s) for _, s, _ in warnings] == sorted(int(s) for _, s, _ in warnings)
    # the waits that wait on rank 0 itself name it (a rank waiting on another waiting rank names that one)
    named = [late for p in job.workers if p.rank for _, _, late in WARNING.findall(p.output())]
    assert any("rank 0 (worker 0 on 127.0.0.1)" in late for late in named), named
    assert job.codes()["scheduler 0"] == 0


STOPPED_CODE = """
import json, time
import numpy as np
from trainer_core.collective import join
g = join(timeout=600.0)
r = g.rank
g.allreduce(np.ones(10, np.float32))
print("READY", flush=True)
if r == 2:
    time.sleep(600)  # stopped here
try:
    g.allreduce(np.ones(1000, np.float32))
    print("RESULT " + json.dumps({"rank": r, "error": None}), flush=True)
except Exception as exc:
    print("RESULT " + json.dumps({"rank": r, "error": str(exc), "node": exc.node, "at": time.time()}), flush=True)
g.close(finish=False)
"""


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_stopped_rank_still_fails_every_wait_within_the_heartbeat_bound(shm: str) -> None:
    """Worker 2 is SIGSTOPped while the others wait for it: however long the stall settings (a
    warning after 1 s, no shutdown) and the fixed limit (600 s), its silence ends the job within
    the heartbeat timeout (3 s) + 2 s, naming it."""
    stopped: list[float] = []

    def stop_worker_2(job: Job) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all("READY" in p.output() for p in job.workers):
            time.sleep(0.02)  # (waits for the workers' READY lines)
        next(p for p in job.workers if p.rank == 2).popen.send_signal(signal.SIGSTOP)
        stopped.append(time.time())

    env = {"PS_SHM": shm, "TRAINER_CORE_STALL_CHECK_SECONDS": "1"}
    job = run_job(STOPPED_CODE, 3, 0, env, timeout=30, during=stop_worker_2, not_awaited=("worker 2",))
    assert stopped, job.outputs()
    bound = float(FAST_LIVENESS["PS_HEARTBEAT_TIMEOUT"]) + 2
    for p in job.workers:
        if p.rank == 2:
            continue
        (res,) = p.results()
        assert res["node"] == "worker 2" and "sent no heartbeat" in res["error"], job.outputs()
        assert res["at"] - stopped[0] < bound, res
    assert job.codes()["scheduler 0"] == 1
