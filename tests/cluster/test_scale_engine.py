"""Engine jobs whose shim table would once have outgrown one environment string (issue 28)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.enginejobs import check_contract
from tests.launchkit.procs import PROG, parse_prefixed, pids_with_job, record, run, wait_until

pytestmark = pytest.mark.timeout(120)


def test_mpi_job_whose_rows_would_pass_the_kernels_limit(tmp_path: Path, launchkit_home: Path) -> None:
    """16 workers, each with a 9000-byte variable of its role: one row per task made the table
    144 KiB, over Linux's 128 KiB for one environment string, and mpirun could not be started
    ("Argument list too long"); the table now holds the value once."""
    env = {**os.environ, "LK_FILLER": "f" * 9000}
    res = run(
        [
            "launch",
            "-n",
            "16",
            "-s",
            "1",
            "--launcher",
            "mpi",
            "--env-worker",
            "LK_FILLER",
            "python3",
            PROG,
            "env",
        ],
        cwd=tmp_path,
        env=env,
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 1, 16, cluster="mpi")
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert record(launchkit_home, job)["state"] == "succeeded"
    assert wait_until(lambda: not pids_with_job(job), 5)
