"""launchkit launching the real MXNet 1.9.1 (its ps-lite scheduler, servers and workers)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.launchkit.procs import pids_with_job, run, wait_for_job

PROGS = Path(__file__).with_name("progs")
MX_ENV = ["--env", "DMLC_INTERFACE:lo"]  # keep ps-lite on loopback


def worker_json(stdout: str) -> list[dict]:
    return [
        json.loads(line.split("] ", 1)[1])
        for line in stdout.splitlines()
        if line.startswith("[worker") and "{" in line
    ]


def test_dist_sync_sums_are_exact(mxnet_python: str) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "local",
            *MX_ENV,
            mxnet_python,
            str(PROGS / "mx_sum.py"),
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = worker_json(res.stdout)
    assert len(out) == 2
    assert sorted(o["rank"] for o in out) == [0, 1]
    for o in out:
        assert o["num_workers"] == 2
        for rnd in range(3):
            expected = [float((1 + 2) * (rnd + 1))]  # ranks 0 and 1 push (rank+1)*(round+1)
            for key in ("3", "7", "9"):
                assert o["results"][f"{key}/{rnd}"] == expected


def test_gluon_training_with_2bit_compression_on_kvstore(mxnet_python: str) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "local",
            *MX_ENV,
            mxnet_python,
            str(PROGS / "mx_gluon.py"),
        ],
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = worker_json(res.stdout)
    assert len(out) == 2
    for o in out:
        assert o["last"] < o["first"] * 0.5, o


def test_failing_mxnet_worker_ends_the_job(mxnet_python: str, launchkit_home) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "local",
            "--grace-period",
            "2",
            *MX_ENV,
            mxnet_python,
            str(PROGS / "mx_fail.py"),
        ],
        timeout=120,
    )
    assert res.returncode == 3, res.stderr[-3000:]
    assert "worker 1 on localhost exited with code 3" in res.stderr
    assert "worker crashed on purpose" in res.stderr
    assert pids_with_job(wait_for_job(launchkit_home)) == []


def test_mxnet_under_mpi_with_launch_py_assignments(mxnet_python: str) -> None:
    """MXNet's nightly tests write `launch.py -n 2 PS_VERBOSE=1 python3 ...`: the leading word sets
    the variable (ps-lite then logs its connections), here with one mpirun for all servers and workers."""
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            *MX_ENV,
            "PS_VERBOSE=1",
            mxnet_python,
            str(PROGS / "mx_sum.py"),
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(worker_json(res.stdout)) == 2
    assert all(o["results"]["9/2"] == [9.0] for o in worker_json(res.stdout))
    assert "connected to" in res.stderr.lower() or "van.cc" in res.stderr, res.stderr[-2000:]


def test_mxnet_as_a_slurm_batch_job(mxnet_python: str, slurm_local, tmp_path: Path, launchkit_home) -> None:
    import os
    import subprocess

    from tests.launchkit.procs import LAUNCHKIT

    env = {**os.environ, **slurm_local.env, "LAUNCHKIT_HOME": str(launchkit_home)}
    res = subprocess.run(
        [
            *LAUNCHKIT,
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "slurm",
            *MX_ENV,
            mxnet_python,
            str(PROGS / "mx_sum.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = worker_json(res.stdout)
    assert sorted(o["rank"] for o in out) == [0, 1]
    assert all(o["results"]["9/2"] == [9.0] for o in out)
