"""Jobs without servers (``-s 0``) on the local backend: only the workers run the command (no
scheduler process), each with torch's variables; trainer_core's collective group meets at worker
0, which serves the rendezvous; a plain torch.distributed script runs unchanged; a killed worker is
the root cause and nothing is left; restarts, ``launchkit kill``. The other backends: tests/cluster."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import pytest

from tests.launchkit.noserver import PROG, check_workers_only
from tests.launchkit.procs import parse_prefixed, pids_with_job, record, run, start, wait_for_job, wait_until

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_only_workers_run_and_meet_at_worker_0(tmp_path: Path, launchkit_home: Path) -> None:
    res = run(["launch", "-n", "3", "-s", "0", sys.executable, PROG, "allreduce"], cwd=tmp_path, timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    check_workers_only(outs, 3, "local")
    assert all(o["sum"] == [6] * 7 and o["size"] == 3 for o in outs.values())
    assert all(
        (o["LOCAL_WORLD_SIZE"], o["NODE_RANK"], o["MASTER_ADDR"]) == ("3", "0", "127.0.0.1")
        for o in outs.values()
    )
    assert "no scheduler process: worker 0 serves the rendezvous at 127.0.0.1:" in res.stderr
    job = outs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert record(launchkit_home, job)["state"] == "succeeded"
    assert [p["role"] for p in record(launchkit_home, job)["processes"]] == ["worker"] * 3
    assert not pids_with_job(job)


def test_torchruns_environment_one_thread_each_and_a_pinned_master_port(tmp_path: Path) -> None:
    """Two workers on this machine: each gets OMP_NUM_THREADS=1 (one line says so, as torchrun),
    torchrun's other variables, and --master-port's MASTER_PORT; --env OMP_NUM_THREADS keeps its own."""
    port = str(free_port())
    res = run(
        ["launch", "-n", "2", "-s", "0", "--master-port", port, sys.executable, PROG, "env"], cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    check_workers_only(outs, 2, "local")
    assert {(o["OMP_NUM_THREADS"], o["MASTER_PORT"], o["GROUP_WORLD_SIZE"]) for o in outs.values()} == {
        ("1", port, "1")
    }
    assert res.stderr.count("OMP_NUM_THREADS=1 for every process on this machine") == 1
    own = run(["launch", "-n", "2", "-s", "0", "--env", "OMP_NUM_THREADS:3", sys.executable, PROG, "env"])
    assert own.returncode == 0, own.stderr[-3000:]
    assert {o["OMP_NUM_THREADS"] for o in parse_prefixed(own.stdout).values()} == {"3"}
    assert "OMP_NUM_THREADS=1" not in own.stderr


def test_a_plain_torch_script_runs_unchanged(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    res = run(["launch", "-n", "2", "-s", "0", sys.executable, PROG, "torch"], cwd=tmp_path, timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert {k: (o["rank"], o["size"], o["sum"]) for k, o in outs.items()} == {
        ("worker", 0): (0, 2, [3.0] * 3),
        ("worker", 1): (1, 2, [3.0] * 3),
    }


@pytest.mark.parametrize("victim", [1, 0])  # worker 0 serves the rendezvous: its death too
def test_a_killed_worker_is_the_root_cause_and_nothing_is_left(
    tmp_path: Path, launchkit_home: Path, victim: int
) -> None:
    res = run(
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--grace-period",
            "2",
            sys.executable,
            PROG,
            "allreduce",
            str(victim),
        ],
        cwd=tmp_path,
        timeout=90,
    )
    assert res.returncode == 128 + signal.SIGKILL, res.stderr[-3000:]
    assert f"failed: worker {victim} on localhost was killed by signal 9" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: not pids_with_job(job), 5)


def test_a_stopped_worker_0_is_named_by_the_others_and_ended(tmp_path: Path, launchkit_home: Path) -> None:
    """Worker 0 hangs (SIGSTOP) with the rendezvous in its process: the others' heartbeats to it go
    unanswered, they name worker 0, and the launcher names it and ends it."""
    res = run(
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--grace-period",
            "1",
            "--env",
            "PS_HEARTBEAT_TIMEOUT:2",
            sys.executable,
            PROG,
            "allreduce",
            "0",
            "stop",
        ],
        cwd=tmp_path,
        timeout=90,
    )
    assert res.returncode != 0, res.stderr[-3000:]
    assert "failed: worker 0 on localhost failed, as worker " in res.stderr, res.stderr[-3000:]
    assert "in worker 0) answered no heartbeat for 2 s" in res.stdout + res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: not pids_with_job(job), 5)


def test_max_restarts_restarts_a_job_without_servers(tmp_path: Path, launchkit_home: Path) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "0.2",
            sys.executable,
            PROG,
            "allreduce",
            "1",
            "once",
        ],
        cwd=tmp_path,
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "attempt 1 failed (worker 1 exit 137, signal 9); restarting" in res.stderr
    outs = parse_prefixed(res.stdout)  # the second attempt's lines replace the first's
    assert all(o["LAUNCHKIT_RESTART_COUNT"] == "1" and o["sum"] == [3] * 7 for o in outs.values())


def test_launchkit_kill_ends_a_job_without_servers(tmp_path: Path, launchkit_home: Path) -> None:
    proc = start(["launch", "-n", "2", "-s", "0", "sh", "-c", "echo ready; sleep 60"], cwd=tmp_path)
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 4, 10)  # two shells and their sleeps
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert wait_until(lambda: not pids_with_job(job), 5)
    finally:
        proc.kill()


def test_the_dashboard_samples_this_host_without_a_scheduler(tmp_path: Path, served_endpoints) -> None:
    """The local workers run here: this host's figures still come (they came as the scheduler's)."""
    import threading

    from launchkit import launching
    from launchkit.backends.local import LocalBackend
    from launchkit.console import Ui
    from launchkit.core.spec import LaunchSpec

    go = tmp_path / "go"
    wait = f"import os, time\nt = time.time()\nwhile not os.path.exists({str(go)!r}) and time.time() - t < 20: time.sleep(0.05)"
    spec = LaunchSpec(num_workers=1, num_servers=0, command=(sys.executable, "-c", wait), cwd=str(tmp_path))

    def release() -> None:
        wait_until(lambda: bool(served_endpoints) and "localhost" in served_endpoints[0].model.hosts, 15)
        go.touch()

    threading.Thread(target=release, daemon=True).start()
    assert launching.run_job(spec, LocalBackend(), Ui()).exit_code == 0
    assert "localhost" in served_endpoints[0].model.hosts


def test_dry_run_says_worker_0_serves_the_rendezvous(tmp_path: Path) -> None:
    res = run(
        ["launch", "--dry-run", "-n", "2", "-s", "0", "--launcher", "mpi", "python", "x.py"], cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "no scheduler process: worker 0 serves the rendezvous at <worker 0's address>:" in res.stdout
    assert "MASTER_ADDR=<worker 0's address>" in res.stdout and "MASTER_PORT=<chosen at launch>" in res.stdout
    assert "scheduler │" not in res.stdout
