"""A job without servers (``-s 0``) over ssh on three namespace hosts: only the workers run the
command, worker 0 serves the rendezvous on its host (the launcher asked that host for its address
and two free ports), every worker gets torch's variables (node ranks and local sizes by host), and
trainer_core's collective allreduce crosses the hosts; a killed worker is the root cause and
nothing is left on any host."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
from tests.launchkit.noserver import PROG, check_workers_only
from tests.launchkit.procs import parse_prefixed, run, wait_for_job, wait_until

ROOT = Path(__file__).resolve().parents[2]


def job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):  # trainer_core needs the env contract, not launchkit
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__", "torch"))
    shutil.copy(PROG, job / "prog.py")
    return job


def launch(group, tmp_path: Path, job: Path, python: str, *rest: str):
    hostfile = group.write_hostfile(tmp_path / "hosts")
    return run(
        [
            "launch",
            "-H",
            str(hostfile),
            "-i",
            str(group.identity),
            "--known-hosts",
            str(group.known_hosts),
            "--sync-dst-dir",
            "/srv/w0job",
            "-n",
            "4",
            "-s",
            "0",
            "--grace-period",
            "2",
            python,
            "prog.py",
            *rest,
        ],
        cwd=job,
        timeout=150,
    )


@pytest.mark.timeout(480)
def test_workers_only_across_hosts_allreduce_and_a_killed_worker(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(3)
    job = job_dir(tmp_path)
    res = launch(group, tmp_path, job, host_python, "allreduce")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    check_workers_only(outs, 4, "ssh")
    # each host's interface toward worker 0 (their names resolve to loopback there): issue 40
    assert {(o["GLOO_SOCKET_IFNAME"], o["NCCL_SOCKET_IFNAME"]) for o in outs.values()} == {("eth0", "eth0")}
    assert all(o["sum"] == [10] * 7 and o["size"] == 4 for o in outs.values())
    # workers round-robin over the hosts: 0 and 3 on the first, which serves the rendezvous
    by_rank = [outs[("worker", r)] for r in range(4)]
    assert [(o["NODE_RANK"], o["LOCAL_RANK"], o["LOCAL_WORLD_SIZE"]) for o in by_rank] == [
        ("0", "0", "2"),
        ("1", "0", "1"),
        ("2", "0", "1"),
        ("0", "1", "2"),
    ]
    assert by_rank[0]["MASTER_ADDR"] == group[0].address
    for h in group:
        assert not h.pids_with_env(f"LAUNCHKIT_JOB_ID={by_rank[0]['LAUNCHKIT_JOB_ID']}")

    res = launch(group, tmp_path, job, host_python, "allreduce", "2")
    assert res.returncode == 128 + signal.SIGKILL, res.stderr[-3000:]
    assert f"failed: worker 2 on {group[2].hostfile_line()} was killed by signal 9" in res.stderr
    killed = wait_for_job(launchkit_home)
    assert wait_until(lambda: not any(h.pids_with_env(f"LAUNCHKIT_JOB_ID={killed}") for h in group), 10)
