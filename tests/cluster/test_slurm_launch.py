"""--launcher slurm on a real Slurm (one node, this machine): inside an allocation and via sbatch,
failure, kill, Ctrl-C, the launcher's death and --detach."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.cluster.enginejobs import (
    check_contract,
    detach_round_trip,
    detached_failure,
    end_running_job,
    env_of,
    gone,
    teardown,
)
from tests.launchkit.procs import (
    LAUNCHKIT,
    PROG,
    parse_prefixed,
    record,
    wait_for_job,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


def salloc(cluster, *args: str) -> list[str]:
    """The launcher run inside a fresh allocation of the one node."""
    return ["salloc", "-N1", "-n4", "--overcommit", "--quiet", *LAUNCHKIT, *args]


@pytest.mark.parametrize("where", ["allocation", "sbatch"])
def test_job_runs_with_roles_ranks_and_environment(
    slurm_local, tmp_path: Path, launchkit_home: Path, where
) -> None:
    args = [
        "launch",
        "-n",
        "2",
        "-s",
        "2",
        "--launcher",
        "slurm",
        "--log-dir",
        str(tmp_path / "logs"),
        "--env",
        "X_HOSTILE:a b $HOME '\"",
        "python3",
        PROG,
        "env",
    ]
    argv = salloc(slurm_local, *args) if where == "allocation" else [*LAUNCHKIT, *args]
    res = subprocess.run(
        argv,
        cwd=tmp_path,
        env=env_of(slurm_local, launchkit_home),
        capture_output=True,
        text=True,
        timeout=80,
        stdin=subprocess.DEVNULL,
    )
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
    args = [
        "launch",
        "-n",
        "2",
        "-s",
        "2",
        "--launcher",
        "slurm",
        "--grace-period",
        "2",
        "python3",
        PROG,
        "fail",
        "worker",
        "1",
        "3",
    ]
    argv = salloc(slurm_local, *args) if where == "allocation" else [*LAUNCHKIT, *args]
    res = subprocess.run(
        argv,
        cwd=tmp_path,
        env=env_of(slurm_local, launchkit_home),
        capture_output=True,
        text=True,
        timeout=80,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 3, res.stderr[-3000:]
    where = "localhost" if where == "allocation" else socket.gethostname()  # the node it ran on
    assert f"worker 1 on {where} exited with code 3" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: gone(slurm_local, job), 10), slurm_local.run(["squeue"]).stdout


@pytest.mark.parametrize("how", ["kill", "sigint", "sigkill"])
def test_kill_ctrl_c_and_launcher_death_cancel_the_batch_job(
    slurm_local, tmp_path: Path, launchkit_home: Path, how: str
) -> None:
    env = env_of(slurm_local, launchkit_home)
    end_running_job(how, "slurm", tmp_path, launchkit_home, env, lambda job: gone(slurm_local, job))


def test_detach_then_ps_logs_top_and_kill(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(slurm_local, launchkit_home)
    detach_round_trip("slurm", tmp_path, launchkit_home, env, lambda job: gone(slurm_local, job))


def test_detach_finished_job_shows_its_end(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(slurm_local, launchkit_home)
    detached_failure("slurm", tmp_path, launchkit_home, env, lambda: not slurm_local.job_ids())


def test_hosts_from_the_allocation(slurm_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = subprocess.run(
        salloc(slurm_local, "hosts", "list", "--from", "slurm", "--json"),
        cwd=tmp_path,
        env=env_of(slurm_local, launchkit_home),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    assert [(h["host"], h["slots"]) for h in json.loads(res.stdout)] == [("localhost", 4)]


@pytest.mark.parametrize("how", ["fail", "sigint", "kill"])
def test_every_process_gets_sigterm_when_the_grace_period_starts(
    slurm_local, tmp_path: Path, launchkit_home: Path, how: str
) -> None:
    """Grace 10 s, every process traps SIGTERM: all get it at once, and the launch ends when they
    have (the shim gets the launcher's grace period; it used its own 5 s)."""
    t = teardown(how, "slurm", tmp_path, launchkit_home, env_of(slurm_local, launchkit_home))
    assert t.rc == {"fail": 3, "sigint": 130, "kill": 143}[how], t.stderr[-3000:]
    assert {"scheduler-0", "server-0", "worker-0"} <= set(t.term_s), (t.term_s, t.stderr[-3000:])
    # before half the grace period (with "kill" the cause is the start of `launchkit kill`, which
    # took up to 3.4 s on the loaded 2-core machine), the end within 4 s of the last SIGTERM
    assert max(t.term_s.values()) < 5.0, t.term_s
    assert t.exit_s - max(t.term_s.values()) < 4.0, (t.exit_s, t.term_s, t.stderr[-3000:])
    noise = ("leftover", "CANCELLED", "_step_signal", "forcing job termination", "Exited with exit code")
    assert not [w for w in noise if w in t.stderr + t.stdout], t.stderr[-3000:]
