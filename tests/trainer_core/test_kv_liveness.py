"""A killed or stopped (SIGSTOP) worker or server ends the job with an error naming it, within the timeout."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from tests.trainer_core.cluster import Job, run_job, worker_script

# With PS_HEARTBEAT_TIMEOUT=3 s every node must be gone well within this.
BOUND_S = 12.0

STEPS = """
kv.init('w', np.zeros(100, np.float32))
out = np.empty(100, np.float32)
print('READY', flush=True)
if kv.rank == 1 and os.environ.get('VICTIM_SIGNAL'):
    os.kill(os.getpid(), getattr(signal, os.environ['VICTIM_SIGNAL']))
try:
    for step in range(100000):
        kv.pushpull('w', np.ones(100, np.float32), out)
        time.sleep(0.01)
except Exception as exc:
    print('FAILED ' + type(exc).__name__ + ': ' + str(exc), flush=True)
    raise SystemExit(3)
"""


def script() -> str:
    return worker_script("import signal, time\n" + STEPS)


def wait_ready(job: Job, rank: int = 0, word: str = "READY") -> None:
    """Until worker ``rank`` printed ``word``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(word in w.output() for w in job.workers if w.rank == rank):
            return
        time.sleep(0.05)
    raise AssertionError(f"worker {rank} did not print {word} within 30 s: {job.outputs()}")


def printed(rank: int, word: str, marks: dict[str, float]) -> Callable[[Job], None]:
    """A ``during`` hook: waits until worker ``rank`` printed ``word`` and notes when in
    ``marks["t"]`` (the bounds are on what follows, not on the job's start-up, which a loaded
    machine stretches)."""

    def wait(job: Job) -> None:
        wait_ready(job, rank, word)
        marks["t"] = time.monotonic()

    return wait


def check_failed(job: Job, victim: str, elapsed: float) -> None:
    assert elapsed < BOUND_S, job.outputs()
    assert job.leftover_shm == [], (job.leftover_shm, job.outputs())
    for p in job.procs:
        if p.name == victim:
            continue
        assert p.popen.returncode not in (0, None), job.outputs()
    w0 = job.workers[0].output()
    assert "FAILED NodeFailure" in w0 and victim in w0, job.outputs()
    assert victim in job.of("scheduler")[0].output()


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_dead_or_stopped_worker_ends_the_job(sig: str) -> None:
    marks: dict[str, float] = {}  # worker 1 signals itself right after it prints READY
    job = run_job(
        script(),
        2,
        1,
        {"VICTIM_SIGNAL": sig},
        timeout=BOUND_S + 10,
        during=printed(1, "READY", marks),
        not_awaited=("worker 1",),
    )
    check_failed(job, "worker 1", time.monotonic() - marks["t"])


@pytest.mark.parametrize("shm", ["1", "0"])  # 0: every array on the TCP data channel
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_dead_or_stopped_server_ends_the_job(sig: int, shm: str) -> None:
    marks: dict[str, float] = {}

    def kill_server(job: Job) -> None:
        wait_ready(job)
        time.sleep(0.3)
        marks["t"] = time.monotonic()
        os.kill(job.of("server")[1].popen.pid, sig)

    job = run_job(
        script(), 2, 2, {"PS_SHM": shm}, timeout=BOUND_S + 10, during=kill_server, not_awaited=("server 1",)
    )
    check_failed(job, "server 1", time.monotonic() - marks["t"])


def test_long_computation_on_a_healthy_worker_does_not_kill_the_job() -> None:
    """Worker 0 computes (holding the GIL often) for longer than the heartbeat timeout: its
    heartbeat thread keeps it alive. The timeout is 1.5 s here (3 s elsewhere), so that the
    computation costs 2 s of CPU rather than 4."""
    body = """
import time
kv.init('w', np.zeros(10, np.float32))
if kv.rank == 0:
    t = time.monotonic()
    while time.monotonic() - t < 2.0:   # longer than PS_HEARTBEAT_TIMEOUT, holding the GIL often
        sum(range(10000))
out = np.empty(10, np.float32)
kv.pushpull('w', np.ones(10, np.float32), out)
emit(v=float(out[0]))
"""
    job = run_job(worker_script(body), 2, 1, {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "1.5"})
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    assert [w.results() for w in job.workers] == [[{"v": 2.0}], [{"v": 2.0}]]


