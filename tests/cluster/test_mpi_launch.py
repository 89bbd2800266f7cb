"""--launcher mpi on a real Open MPI: on this machine, and across two namespace hosts over ssh."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.cluster.enginejobs import check_contract, shims_of, teardown
from tests.launchkit.procs import (
    PROG,
    job_ids,
    parse_prefixed,
    pids_with_job,
    record,
    run,
    start,
    wait_for_job,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


#: Open MPI's mpirun, and MPICH's (Hydra) beside it: Debian installs both, Open MPI as `mpirun`
MPIRUNS = ["mpirun", "mpirun.mpich"]


@pytest.mark.parametrize("mpirun", MPIRUNS)
def test_local_job_roles_ranks_and_environment(tmp_path: Path, launchkit_home: Path, mpirun: str) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            "--mpirun",
            mpirun,
            "--log-dir",
            str(tmp_path / "logs"),
            "--env",
            "X_HOSTILE:a b $HOME '\"",
            "python3",
            PROG,
            "env",
        ],
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 2, 2, cluster="mpi")
    assert all(e["X_HOSTILE"] == "a b $HOME '\"" for e in envs.values())
    assert (tmp_path / "logs" / "worker-1.stdout").read_text().startswith("{")
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert record(launchkit_home, job)["state"] == "succeeded"
    assert not pids_with_job(job)


@pytest.mark.parametrize("mpirun", MPIRUNS)
def test_local_failing_worker_is_the_root_cause(tmp_path: Path, launchkit_home: Path, mpirun: str) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            "--mpirun",
            mpirun,
            "--grace-period",
            "2",
            "python3",
            PROG,
            "fail",
            "worker",
            "1",
            "3",
        ],
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 3, res.stderr[-3000:]
    assert "worker 1 on localhost exited with code 3" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: not pids_with_job(job), 5)
    assert not shims_of(job, tmp_path)


def test_local_kill_ends_the_job(tmp_path: Path, launchkit_home: Path) -> None:
    proc = start(
        ["launch", "-n", "2", "-s", "1", "--launcher", "mpi", "python3", PROG, "wait", "60"], cwd=tmp_path
    )
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 8, 20)  # mpirun, shims, programs, scheduler
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert wait_until(lambda: not pids_with_job(job), 5)
        assert record(launchkit_home, job)["state"] == "killed"
    finally:
        proc.kill()


def test_sigkill_of_launcher_leaves_no_rank(tmp_path: Path, launchkit_home: Path) -> None:
    """Nothing is left: no rank, and not the launcher's directory for the shims' end marks (the
    reaper removes it; it stayed in the temporary directory)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = start(
        ["launch", "-n", "2", "-s", "1", "--launcher", "mpi", "python3", PROG, "wait", "60"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: len(pids_with_job(job)) >= 8, 20)
    assert list(temp.glob("launchkit-ends-*"))
    proc.kill()
    proc.wait(5)
    assert wait_until(lambda: not pids_with_job(job), 15)
    assert wait_until(lambda: not list(temp.glob("launchkit-ends-*")), 10), list(temp.iterdir())


def test_two_namespace_hosts(netns_hosts, node_python, tmp_path: Path, launchkit_home: Path) -> None:
    group = netns_hosts(2, private_tmp=False)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.address}\n" for h in group))
    shutil.copy(PROG, tmp_path / "jobprog.py")  # the hosts see /tmp, not necessarily the checkout
    flags = [
        *node_python,
        "--mpi-args",
        f"--mca oob_tcp_if_include {group.cidr} --mca btl_tcp_if_include {group.cidr}",
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
    ]
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            "-H",
            str(hostfile),
            *flags,
            "python3",
            "jobprog.py",
            "env",
        ],
        cwd=tmp_path,
        timeout=80,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    check_contract(envs, 2, 2, cluster="mpi")
    for (role, rank), e in envs.items():
        if role != "scheduler":
            i = rank if role == "server" else 2 + rank  # process i on hosts[i % 2]
            assert e["DMLC_NODE_HOST"] == group[i % 2].address
            assert e["DMLC_PS_ROOT_URI"] == group.bridge_address
    # a failing worker on a remote host: exit 3, nothing left on either host
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            "-H",
            str(hostfile),
            *flags,
            "--grace-period",
            "2",
            "python3",
            "jobprog.py",
            "fail",
            "worker",
            "1",
            "3",
        ],
        cwd=tmp_path,
        timeout=80,
    )
    assert res.returncode == 3, res.stderr[-3000:]
    assert f"worker 1 on {group[1].address} exited with code 3" in res.stderr
    job = sorted((launchkit_home / "jobs").glob("*.json"))[-1].stem
    assert wait_until(lambda: not any(h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}") for h in group), 10)

    # the launcher killed outright: the reaper ends mpirun, the remote ranks go with it
    before = set(job_ids(launchkit_home))
    proc = start(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--launcher",
            "mpi",
            "-H",
            str(hostfile),
            *flags,
            "python3",
            "jobprog.py",
            "wait",
            "60",
        ],
        cwd=tmp_path,
    )
    try:
        assert wait_until(lambda: set(job_ids(launchkit_home)) - before, 10)
        (job,) = set(job_ids(launchkit_home)) - before
        on_hosts = lambda: [p for h in group for p in h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}")]  # noqa: E731
        assert wait_until(lambda: len(on_hosts()) >= 8, 30)  # a shim and a program per rank
        proc.kill()
        proc.wait(5)
        assert wait_until(lambda: not on_hosts() and not pids_with_job(job), 15)
    finally:
        proc.kill()


