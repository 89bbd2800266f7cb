"""--launcher slurm on a real three-node Slurm: node1..node3 are namespace hosts (own address,
hostname and process table), slurmctld on this machine. Inside an allocation and via sbatch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cluster.enginejobs import check_contract, end_running_job, env_of
from tests.launchkit.procs import LAUNCHKIT, PROG, parse_prefixed, wait_for_job, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    """The job's directory, with the test program: the nodes see /tmp, not necessarily the checkout."""
    shutil.copy(PROG, tmp_path / "jobprog.py")
    return tmp_path


def launch(
    cluster, flags: list[str], cwd: Path, home: Path, where: str, *args: str
) -> subprocess.CompletedProcess[str]:
    argv = [*LAUNCHKIT, "launch", "--launcher", "slurm", *flags, *args]
    if where == "allocation":
        argv = ["salloc", "-N3", "-n6", "--overcommit", "--quiet", *argv]
    env = env_of(cluster, home)
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL
    )


def on_nodes(cluster, job: str) -> list[int]:
    assert cluster.hosts is not None
    return [p for h in cluster.hosts for p in h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}")]


@pytest.mark.parametrize("where", ["allocation", "sbatch"])
def test_three_nodes_placement_and_contract(
    slurm_netns, node_python, jobdir: Path, launchkit_home: Path, where
) -> None:
    nodes = ["--nodes", "3"] if where == "sbatch" else []
    res = launch(
        slurm_netns,
        node_python,
        jobdir,
        launchkit_home,
        where,
        "-n",
        "2",
        "-s",
        "2",
        *nodes,
        "python3",
        "jobprog.py",
        "env",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 2, 2, cluster="slurm")
    addresses = slurm_netns.addresses  # node1..node3
    for (role, rank), e in envs.items():
        if role == "scheduler":
            # here inside an allocation; on the batch job's first node otherwise
            expect = slurm_netns.hosts.bridge_address if where == "allocation" else addresses[0]
            assert e["DMLC_PS_ROOT_URI"] == expect and e["DMLC_NODE_HOST"] == expect
            continue
        i = rank if role == "server" else 2 + rank  # MXNet's placement: process i on node i % 3
        assert e["DMLC_NODE_HOST"] == addresses[i % 3], (role, rank, e["DMLC_NODE_HOST"])
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert wait_until(lambda: not slurm_netns.job_ids() and not on_nodes(slurm_netns, job), 10)


@pytest.mark.parametrize("where", ["allocation", "sbatch"])
def test_failing_worker_on_a_node(
    slurm_netns, node_python, jobdir: Path, launchkit_home: Path, where
) -> None:
    nodes = ["--nodes", "3"] if where == "sbatch" else []
    res = launch(
        slurm_netns,
        node_python,
        jobdir,
        launchkit_home,
        where,
        "-n",
        "2",
        "-s",
        "2",
        "--grace-period",
        "2",
        *nodes,
        "python3",
        "jobprog.py",
        "fail",
        "worker",
        "1",
        "3",
    )
    assert res.returncode == 3, res.stderr[-3000:]
    assert "worker 1 on node1 exited with code 3" in res.stderr  # process 3 of 4: node 3 % 3 = node1
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: not slurm_netns.job_ids() and not on_nodes(slurm_netns, job), 10), (
        slurm_netns.run(["squeue"]).stdout
    )


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_launcher_stopped_or_killed_leaves_no_process_on_any_node(
    slurm_netns, node_python, jobdir: Path, launchkit_home: Path, how: str
) -> None:
    env = env_of(slurm_netns, launchkit_home)
    end_running_job(
        how,
        "slurm",
        jobdir,
        launchkit_home,
        env,
        lambda job: not slurm_netns.job_ids() and not on_nodes(slurm_netns, job),
        extra=(*node_python, "--nodes", "3"),
    )