@pytest.mark.parametrize(
    ("ending", "expect"),
    [
        ("raise ValueError('boom in rank 1')", "uncaught ValueError: boom in rank 1"),
        ("sys.exit(0)", "worker 1 finished"),
    ],
)
def test_a_worker_that_ends_early_ends_the_job(ending: str, expect: str) -> None:
    body = f"""
import sys, time
kv.init('w', np.zeros(10, np.float32))
kv.init('v', np.zeros(10, np.float32))
try:
    kv.barrier()  # both workers are past start-up before rank 1 ends
except Exception as exc:  # rank 1 may end (and the job abort) before worker 0 hears the barrier's end
    print('FAILED ' + type(exc).__name__ + ': ' + str(exc), flush=True)
    raise SystemExit(3)
if kv.rank == 1:
    print('ENDING', flush=True)
    {ending}
try:
    if os.environ.get('WAIT_IN') == 'barrier':
        kv.barrier()
    kv.pushpull('w', np.ones(10, np.float32))
except Exception as exc:
    print('FAILED ' + type(exc).__name__ + ': ' + str(exc), flush=True)
    raise SystemExit(3)
"""
    for wait_in in ("pull", "barrier"):
        marks: dict[str, float] = {}
        job = run_job(
            worker_script(body),
            2,
            1,
            {"WAIT_IN": wait_in},
            timeout=BOUND_S + 10,
            during=printed(1, "ENDING", marks),
        )
        assert time.monotonic() - marks["t"] < BOUND_S, job.outputs()
        assert job.leftover_shm == []
        out = job.workers[0].output()
        assert "FAILED" in out and "worker 1" in out, job.outputs()
        assert job.workers[0].popen.returncode != 0
        assert expect in job.outputs(), job.outputs()
        assert all(code is not None for code in job.codes().values())


def test_dead_scheduler_ends_the_job_and_module_entry_points_work() -> None:
    """Roles started with ``python -m trainer_core.ps.scheduler`` / ``.server``; then the scheduler dies."""
    marks: dict[str, float] = {}

    def kill_scheduler(job: Job) -> None:
        wait_ready(job)
        time.sleep(0.3)
        marks["t"] = time.monotonic()
        job.of("scheduler")[0].popen.kill()

    job = run_job(
        script(),
        2,
        1,
        timeout=BOUND_S + 10,
        during=kill_scheduler,
        not_awaited=("scheduler 0",),
        role_args={
            "scheduler": ["-m", "trainer_core.ps.scheduler"],
            "server": ["-m", "trainer_core.ps.server"],
        },
    )
    elapsed = time.monotonic() - marks["t"]
    assert elapsed < BOUND_S, job.outputs()
    for p in job.procs:
        if p.role != "scheduler":
            assert p.popen.returncode not in (0, None), job.outputs()
    assert "FAILED NodeFailure" in job.workers[0].output() and "scheduler" in job.workers[0].output()
    assert "scheduler" in job.of("server")[0].output()


def test_a_worker_busy_outside_the_store_exits_when_the_job_fails() -> None:
    body = """
import time
kv.init('w', np.zeros(10, np.float32))
if kv.rank == 1:
    print('ENDING', flush=True)
    os._exit(9)
time.sleep(60)   # user code that never calls the store again
print('STILL HERE', flush=True)
"""
    marks: dict[str, float] = {}
    job = run_job(worker_script(body), 2, 1, timeout=BOUND_S + 10, during=printed(1, "ENDING", marks))
    assert time.monotonic() - marks["t"] < BOUND_S, job.outputs()
    w0 = job.workers[0]
    assert w0.popen.returncode == 1 and "STILL HERE" not in w0.output(), job.outputs()
    assert "worker 1" in w0.output()