def test_without_servers_across_hosts_worker_0_publishes_an_address_the_others_reach(
    netns_hosts, node_python, tmp_path: Path, launchkit_home: Path
) -> None:
    """-s 0 across two namespace hosts whose names resolve to loopback (issue 40: every rank got
    MASTER_ADDR=127.0.0.1 and sat in init_process_group): worker 0 publishes the address it
    reaches the launcher's machine through, and each worker's gloo/NCCL interface is the one
    toward it (the program prints its environment: the hosts' python has no numpy)."""
    from tests.launchkit.noserver import PROG as NOSERVER

    group = netns_hosts(2, private_tmp=False)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.address}\n" for h in group))
    shutil.copy(NOSERVER, tmp_path / "noserverprog.py")
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--launcher",
            "mpi",
            "-H",
            str(hostfile),
            *node_python,
            "--mpi-args",
            f"--mca oob_tcp_if_include {group.cidr} --mca btl_tcp_if_include {group.cidr}",
            "-i",
            str(group.identity),
            "--known-hosts",
            str(group.known_hosts),
            "python3",
            "noserverprog.py",
            "env",
        ],
        cwd=tmp_path,
        timeout=80,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert sorted(outs) == [("worker", 0), ("worker", 1)]
    assert {o["MASTER_ADDR"] for o in outs.values()} == {group[0].address}
    assert {(o["GLOO_SOCKET_IFNAME"], o["NCCL_SOCKET_IFNAME"]) for o in outs.values()} == {("eth0", "eth0")}


#: The engine's own lines that say nothing to the user: echoes of the launcher's signal, the shim's
#: guardians counted as leftovers (issue 27)
NOISE = ("leftover", "Forwarding signal", "Abort is in progress", "BAD TERMINATION", "EXIT STRING")


@pytest.mark.parametrize("mpirun", MPIRUNS)
@pytest.mark.parametrize("how", ["fail", "sigint", "kill"])
def test_every_rank_gets_sigterm_when_the_grace_period_starts(
    tmp_path: Path, launchkit_home: Path, mpirun: str, how: str
) -> None:
    """Grace 10 s, every process traps SIGTERM: all get it at once and the launch ends when they
    have (Open MPI's mpirun passed its own SIGTERM on only after odls_base_sigkill_timeout)."""
    env = {**os.environ, "LAUNCHKIT_HOME": str(launchkit_home)}
    t = teardown(how, "mpi", tmp_path, launchkit_home, env, ("--mpirun", mpirun))
    assert t.rc == {"fail": 3, "sigint": 130, "kill": 143}[how], t.stderr[-3000:]
    assert sorted(t.term_s) == ["scheduler-0", "server-0", "worker-0"] + (
        ["worker-1"] if how != "fail" else []
    )
    # at once: before half the grace period (with "kill" the cause is the start of `launchkit
    # kill`, which took 3.4 s at load 12 on the 2-core machine: every rank had its SIGTERM 3.02 s
    # after it, within 4 ms of each other), and the end within 3 s of the last SIGTERM; Open MPI's
    # own would have come after the grace period and its sigkill timeout (10 + 2 s)
    assert max(t.term_s.values()) < 5.0, t.term_s
    assert t.exit_s - max(t.term_s.values()) < 3.0, (t.exit_s, t.term_s, t.stderr[-3000:])
    assert not [w for w in NOISE if w in t.stderr + t.stdout], t.stderr[-3000:]


@pytest.mark.parametrize("mpirun", MPIRUNS)
@pytest.mark.parametrize("how", ["kill9", "stalled"])
def test_sigkill_of_one_ranks_shim_ends_the_launch_promptly(
    tmp_path: Path, launchkit_home: Path, mpirun: str, how: str
) -> None:
    """Grace 10 s, every process traps SIGTERM, worker 1's shim is SIGKILLed: the launch names it
    (137), every other rank gets SIGTERM and the launch ends as soon as they have ended, whatever
    mpirun passes on: Open MPI's, ending the job itself, sometimes stops passing the ranks' end
    marks on (they came only when it exited, after its sigkill timeout); ``stalled`` stops mpirun,
    so that nothing is passed on. The launcher reads the marks the shims leave in its directory
    too. (Hydra SIGKILLs the other ranks itself once it sees one killed by a signal.)"""
    env = {**os.environ, "LAUNCHKIT_HOME": str(launchkit_home)}
    t = teardown(how, "mpi", tmp_path, launchkit_home, env, ("--mpirun", mpirun))
    assert t.rc == 137, t.stderr[-3000:]
    if mpirun == "mpirun":  # Hydra's SIGKILLs end the others at once: any may be named first
        assert "worker 1 on localhost was killed by signal 9" in t.stderr, t.stderr[-3000:]
    others = ["scheduler-0", "server-0", "worker-0"]
    if mpirun == "mpirun":
        assert sorted(t.term_s) == others, t.term_s
    else:  # the launcher's SIGTERM to the other shims races Hydra's SIGKILL of their ranks
        assert "scheduler-0" in t.term_s and set(t.term_s) <= set(others), t.term_s
    # stalled: the end marks wait 2 s in the launcher's directory for mpirun's stream (ENDS_HOLD_RUNNING)
    assert max(t.term_s.values()) < (3.5 if how == "stalled" else 1.5), t.term_s
    assert t.exit_s < (5.0 if how == "stalled" else 2.0), (t.exit_s, t.stderr[-3000:])
    assert wait_until(lambda: not pids_with_job(wait_for_job(launchkit_home)), 5)


@pytest.mark.parametrize("mpirun", MPIRUNS)
def test_clean_job_warns_about_nothing(tmp_path: Path, launchkit_home: Path, mpirun: str) -> None:
    res = run(
        ["launch", "-n", "2", "-s", "1", "--launcher", "mpi", "--mpirun", mpirun, "--", "true"], cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr and "[mpirun]" not in res.stdout + res.stderr, res.stderr
