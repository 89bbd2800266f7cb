"""Collectives among real worker processes (collective/sockets/netlinks.py, collective/job.py).

A real scheduler and worker processes (``cluster.run_job`` with no servers, as a collectives-only
job runs): each worker joins through ``collective.join()``, which links it to every other worker
over the node layer's authenticated TCP data channels. Results are compared across workers (a
hash of their bytes: bit-identical) and with a reference built from the same inputs here.
"""

from __future__ import annotations

import hashlib
import signal
import time

import numpy as np
import pytest

from tests.trainer_core.cluster import FAST_LIVENESS, Job, run_job

SIZES = (0, 1, 7, 100_003)
WORKERS = 4

# The inputs of every rank, built alike here and in the workers: float32 values that are multiples
# of 1/8 below 2**10 (their sum over 4 ranks is exact in any order) and int64 values.
INPUTS = """
import numpy as np
def inputs(rank, n, dtype):
    rng = np.random.default_rng(1000 * rank + n)
    if dtype == "float32":
        return (rng.integers(-8000, 8000, n) / 8).astype(np.float32)
    return rng.integers(-(1 << 40), 1 << 40, n, dtype=np.int64)
"""

OPS_CODE = (
    INPUTS
    + """
import hashlib, json, sys
from trainer_core.collective import join
g = join()
r, n = g.rank, g.size
out = {"rank": r, "size": n, "local": [g.local_rank, g.local_size], "hosts": list(g.hosts)}
# which channels: the same-host channel carries headers only (the bytes in a memfd)
out["same_host"] = sum(not ch.caps.frames for ch in g.netlinks._chan.values())
def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
for dtype in ("float32", "int64"):
    for size in %(sizes)r:
        res = g.allreduce(inputs(r, size, dtype))
        out[f"sum-{dtype}-{size}"] = digest(res)
        out[f"shape-{dtype}-{size}"] = [res.dtype.str, list(res.shape)]
# the same float32 noise everywhere differs per rank: the result must still be bit-identical
noise = np.random.default_rng(r).standard_normal(100_003).astype(np.float32)
out["noise"] = digest(g.allreduce(noise))
out["algorithm"] = g.last_algorithm  # through the host's shared memory unless PS_SHM=0
out["segment"] = g.netlinks.local is not None
out["bcast"] = digest(g.broadcast(inputs(r, 1001, "float32") if r == 2 else np.zeros(1001, np.float32), root=2))
out["gather"] = digest(g.allgather(np.full((r + 1, 3), r, dtype=np.int64)))
# a ring on the links themselves: every rank posts its send and its receive before waiting on
# either, with messages far larger than a socket buffer
big = np.full(1 << 21, r, dtype=np.float32)
got = np.empty_like(big)
links = g.netlinks
sent = links.send((r + 1) %% n, 7, big)
recv = links.recv((r - 1) %% n, 7, got)
recv.wait(); sent.wait()
out["ring"] = float(got[0]) if (got == got[0]).all() else -1.0
g.close()
print("RESULT " + json.dumps(out), flush=True)
"""
)


def _inputs(rank: int, n: int, dtype: str) -> np.ndarray:
    scope: dict = {}
    exec(INPUTS, scope)  # the workers' own definition (test code, not received data)
    return scope["inputs"](rank, n, dtype)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _results(job: Job) -> list[dict]:
    out = []
    for p in job.workers:
        res = p.results()
        assert p.popen.returncode == 0 and len(res) == 1, job.outputs()
        out.append(res[0])
    return sorted(out, key=lambda d: d["rank"])


