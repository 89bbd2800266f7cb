"""Tests of the real Slurm fixtures themselves: jobs run, cancel, leave no trace, and the netns
cluster's nodes are separate hosts (a step's processes live in its node's PID namespace only)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.launchkit.procs import pids_with_env

from .slurm import MIN_JOB_AGE, STATE_ROOT, SlurmCluster, _proc_tags, sweep_stale
from .sshd import spawn_daemon
from .subnets import Subnet


def _job_field(cluster: SlurmCluster, job_id: str, name: str) -> str | None:
    """A field of `scontrol show job ID` (None once slurmctld has forgotten the job)."""
    out = cluster.run(["scontrol", "show", "job", job_id]).stdout
    m = re.search(rf"\b{name}=(\S+)", out)
    return m.group(1) if m else None


def _wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def _submit(cluster: SlurmCluster, args: list[str], cwd: Path, **kw) -> str:
    proc = cluster.run(["sbatch", "--parsable", *args], cwd=cwd, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _pids_in_my_pid_namespace(entry: str) -> list[int]:
    """pids_with_env, restricted to the test process's own PID namespace (the "real machine")."""
    mine = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in pids_with_env(entry):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == mine:
                found.append(pid)
        except OSError:
            continue
    return found


def _daemons_of(tag: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and tag in _proc_tags(p)]


