"""--launcher sge on a real Grid Engine (qmaster and execd on this machine): one array job,
roles from the 1-based SGE_TASK_ID, failure, kill, Ctrl-C, the launcher's death and --detach."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
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
    start_waiting_job,
    teardown,
)
from tests.launchkit.procs import (
    LAUNCHKIT,
    PROG,
    parse_prefixed,
    pids_with_job,
    wait_for_job,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


def shims_of(job: str) -> list[int]:
    """The job's processes that run the rank shim: its tasks, once Grid Engine runs them. Not every
    process with the job's id: the launcher's qsub and qstat (Debian's wrapper scripts and their
    `arch` subshells) carry it too, before the job is listed or after it has left."""
    out = []
    for pid in pids_with_job(job):
        with contextlib.suppress(OSError):
            if b"launchkit.hostside.shim" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


def launch(cluster, tmp_path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAUNCHKIT, "launch", "--launcher", "sge", *args],
        cwd=tmp_path,
        env=env_of(cluster, home),
        capture_output=True,
        text=True,
        timeout=80,
        stdin=subprocess.DEVNULL,
    )


def test_array_job_roles_ranks_and_environment(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = launch(
        sge_local,
        tmp_path,
        launchkit_home,
        "-n",
        "2",
        "-s",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        "--env",
        "X_HOSTILE:a b $HOME '\"",
        "python3",
        PROG,
        "env",
    )
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


def secret_of(job: str) -> str | None:
    """The job's secret, from the environment of a process of the job that has it (None: none yet)."""
    for pid in pids_with_job(job):
        with contextlib.suppress(OSError):
            for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if entry.startswith(b"LAUNCHKIT_JOB_SECRET="):
                    return entry.split(b"=", 1)[1].decode()
    return None


