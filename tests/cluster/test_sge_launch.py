"""--launcher sge on a real Grid Engine (qmaster and execd on this machine): one array job,
roles from the 1-based SGE_TASK_ID, failure, kill, Ctrl-C, the launcher's death and --detach."""

from __future__ import annotations

import json
import os
import shlex
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


def env_of(cluster, home: Path) -> dict[str, str]:
    return {**os.environ, **cluster.env, "LAUNCHKIT_HOME": str(home)}


def gone(cluster, job: str) -> bool:
    return not cluster.job_ids() and not pids_with_job(job)


def launch(cluster, tmp_path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCHKIT, "launch", "--launcher", "sge", *args], cwd=tmp_path, env=env_of(cluster, home),
                          capture_output=True, text=True, timeout=80, stdin=subprocess.DEVNULL)  # fmt: skip


def test_array_job_roles_ranks_and_environment(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = launch(sge_local, tmp_path, launchkit_home, "-n", "2", "-s", "2", "--log-dir", str(tmp_path / "logs"),
                 "--env", "X_HOSTILE:a b $HOME '\"", "python3", PROG, "env")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 2, 2, cluster="sge")
    assert all(e["X_HOSTILE"] == "a b $HOME '\"" for e in envs.values())
    assert all(e["cwd"] == str(tmp_path) for e in envs.values())
    roots = {(e["DMLC_PS_ROOT_URI"], e["DMLC_PS_ROOT_PORT"]) for e in envs.values()}
    assert len(roots) == 1 and roots.pop()[1] != "0"  # the scheduler's task published it
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert wait_until(lambda: gone(sge_local, job), 10)
    directory = tmp_path / f"launchkit-{job}"
    assert sorted(p.name for p in directory.iterdir()) == [
        f"task-{i}.out" for i in range(1, 6)
    ]  # no secret left
    assert (tmp_path / "logs" / "worker-1.stdout").read_text().startswith("{")


def test_secret_is_not_in_the_job_environment(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    proc = subprocess.Popen([*LAUNCHKIT, "launch", "--launcher", "sge", "-n", "1", "-s", "1", "python3", PROG, "wait",
                             "60"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 6, 30)
        (sge_job,) = sge_local.job_ids()
        shown = sge_local.run(["qstat", "-j", sge_job]).stdout
        secret = next(
            p.split(b"=", 1)[1].decode()
            for pid in pids_with_job(job)
            for p in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if p.startswith(b"LAUNCHKIT_JOB_SECRET=")
        )
        assert len(secret) == 64 and secret not in shown and "LAUNCHKIT_SHIM_TASKS" in shown
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        assert wait_until(lambda: gone(sge_local, job), 15)
    finally:
        proc.kill()


def test_failing_worker_is_the_root_cause(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = launch(sge_local, tmp_path, launchkit_home, "-n", "2", "-s", "2", "--grace-period", "2",
                 "python3", PROG, "fail", "worker", "1", "3")  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    assert f"worker 1 on {socket.gethostname()} exited with code 3" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: gone(sge_local, job), 15), sge_local.run(["qstat"]).stdout


@pytest.mark.parametrize("how", ["kill", "sigint", "sigkill"])
def test_kill_ctrl_c_and_launcher_death_qdel_the_job(
    sge_local, tmp_path: Path, launchkit_home: Path, how
) -> None:
    env = env_of(sge_local, launchkit_home)
    proc = subprocess.Popen([*LAUNCHKIT, "launch", "--launcher", "sge", "-n", "2", "-s", "1", "python3", PROG, "wait",
                             "60"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 8, 30)  # a shim and a program per task
        if how == "kill":
            res = run(["kill", job], env=env)
            assert res.returncode == 0, res.stderr
            assert proc.wait(30) == 143
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        else:
            proc.kill()
            proc.wait(5)
        assert wait_until(lambda: gone(sge_local, job), 20), sge_local.run(["qstat"]).stdout
    finally:
        proc.kill()


def test_detach_then_ps_logs_and_kill(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    res = run(["launch", "-n", "1", "-s", "1", "--launcher", "sge", "--detach", "python3", PROG, "wait", "60"],
              cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert "submitted as sge job" in res.stderr
    assert wait_until(lambda: len(pids_with_job(job)) >= 6, 30)  # runs with no launcher at all
    assert "running" in run(["ps"], env=env).stdout
    assert wait_until(lambda: "[worker 0] ready" in run(["logs", job], env=env).stdout, 10)
    res = run(["kill", job], env=env)
    assert res.returncode == 0 and "cancelled sge job" in res.stdout, res.stderr
    assert wait_until(lambda: gone(sge_local, job), 20), sge_local.run(["qstat"]).stdout
    assert record(launchkit_home, job)["state"] == "killed"
    assert not (tmp_path / f"launchkit-{job}" / "secret").exists()


def test_detached_failure_is_recorded(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    res = run(["launch", "-n", "1", "-s", "0", "--launcher", "sge", "--detach", "--grace-period", "1", "python3",
               PROG, "fail", "worker", "0", "3"], cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert wait_until(lambda: not sge_local.job_ids(), 30), sge_local.run(["qstat"]).stdout
    assert wait_until(lambda: "failed" in run(["ps", "--all"], env=env).stdout, 10)
    assert record(launchkit_home, job)["exit_code"] == 3


def test_hosts_from_a_parallel_job(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    """Inside a real PE job, `launchkit hosts list --from sge` reads Grid Engine's PE_HOSTFILE."""
    script = f"#!/bin/sh\nexec {shlex.join([*LAUNCHKIT, 'hosts', 'list', '--from', 'sge', '--json'])}\n"
    out = tmp_path / "hosts.json"
    res = sge_local.run(["qsub", "-sync", "y", "-pe", "smp", "2", "-S", "/bin/sh", "-o", str(out), "-j", "y",
                         "-wd", str(tmp_path), "-v", "PATH"], input=script)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert [(h["host"], h["slots"]) for h in json.loads(out.read_text())] == [(socket.gethostname(), 2)]