# -- local: one node "localhost" --------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_local_cluster_runs_srun_steps(slurm_local: SlurmCluster) -> None:
    c = slurm_local
    assert (c.nodes, c.addresses, c.hosts) == (["localhost"], ["127.0.0.1"], None)
    assert c.env == {"SLURM_CONF": str(c.conf)}
    assert stat.S_IMODE(c.dir.stat().st_mode) == 0o755
    assert stat.S_IMODE((c.dir / "munge.key").stat().st_mode) == 0o600
    assert f"AuthInfo=socket={c.dir / 'munge.socket.2'}" in c.conf.read_text()
    proc = c.run(["srun", "-N1", "-n2", "hostname"])
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == 2
    # More tasks than CPUs: --overcommit.
    proc = c.run(["srun", "-n5", "--overcommit", "sh", "-c", "echo $SLURM_PROCID"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["0", "1", "2", "3", "4"]
    c.wait_idle()


@pytest.mark.timeout(30)
def test_local_sbatch_then_scancel_leaves_no_job(slurm_local: SlurmCluster, tmp_path: Path) -> None:
    c = slurm_local
    job = _submit(c, ["--wrap", "sleep 30"], tmp_path)
    assert _wait_for(lambda: _job_field(c, job, "JobState") == "RUNNING", 10)
    assert c.job_ids() == [job]
    t0 = time.monotonic()
    assert c.run(["scancel", job]).returncode == 0
    assert _wait_for(lambda: not c.job_ids(), 5), c.run(["squeue"]).stdout
    assert time.monotonic() - t0 < 5
    # Finished jobs stay known to scontrol (and to `squeue --states=all`) for a while.
    assert _job_field(c, job, "JobState") == "CANCELLED"
    assert job in c.job_ids(finished=True)
    c.wait_idle()


@pytest.mark.timeout(30)
def test_local_finished_job_keeps_state_and_exit_code(slurm_local: SlurmCluster, tmp_path: Path) -> None:
    c = slurm_local
    job = _submit(c, ["--wrap", "echo out-$SLURM_JOB_ID; exit 3"], tmp_path)
    assert _wait_for(lambda: _job_field(c, job, "JobState") == "FAILED", 10)
    ended = time.monotonic()
    assert _job_field(c, job, "ExitCode") == "3:0"
    # The batch output lands in the submit directory (the node shares the filesystem).
    assert (tmp_path / f"slurm-{job}.out").read_text() == f"out-{job}\n"
    # Still reported MinJobAge seconds later (checked at most 2s in, to keep the test short).
    time.sleep(max(0.0, min(2.0, MIN_JOB_AGE - 0.5) - (time.monotonic() - ended)))
    assert _job_field(c, job, "ExitCode") == "3:0"
    c.wait_idle()


@pytest.mark.timeout(30)
def test_stop_is_idempotent_and_a_crashed_runs_daemons_are_swept(slurm_local: SlurmCluster) -> None:
    # A leftover of a crashed run: a munged under /run/lkslurm/<tag>/ with nobody holding <tag>.
    stale = STATE_ROOT / f"crashed-{uuid.uuid4().hex[:6]}"
    stale.mkdir(mode=0o755)
    key = stale / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    files = {"socket": "munge.socket.2", "key-file": "munge.key", "pid-file": "pid", "log-file": "log"}
    argv = ["munged", "-F", f"--seed-file={stale}/seed", *(f"--{k}={stale / v}" for k, v in files.items())]
    munged = spawn_daemon(argv, Path("/dev/null"))
    assert _wait_for(lambda: (stale / "munge.socket.2").exists(), 5), (stale / "log").read_text()
    bystander = subprocess.Popen(["sleep", "30"], env={"SLURM_CONF": f"{stale}/slurm.conf"})
    try:
        removed = sweep_stale()
        assert munged.wait(5) is not None
        assert f"dir {stale}" in removed and not stale.exists()
        assert bystander.poll() is None  # not a daemon: left alone
    finally:
        bystander.kill()
        bystander.wait()
    # A live cluster is not swept.
    assert slurm_local.run(["srun", "true"]).returncode == 0

    c = SlurmCluster.start_local()
    tag = c.dir.name
    assert _daemons_of(tag)
    c.stop()
    c.stop()
    assert not c.dir.exists()
    assert not _daemons_of(tag)


# -- netns: node1..node3 in namespace hosts ---------------------------------------------------------
# (60s: the module fixture may first wait up to 30s for another run's netns cluster to go.)


@pytest.mark.timeout(60)
def test_netns_cluster_runs_steps_on_three_nodes(slurm_netns: SlurmCluster) -> None:
    c = slurm_netns
    assert c.nodes == ["node1", "node2", "node3"]
    subnet = Subnet.of_process()  # (this worker's: 10.231.N.0/24)
    assert c.addresses == [f"10.231.{subnet.index}.{10 + i}" for i in (1, 2, 3)]
    assert c.hosts is not None and [h.name for h in c.hosts] == c.nodes
    proc = c.run(["srun", "-N3", "-n3", "hostname"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == c.nodes
    proc = c.run(["srun", "-N3", "-n6", "--overcommit", "sh", "-c", 'echo "$(hostname) $SLURM_NODEID"'])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        "node1 0",
        "node1 0",
        "node2 1",
        "node2 1",
        "node3 2",
        "node3 2",
    ]
    c.wait_idle()


@pytest.mark.timeout(30)
def test_netns_step_processes_live_in_their_hosts_pid_namespace(
    slurm_netns: SlurmCluster, tmp_path: Path
) -> None:
    c = slurm_netns
    assert c.hosts is not None
    entry = f"LAUNCHKIT_JOB_ID={uuid.uuid4().hex}"
    key, value = entry.split("=", 1)
    job = _submit(
        c, ["-N3", "-o", "/dev/null", "--wrap", "srun -N3 -n3 sleep 30"], tmp_path, env={key: value}
    )
    assert _wait_for(lambda: all(h.pids_with_env(entry) for h in c.hosts), 10), c.run(["squeue"]).stdout
    assert _pids_in_my_pid_namespace(entry) == []  # the root namespace's own process table
    assert len(pids_with_env(entry)) >= 3  # the kernel sees them all, in the hosts' namespaces
    assert c.run(["scancel", job]).returncode == 0
    assert _wait_for(lambda: not c.job_ids(), 5)
    assert _wait_for(lambda: not any(h.pids_with_env(entry) for h in c.hosts), 5)
    c.wait_idle()
