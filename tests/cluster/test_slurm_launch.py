"""--launcher slurm on a real Slurm (one node, this machine): inside an allocation and via sbatch,
failure, kill, Ctrl-C, the launcher's death and --detach."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.cluster.test_mpi_launch import check_contract
from tests.launchkit.procs import (
    LAUNCHKIT,
    PROG,
    parse_prefixed,
    pids_with_job,
    record,
    run,
    wait_for_job,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


def env_of(cluster, launchkit_home: Path) -> dict[str, str]:
    return {**os.environ, **cluster.env, "LAUNCHKIT_HOME": str(launchkit_home)}


def salloc(cluster, *args: str) -> list[str]:
    """The launcher run inside a fresh allocation of the one node."""
    return ["salloc", "-N1", "-n4", "--overcommit", "--quiet", *LAUNCHKIT, *args]


def gone(cluster, job: str) -> bool:
    return not cluster.job_ids() and not pids_with_job(job)


@pytest.mark.parametrize("where", ["allocation", "sbatch"])
def test_job_runs_with_roles_ranks_and_environment(
    slurm_local, tmp_path: Path, launchkit_home: Path, where
) -> None:
    args = ["launch", "-n", "2", "-s", "2", "--launcher", "slurm", "--log-dir", str(tmp_path / "logs"),
            "--env", "X_HOSTILE:a b $HOME '\"", "python3", PROG, "env"]  # fmt: skip
    argv = salloc(slurm_local, *args) if where == "allocation" else [*LAUNCHKIT, *args]
    res = subprocess.run(argv, cwd=tmp_path, env=env_of(slurm_local, launchkit_home), capture_output=True,
                         text=True, timeout=80, stdin=subprocess.DEVNULL)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 2, 2, cluster="slurm")
    assert all(e["X_HOSTILE"] == "a b $HOME '\"" for e in envs.values())
    assert all(e["cwd"] == str(tmp_path) for e in envs.values())
    assert (tmp_path / "logs" / "server-1.stdout").read_text().startswith("{")
    roots = {(e["DMLC_PS_ROOT_URI"], e["DMLC_PS_ROOT_PORT"]) for e in envs.values()}
    assert len(roots) == 1 and roots.pop()[1] != "0"
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert record(launchkit_home, job)["state"] == "succeeded"
    assert wait_until(lambda: gone(slurm_local, job), 10), slurm_local.run(["squeue"]).stdout
    if where == "sbatch":
        assert (tmp_path / f"launchkit-{job}.out").exists()  # the batch output, kept for `launchkit logs`


@pytest.mark.parametrize("where", ["allocation", "sbatch"])
def test_failing_worker_is_the_root_cause(slurm_local, tmp_path: Path, launchkit_home: Path, where) -> None:
    args = ["launch", "-n", "2", "-s", "2", "--launcher", "slurm", "--grace-period", "2",
            "python3", PROG, "fail", "worker", "1", "3"]  # fmt: skip
    argv = salloc(slurm_local, *args) if where == "allocation" else [*LAUNCHKIT, *args]
    res = subprocess.run(argv, cwd=tmp_path, env=env_of(slurm_local, launchkit_home), capture_output=True,
                         text=True, timeout=80, stdin=subprocess.DEVNULL)  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    where = "localhost" if where == "allocation" else socket.gethostname()  # the node it ran on
    assert f"worker 1 on {where} exited with code 3" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: gone(slurm_local, job), 10), slurm_local.run(["squeue"]).stdout


def start_job(cluster, tmp_path: Path, launchkit_home: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*LAUNCHKIT, "launch", "-n", "2", "-s", "1", "--launcher", "slurm", *extra, "python3", PROG, "wait", "60"],
        cwd=tmp_path, env=env_of(cluster, launchkit_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["kill", "sigint", "sigkill"])
def test_kill_ctrl_c_and_launcher_death_cancel_the_batch_job(
    slurm_local, tmp_path: Path, launchkit_home: Path, how: str
) -> None:
    proc = start_job(slurm_local, tmp_path, launchkit_home)
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 6, 30)  # shims and programs are running
        assert slurm_local.job_ids()
        if how == "kill":
            res = run(["kill", job], env=env_of(slurm_local, launchkit_home))
            assert res.returncode == 0, res.stderr
            assert proc.wait(20) == 143
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 130
        else:
            proc.kill()
            proc.wait(5)
        assert wait_until(lambda: gone(slurm_local, job), 15), slurm_local.run(["squeue"]).stdout
    finally:
        proc.kill()


def test_detach_then_ps_logs_and_kill(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(slurm_local, launchkit_home)
    res = run(["launch", "-n", "1", "-s", "1", "--launcher", "slurm", "--detach", "python3", PROG, "wait", "60"],
              cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert "submitted as slurm job" in res.stderr
    assert wait_until(lambda: len(pids_with_job(job)) >= 4, 30)  # runs with no launcher at all
    ps = run(["ps"], env=env)
    assert job in ps.stdout and "running" in ps.stdout
    assert wait_until(lambda: "[worker 0] ready" in run(["logs", job], env=env).stdout, 10)
    top = run(["top", job, "--once"], env=env)
    assert top.returncode == 0 and top.stdout.count("running") >= 3, top.stdout
    res = run(["kill", job], env=env)
    assert res.returncode == 0 and "cancelled slurm job" in res.stdout, res.stderr
    assert wait_until(lambda: gone(slurm_local, job), 15), slurm_local.run(["squeue"]).stdout
    assert record(launchkit_home, job)["state"] == "killed"


def test_detach_finished_job_shows_its_end(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(slurm_local, launchkit_home)
    res = run(["launch", "-n", "1", "-s", "0", "--launcher", "slurm", "--detach", "python3", PROG,
               "fail", "worker", "0", "3"], cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert wait_until(lambda: not slurm_local.job_ids(), 20)
    assert wait_until(lambda: "failed" in run(["ps", "--all"], env=env).stdout, 5)
    assert record(launchkit_home, job)["exit_code"] == 3


def test_hosts_from_the_allocation(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = subprocess.run(salloc(slurm_local, "hosts", "list", "--from", "slurm", "--json"), cwd=tmp_path,
                         env=env_of(slurm_local, launchkit_home), capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert [(h["host"], h["slots"]) for h in json.loads(res.stdout)] == [("localhost", 4)]