@pytest.mark.parametrize("shm", ["1", "0"])
def test_allreduce_broadcast_allgather_and_a_ring_among_worker_processes(shm: str) -> None:
    """Same host: every pair on the same-host channel; with PS_SHM=0, every pair on TCP."""
    job = run_job(OPS_CODE % {"sizes": SIZES}, WORKERS, 0, {"PS_SHM": shm}, timeout=60)
    res = _results(job)
    assert job.codes()["scheduler 0"] == 0, job.outputs()
    assert [d["rank"] for d in res] == list(range(WORKERS))
    assert all(d["size"] == WORKERS and d["hosts"] == ["127.0.0.1"] * WORKERS for d in res)
    assert [d["local"] for d in res] == [[r, WORKERS] for r in range(WORKERS)]
    assert [d["same_host"] for d in res] == [WORKERS - 1 if shm == "1" else 0] * WORKERS
    for dtype in ("float32", "int64"):
        for size in SIZES:
            want = sum(_inputs(r, size, dtype) for r in range(WORKERS))
            want = np.asarray(want, dtype=dtype).reshape(size)
            key = f"sum-{dtype}-{size}"
            assert {d[key] for d in res} == {_digest(want)}, key
            assert res[0][f"shape-{dtype}-{size}"] == [want.dtype.str, [size]]
    assert len({d["noise"] for d in res}) == 1  # bit-identical on every rank
    assert [(d["algorithm"], d["segment"]) for d in res] == [
        ("shm", True) if shm == "1" else ("recursive_doubling", False)
    ] * WORKERS
    assert {d["bcast"] for d in res} == {_digest(_inputs(2, 1001, "float32"))}
    ragged = np.concatenate([np.full((r + 1, 3), r, dtype=np.int64) for r in range(WORKERS)])
    assert {d["gather"] for d in res} == {_digest(ragged)}
    assert [d["ring"] for d in res] == [float((r - 1) % WORKERS) for r in range(WORKERS)]
    assert not job.leftover_shm


KILLED_CODE = """
import json, sys, threading, time
import numpy as np
from trainer_core.collective import join
g = join()
r = g.rank
g.allreduce(np.ones(10, np.float32))
algorithm = g.last_algorithm
print("READY", flush=True)
if r == 2:
    threading.Event().wait()  # killed here
try:
    g.allreduce(np.ones(100_003, np.float32))
    print("RESULT " + json.dumps({"rank": r, "error": None}), flush=True)
except Exception as exc:
    out = {"rank": r, "error": str(exc), "node": getattr(exc, "node", None), "at": time.time(),
           "algorithm": algorithm}
    print("RESULT " + json.dumps(out), flush=True)
g.close(finish=False)
"""


@pytest.mark.parametrize(
    ("sig", "said"),
    [
        (signal.SIGKILL, "rank 2 (worker 2 on 127.0.0.1) closed its connection"),
        (signal.SIGSTOP, "sent no heartbeat"),
    ],
)
@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_killed_or_stopped_worker_fails_the_others_collective_naming_it(
    sig: int, said: str, shm: str
) -> None:
    """Worker 2 is killed (or stopped) while the others wait in an allreduce, in the shared-memory
    phase (all 3 on one host: the segment's counters; with PS_SHM=0, the sockets). Killed: their
    channels to it end, the operation fails at once on every other worker naming it, and the
    worker that saw it first has the scheduler end the job naming it. Stopped: its channels stay
    open; the scheduler's heartbeat timeout ends the job naming it, and the waits raise that."""
    killed: list[float] = []

    def kill_worker_2(job: Job) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all("READY" in p.output() for p in job.workers):
            time.sleep(0.02)  # (waits for the workers' READY lines)
        victim = next(p for p in job.workers if p.rank == 2)
        victim.popen.send_signal(sig)
        killed.append(time.time())

    env = {"PS_SHM": shm}
    job = run_job(KILLED_CODE, 3, 0, env, timeout=30, during=kill_worker_2, not_awaited=("worker 2",))
    assert killed, job.outputs()
    bound = float(FAST_LIVENESS["PS_HEARTBEAT_TIMEOUT"]) + 2
    for p in job.workers:
        if p.rank == 2:
            continue
        (res,) = p.results()
        assert res["error"] is not None, job.outputs()
        assert res["algorithm"] == ("shm" if shm == "1" else "recursive_doubling"), res
        # the worker that saw it first told the scheduler, which ended the job naming it; the
        # scheduler's word is raised when it came back within 1 s (else the link's own error)
        assert res["node"] in ("worker 2", "rank 2"), res
        assert said in res["error"], res
        assert res["at"] - killed[0] < bound, res
    assert job.codes()["scheduler 0"] == 1
    assert "aborting the job: worker 2 (host 127.0.0.1" in job.of("scheduler")[0].output()
    assert not job.leftover_shm
