"""Elastic jobs across three namespace hosts over ssh (``launchkit launch -n MIN:MAX``, trainer_core
workers with ``hvd.elastic``: ``tests/trainer_core/elastic_launchjob.py``), with host links cut.

The hosts: node1 with two slots (workers 0 and 1), node2 and node3 with one each (workers 2 and
3). Cutting a host's link (its veth, down) closes nothing: no connection ends, no peer sees an
error; the scheduler notices the silence of the host's worker (``PS_HEARTBEAT_TIMEOUT``), the
launcher that of its watchdog (``--heartbeat-timeout``), and the watchdog on the cut host that of
the launcher, which ends the job's processes there by itself.

- One host cut, ``-n 2:4``: the workers on the other hosts train on in their own processes within
  the heartbeat bound + 2 s, no step is counted twice, the job exits 0 and ``launchkit ps JOB``
  shows the loss;
- two hosts cut, ``-n 3:4``: fewer than MIN remain, the job fails naming the root cause.

After each, nothing of the job is left on any host (the cut ones included: their watchdog ended
the processes it ran, and itself).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_torch_hosts import host_site, torch_python  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
from tests.launchkit.procs import pids_with_job, record, run, start, wait_for_job, wait_until
from tests.trainer_core.test_elastic_launch_jobs import HEARTBEAT, TIMEOUT, WAIT, reported, steps

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

ROOT = Path(__file__).resolve().parents[2]
PROG = ROOT / "tests" / "trainer_core" / "elastic_launchjob.py"
SLOTS = (2, 1, 1)  # node1: workers 0 and 1; node2: worker 2; node3: worker 3
LINK_TIMEOUT = 4.0  # --heartbeat-timeout: the launcher's and the watchdogs' bound on a silent link


@pytest.fixture
def shared_out() -> Iterator[Path]:
    """A directory the workers write their steps into, seen alike by the test and every host (the
    hosts' /tmp and /root are private; /var/tmp is the machine's)."""
    out = Path(f"/var/tmp/launchkit-test-elastic-{secrets.token_hex(4)}")
    out.mkdir()
    yield out
    shutil.rmtree(out, ignore_errors=True)


def job_dir(tmp_path: Path) -> Path:
    """The directory synced to the hosts: the worker program with trainer_core and dmlc_env."""
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROG, job / PROG.name)
    return job


def launch_argv(
    group, tmp_path: Path, out: Path, python: str, site: Path, bounds: str, cool_down: str = "600"
) -> list[str]:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(
        "".join(f"{h.hostfile_line()} slots={n}\n" for h, n in zip(group, SLOTS, strict=True))
    )
    envs = [a for e in (f"OUT:{out}", f"PYTHONPATH:{site}", *HEARTBEAT) for a in ("--env", e)]
    return [
        "launch",
        "--launcher",
        "ssh",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--sync-dst-dir",
        "/srv/elasticjob",
        "--heartbeat-timeout",
        str(LINK_TIMEOUT),
        "-n",
        bounds,
        "-s",
        "0",
        "--no-dashboard",
        "--grace-period",
        "2",
        "--blacklist-cooldown",
        cool_down,  # (600: nothing joins meanwhile; the cut host is the only one with a free slot)
        *envs,
        python,
        PROG.name,
    ]


def start_training(
    group, tmp_path: Path, out: Path, python: str, site: Path, bounds: str, home: Path, cool_down: str = "600"
) -> tuple[subprocess.Popen[str], str]:
    """Start the job and wait until each of its 4 workers trained 3 steps and reported to the
    launcher: (the launcher's process, the job id); the job is killed if it gets no further."""
    proc = start(launch_argv(group, tmp_path, out, python, site, bounds, cool_down), cwd=job_dir(tmp_path))
    try:
        assert wait_until(lambda: all(len(steps(out, i)) >= 3 for i in range(4)), WAIT), proc.pid
        assert wait_until(lambda: reported(out, range(4)), WAIT)
        return proc, wait_for_job(home)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def cut(host) -> float:
    """Take the host's link down (its root-side veth): no packet passes either way, nothing closes."""
    subprocess.run(["ip", "link", "set", host.veth, "down"], check=True)
    return time.time()


def left_on(host, job_id: str) -> list[str]:
    """What of the job runs on ``host``, seen from inside it (a cut host too): its processes (by
    the job id in their environment) and a launchkit watchdog (which has no job id there)."""
    found = [f"pid {p}" for p in host.pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}")]
    ps = host.run(["ps", "-wweo", "pid=,args="]).stdout
    return found + [line.strip() for line in ps.splitlines() if "launchkit.hostside.watchdog" in line]


def nothing_left(group, job_id: str) -> bool:
    return not pids_with_job(job_id) and not any(left_on(h, job_id) for h in group)


def worker_hosts(launchkit_home: Path, job_id: str) -> dict[int, str]:
    procs = record(launchkit_home, job_id)["processes"]
    return {p["rank"]: p["host"] for p in procs if p["role"] == "worker"}


def results_of(stdout: str) -> dict[str, dict]:
    return {
        r["me"]: r
        for r in (json.loads(x.split("RESULT ", 1)[1]) for x in stdout.splitlines() if "RESULT " in x)
    }


def stop(proc: subprocess.Popen[str], out: Path) -> tuple[str, str]:
    (out / "stop").write_text("")
    try:
        return proc.communicate(timeout=WAIT)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


@pytest.mark.timeout(480)
def test_a_host_cut_off_leaves_and_the_workers_on_the_others_train_on(
    netns_hosts,  # noqa: F811
    torch_python: str,  # noqa: F811
    host_site: Path,  # noqa: F811
    shared_out: Path,
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(3)
    out = shared_out
    proc, job_id = start_training(group, tmp_path, out, torch_python, host_site, "2:4", launchkit_home)
    try:
        hosts = worker_hosts(launchkit_home, job_id)
        where = [h.hostfile_line() for h in group]
        assert hosts == {0: where[0], 1: where[0], 2: where[1], 3: where[2]}, hosts
        pids = {i: int((out / f"pid-{i}").read_text()) for i in range(4)}
        cut_at = cut(group[1])
        survivors = (0, 1, 3)
        assert wait_until(
            lambda: all(len([s for s in steps(out, i) if s["size"] == 3]) >= 3 for i in survivors), WAIT
        )
        # the launcher has noticed too (its heartbeat bound): the change is in the job's record
        assert wait_until(lambda: record(launchkit_home, job_id)["changes"], WAIT)
    finally:
        stdout, stderr = stop(proc, out)
    assert proc.returncode == 0, stderr[-3000:]
    first_after = min(s["t"] for i in survivors for s in steps(out, i) if s["size"] == 3)
    assert first_after - cut_at < TIMEOUT + 2, (first_after - cut_at, stderr[-3000:])
    results = results_of(stdout)
    assert set(results) == {"0", "1", "3"}, stdout[-3000:]
    for i in survivors:
        assert results[str(i)]["pid"] == pids[i]  # kept its process
        assert results[str(i)]["size"] == 3
        got = [s["step"] for s in steps(out, i)]
        assert got == sorted(set(got)), got  # no step counted twice
    assert results["0"]["params"] == results["1"]["params"] == results["3"]["params"]
    assert results["0"]["steps"] == results["1"]["steps"] == results["3"]["steps"]
    lost = f"left: worker 2 on {group[1].hostfile_line()} ("
    assert f"epoch 1; {lost}" in stderr and "in process" in stderr, stderr[-3000:]
    shown = run(["ps", job_id], cwd=tmp_path)
    assert shown.returncode == 0 and lost in shown.stdout, shown
    # the cut host's watchdog, which the launcher cannot reach, ended its worker and itself
    assert wait_until(lambda: nothing_left(group, job_id), 30), [left_on(h, job_id) for h in group]


@pytest.mark.timeout(480)
def test_hosts_cut_off_below_min_fail_the_job_naming_the_root_cause(
    netns_hosts,  # noqa: F811
    torch_python: str,  # noqa: F811
    host_site: Path,  # noqa: F811
    shared_out: Path,
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(3)
    out = shared_out
    proc, job_id = start_training(group, tmp_path, out, torch_python, host_site, "3:4", launchkit_home)
    try:
        cut(group[1])
        cut(group[2])  # workers 2 and 3: two of four left, fewer than MIN (3)
        _, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode not in (0, None), stderr[-3000:]
    cut_off = {f"worker {i} on {group[i - 1].hostfile_line()}" for i in (2, 3)}
    failed = [line for line in stderr.splitlines() if "failed: " in line]
    assert failed and any(w in failed[0] for w in cut_off), stderr[-3000:]
    assert "fewer than MIN (3): the job ends" in stderr, stderr[-3000:]
    assert any(f"host {group[i].hostfile_line()} stopped answering" in stderr for i in (1, 2)), stderr[-3000:]
    assert record(launchkit_home, job_id)["state"] == "failed"
    assert wait_until(lambda: nothing_left(group, job_id), 30), [left_on(h, job_id) for h in group]


@pytest.mark.timeout(480)
def test_a_cut_host_whose_link_returns_is_used_again_after_its_cool_down(
    netns_hosts,  # noqa: F811
    torch_python: str,  # noqa: F811
    host_site: Path,  # noqa: F811
    shared_out: Path,
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    """The launcher's connection to a host it lost is dead for good: a worker for that host after
    its cool-down goes through a new connection and a new watchdog, and joins the training."""
    group = netns_hosts(3)
    out = shared_out
    proc, job_id = start_training(group, tmp_path, out, torch_python, host_site, "2:4", launchkit_home, "15")
    try:
        cut(group[1])
        assert wait_until(lambda: record(launchkit_home, job_id)["changes"], WAIT)
        subprocess.run(["ip", "link", "set", group[1].veth, "up"], check=True)
        # after the cool-down: worker 4 on node2 trains with the others, the job at MAX again
        assert wait_until(lambda: len([s for s in steps(out, 4) if s["size"] == 4]) >= 3, WAIT)
    finally:
        stdout, stderr = stop(proc, out)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"joined: worker 4 on {group[1].hostfile_line()}" in stderr, stderr[-3000:]
    assert "left: worker 4" not in stderr, stderr[-3000:]
    results = results_of(stdout)
    assert set(results) == {"0", "1", "3", "4"}, stdout[-3000:]
    assert len({json.dumps(r["params"]) for r in results.values()}) == 1
    assert wait_until(lambda: nothing_left(group, job_id), 30), [left_on(h, job_id) for h in group]
