"""Jobs without servers (``-s 0``) on the engines: mpirun (Open MPI and MPICH), Slurm (inside an
allocation and through sbatch) and Grid Engine, on this machine. Only the workers run the command
(no scheduler process); worker 0's shim picks its address and two ports and publishes them beside
the job's directory, so every worker gets torch's variables and trainer_core's collective group
meets at worker 0; a killed worker is the job's root cause and nothing is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.enginejobs import env_of, gone, program, shims_of
from tests.launchkit.noserver import PROG, check_workers_only
from tests.launchkit.procs import LAUNCHKIT, parse_prefixed, pids_with_job, run, wait_for_job, wait_until

pytestmark = pytest.mark.timeout(120)

ENGINES = ["mpirun", "mpirun.mpich", "slurm-allocation", "slurm-sbatch", "sge"]


def engines(*names: str) -> list:
    """The engine parameters, each marked with the engine it holds (its fixture is asked for at
    run time, so tests/cluster/groups.py reads the mark, not the fixture's name)."""
    return [
        pytest.param(n, id=n, marks=pytest.mark.holds(n.split("-")[0])) if not n.startswith("mpirun") else n
        for n in names
    ]


def launch(
    request, engine: str, cwd: Path, home: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], object]:
    """``launchkit launch`` of ``args`` on ``engine``; returns its result and the engine's fixture."""
    cluster: object = None
    if engine.startswith("mpirun"):
        argv = [*LAUNCHKIT, "launch", "--launcher", "mpi", "--mpirun", engine]
        env = {**os.environ, "LAUNCHKIT_HOME": str(home)}
    else:
        cluster = request.getfixturevalue("sge_local" if engine == "sge" else "slurm_local")
        env = env_of(cluster, home)
        argv = [*LAUNCHKIT, "launch", "--launcher", engine.split("-")[0]]
        if engine == "slurm-allocation":
            argv = ["salloc", "-N1", "-n4", "--overcommit", "--quiet", *argv]
    res = subprocess.run(
        [*argv, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        stdin=subprocess.DEVNULL,
    )
    return res, cluster


def nothing_left(cluster: object, job: str, cwd: Path) -> bool:
    if cluster is None:  # mpirun: no rank, no shim of this job (another test's may run beside it)
        return not pids_with_job(job) and not shims_of(job, cwd)
    return gone(cluster, job)


@pytest.mark.parametrize("engine", engines(*ENGINES))
def test_only_workers_run_and_allreduce_at_worker_0(
    request, engine: str, tmp_path: Path, launchkit_home: Path
) -> None:
    res, cluster = launch(
        request, engine, tmp_path, launchkit_home, "-n", "3", "-s", "0", sys.executable, PROG, "allreduce"
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    check_workers_only(outs, 3, engine.split("-")[0].replace("mpirun.mpich", "mpi").replace("mpirun", "mpi"))
    assert all(o["sum"] == [6] * 7 and o["size"] == 3 for o in outs.values())
    job = outs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert wait_until(lambda: nothing_left(cluster, job, tmp_path), 20)
    assert not list(tmp_path.rglob("*worker0*"))  # worker 0's published address is forgotten


@pytest.mark.parametrize("engine", engines("mpirun", "mpirun.mpich", "slurm-allocation", "sge"))
def test_a_killed_worker_is_the_root_cause_and_nothing_is_left(
    request, engine: str, tmp_path: Path, launchkit_home: Path
) -> None:
    res, cluster = launch(
        request,
        engine,
        tmp_path,
        launchkit_home,
        "-n",
        "3",
        "-s",
        "0",
        "--grace-period",
        "2",
        sys.executable,
        PROG,
        "allreduce",
        "1",
    )
    assert res.returncode == 128 + signal.SIGKILL, res.stderr[-3000:]
    assert "failed: worker 1 on " in res.stderr and "was killed by signal 9" in res.stderr, res.stderr[-3000:]
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: nothing_left(cluster, job, tmp_path), 20)


@pytest.mark.parametrize("engine", engines("mpirun", "slurm-allocation", "sge"))
def test_a_plain_torch_script_runs_unchanged(
    request, engine: str, tmp_path: Path, launchkit_home: Path
) -> None:
    """torch.distributed with gloo and env:// (MASTER_ADDR/PORT from worker 0's shim); it never
    imports trainer_core."""
    pytest.importorskip("torch")
    res, _ = launch(
        request, engine, tmp_path, launchkit_home, "-n", "2", "-s", "0", sys.executable, PROG, "torch"
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert {k: (o["rank"], o["size"], o["sum"]) for k, o in outs.items()} == {
        ("worker", 0): (0, 2, [3.0] * 3),
        ("worker", 1): (1, 2, [3.0] * 3),
    }


@pytest.mark.parametrize("how", ["kill", "sigint"])
@pytest.mark.parametrize("engine", engines("mpirun", "slurm-sbatch", "sge"))
def test_kill_and_ctrl_c_end_a_job_without_servers(
    request, engine: str, how: str, tmp_path: Path, launchkit_home: Path
) -> None:
    cluster: object = None
    env = {**os.environ, "LAUNCHKIT_HOME": str(launchkit_home)}
    if not engine.startswith("mpirun"):
        cluster = request.getfixturevalue("sge_local" if engine == "sge" else "slurm_local")
        env = env_of(cluster, launchkit_home)
    launcher = ["--launcher", "mpi"] if cluster is None else ["--launcher", engine.split("-")[0]]
    proc = subprocess.Popen(
        [*LAUNCHKIT, "launch", *launcher, "-n", "2", "-s", "0", "python3", program(tmp_path), "wait", "60"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        job = wait_for_job(launchkit_home, 30)
        assert wait_until(lambda: len(pids_with_job(job)) >= 4, 60)  # a shim and a program per worker
        if how == "kill":
            assert run(["kill", job], env=env).returncode == 0
            assert proc.wait(30) == 128 + signal.SIGTERM
        else:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 128 + signal.SIGINT
        assert wait_until(lambda: nothing_left(cluster, job, tmp_path), 20)
    finally:
        proc.kill()
        proc.communicate()