def test_secret_is_not_in_the_job_environment(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    proc = start_waiting_job("sge", tmp_path, env)
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(shims_of(job)) >= 4, 30)  # every task runs
        (sge_job,) = sge_local.job_ids()
        shown = sge_local.run(["qstat", "-j", sge_job]).stdout
        # (the shims give the secret to the processes they start: on a machine at load 21 none of
        # those had started yet when every shim ran)
        assert wait_until(lambda: secret_of(job) is not None, 30)
        secret = secret_of(job)
        assert (
            secret is not None
            and len(secret) == 64
            and secret not in shown
            and "LAUNCHKIT_SHIM_TASKS" in shown
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        assert wait_until(lambda: gone(sge_local, job), 15)
    finally:
        proc.kill()


def test_failing_worker_is_the_root_cause(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    res = launch(
        sge_local,
        tmp_path,
        launchkit_home,
        "-n",
        "2",
        "-s",
        "2",
        "--grace-period",
        "2",
        "python3",
        PROG,
        "fail",
        "worker",
        "1",
        "3",
    )
    assert res.returncode == 3, res.stderr[-3000:]
    assert f"worker 1 on {socket.gethostname()} exited with code 3" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: gone(sge_local, job), 15), sge_local.run(["qstat"]).stdout


@pytest.mark.parametrize("how", ["kill", "sigint", "sigkill"])
def test_kill_ctrl_c_and_launcher_death_qdel_the_job(
    sge_local, tmp_path: Path, launchkit_home: Path, how
) -> None:
    env = env_of(sge_local, launchkit_home)
    end_running_job(how, "sge", tmp_path, launchkit_home, env, lambda job: gone(sge_local, job))


def test_detach_then_ps_logs_top_and_kill(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    job = detach_round_trip("sge", tmp_path, launchkit_home, env, lambda job: gone(sge_local, job))
    assert not (tmp_path / f"launchkit-{job}" / "secret").exists()


def test_detached_failure_is_recorded(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    env = env_of(sge_local, launchkit_home)
    detached_failure("sge", tmp_path, launchkit_home, env, lambda: not sge_local.job_ids())


def test_hosts_from_a_parallel_job(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    """Inside a real PE job, `launchkit hosts list --from sge` reads Grid Engine's PE_HOSTFILE."""
    script = f"#!/bin/sh\nexec {shlex.join([*LAUNCHKIT, 'hosts', 'list', '--from', 'sge', '--json'])}\n"
    out = tmp_path / "hosts.json"
    res = sge_local.run(
        [
            "qsub",
            "-sync",
            "y",
            "-pe",
            "smp",
            "2",
            "-S",
            "/bin/sh",
            "-o",
            str(out),
            "-j",
            "y",
            "-wd",
            str(tmp_path),
            "-v",
            "PATH",
        ],
        input=script,
    )
    assert res.returncode == 0, res.stderr
    assert [(h["host"], h["slots"]) for h in json.loads(out.read_text())] == [(socket.gethostname(), 2)]


@pytest.mark.parametrize("how", ["fail", "sigint", "kill"])
def test_every_process_gets_sigterm_when_the_grace_period_starts(
    sge_local, tmp_path: Path, launchkit_home: Path, how: str
) -> None:
    """Grace 10 s, every process traps SIGTERM: all get it at once, and the launch ends when they
    have."""
    t = teardown(how, "sge", tmp_path, launchkit_home, env_of(sge_local, launchkit_home))
    assert t.rc == {"fail": 3, "sigint": 130, "kill": 143}[how], t.stderr[-3000:]
    assert {"scheduler-0", "server-0", "worker-0"} <= set(t.term_s), (t.term_s, t.stderr[-3000:])
    # (before half the grace period: see below)
    assert max(t.term_s.values()) < 5.0, t.term_s
    # The end is timed from the last SIGTERM, not from the cause: with "kill" the cause is the
    # start of `launchkit kill`, whose own Python start took 2.3-3.4 s on a loaded 2-core machine
    # (bounded above), and Grid Engine's end after the processes have left (qmaster's accounting,
    # then three final reads of qstat and qacct 0.5 s apart) took 4.5-5.6 s there (load 9-17).
    # Under 8 s from the SIGTERM still tells it from a launch that waits out the 10 s grace period.
    assert t.exit_s - max(t.term_s.values()) < 8.0, (t.exit_s, t.term_s, t.stderr[-3000:])
    assert "leftover" not in t.stderr, t.stderr[-3000:]


def test_job_needing_more_slots_than_the_queues_have_is_refused(
    sge_local, tmp_path: Path, launchkit_home: Path
) -> None:
    """9 tasks (4 servers, 4 workers, the scheduler) on the 8-slot queue: exit 2 at once, naming the
    slots, nothing submitted (it sat in the queue until the time limit)."""
    res = launch(
        sge_local,
        tmp_path,
        launchkit_home,
        "-n",
        "4",
        "-s",
        "4",
        "--time-limit",
        "40",
        "python3",
        PROG,
        "wait",
        "5",
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "needs 9 slots" in res.stderr and "8 in all" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not sge_local.job_ids()


def test_pending_tasks_are_shown_with_their_reason(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    """Slots taken by another job: the tasks that wait, and Grid Engine's reason, are in the view."""
    blocker = sge_local.run(
        ["qsub", "-terse", "-t", "1-6", "-b", "y", "-o", "/dev/null", "-j", "y", "sleep", "60"]
    )
    assert blocker.returncode == 0, blocker.stderr
    try:
        assert wait_until(lambda: sge_local.run(["qstat", "-s", "r"]).stdout.count(" r ") >= 6, 20)
        res = launch(
            sge_local,
            tmp_path,
            launchkit_home,
            "-n",
            "2",
            "-s",
            "1",
            "--time-limit",
            "8",
            "python3",
            PROG,
            "wait",
            "30",
        )
        assert res.returncode == 124, res.stderr[-3000:]
        assert "running 2 of 4 tasks; task(s) 3, 4 pending: queue instance" in res.stderr, res.stderr[-3000:]
        assert "because it is full" in res.stderr
    finally:
        sge_local.delete_all_jobs()


def test_a_program_on_the_launchers_path_is_found(sge_local, tmp_path: Path, launchkit_home: Path) -> None:
    """The job gets the launcher's PATH, as on the other engines (issue 40: `python train.py`
    exited 127, 'cannot start python'): a program only on it runs; one on none names the PATH."""
    bin_dir = tmp_path / "own-bin"
    bin_dir.mkdir()
    tool = bin_dir / "lk-own-tool"
    tool.write_text('#!/bin/sh\necho "own tool $DMLC_ROLE"\n')
    tool.chmod(0o755)
    env = {**env_of(sge_local, launchkit_home)}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    argv = [*LAUNCHKIT, "launch", "--launcher", "sge", "-n", "1", "-s", "0"]
    res = subprocess.run(
        [*argv, "lk-own-tool"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[worker 0] own tool worker" in res.stdout
    missing = subprocess.run(
        [*argv, "lk-no-such-tool"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80
    )
    assert missing.returncode == 127, missing.stderr[-3000:]
    assert f"No such file or directory (PATH={bin_dir}:" in missing.stderr
