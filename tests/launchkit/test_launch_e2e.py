"""End-to-end: the real CLI launching real processes on the local backend."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from dmlc_env.ending import peer_failed_line
from tests.launchkit.procs import (
    PROG,
    parse_prefixed,
    pids_with_job,
    record,
    run,
    start,
    until_exists_sh,
    wait_for_job,
    wait_until,
)

PY = sys.executable


def test_two_workers_two_servers_environment(tmp_path) -> None:
    res = run(["launch", "-n", "2", "-s", "2", "--launcher", "local", PY, PROG, "env"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    envs = parse_prefixed(res.stdout)
    assert sorted(envs) == [("scheduler", 0), ("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]
    job_ids = {e["LAUNCHKIT_JOB_ID"] for e in envs.values()}
    secrets = {e["LAUNCHKIT_JOB_SECRET"] for e in envs.values()}
    ports = {e["DMLC_PS_ROOT_PORT"] for e in envs.values()}
    assert len(job_ids) == len(secrets) == len(ports) == 1
    assert len(secrets.pop()) >= 32
    task_ids = set()
    for (role, rank), e in envs.items():
        assert e["DMLC_ROLE"] == role
        assert e["LAUNCHKIT_ROLE_RANK"] == str(rank)
        assert e["LAUNCHKIT_LOCAL_RANK"] == str(rank)  # one host: local rank == role rank
        assert e["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert e["DMLC_NODE_HOST"] == "127.0.0.1"
        assert e["DMLC_NUM_SERVER"] == "2" and e["DMLC_NUM_WORKER"] == "2"
        assert e["DMLC_JOB_CLUSTER"] == "local"
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["cwd"] == str(tmp_path)
        assert e["stdin_is_devnull"] == "True"
        assert "DMLC_INTERFACE" not in e
        task_ids.add(int(e["DMLC_TASK_ID"]))
    assert task_ids == {0, 1, 2, 3, 4}
    assert envs[("server", 1)]["DMLC_TASK_ID"] == "1" and envs[("worker", 0)]["DMLC_TASK_ID"] == "2"
    # stderr is kept apart from stdout, and prefixed too
    assert "stderr of" not in res.stdout
    assert "[worker 1] stderr of worker 1" in res.stderr
    # the secret is never printed by launchkit itself
    assert envs[("worker", 0)]["LAUNCHKIT_JOB_SECRET"] not in res.stderr


def test_command_keeps_its_own_flags(tmp_path) -> None:
    res = run(["launch", "-n", "1", "-s", "0", PY, PROG, "argv", "-n", "3", "--launcher", "x", "--", "-s"])
    assert res.returncode == 0, res.stderr
    assert '[worker 0] ["-n", "3", "--launcher", "x", "--", "-s"]' in res.stdout


def test_double_dash_and_single_string_command_runs_under_sh() -> None:
    res = run(["launch", "-n", "1", "-s", "0", "--", "echo role=$DMLC_ROLE; echo 'two words'"])
    assert res.returncode == 0, res.stderr
    assert "[worker 0] role=worker" in res.stdout
    assert "[worker 0] two words" in res.stdout
    assert "[scheduler" not in res.stdout  # without servers only the workers run the command


def test_env_flags_reach_processes_literally(monkeypatch) -> None:
    hostile = "a b $(touch /tmp/pwned) `id` ;rm -rf / 'q' \"dq\" x=y:z"
    monkeypatch.setenv("X_FORWARDED", "from launcher")
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "1",
            "--env",
            f"X_ALL:{hostile}",
            "--env",
            "X_FORWARDED",
            "--env-server",
            "X_SRV:1",
            "--env-worker",
            "X_WRK:2",
            "--env",
            "PYTHONUNBUFFERED:0",
            PY,
            PROG,
            "env",
        ]
    )
    assert res.returncode == 0, res.stderr
    envs = parse_prefixed(res.stdout)
    for key, e in envs.items():
        assert e["X_ALL"] == hostile
        assert e["X_FORWARDED"] == "from launcher"
        assert e["PYTHONUNBUFFERED"] == "0"
        assert ("X_SRV" in e) == (key[0] == "server")
        assert ("X_WRK" in e) == (key[0] == "worker")
    assert not os.path.exists("/tmp/pwned")


def test_failing_worker_ends_the_job_with_its_code(launchkit_home) -> None:
    t0 = time.monotonic()
    res = run(["launch", "-n", "2", "-s", "2", "--grace-period", "2", PY, PROG, "fail", "worker", "1", "3"])
    elapsed = time.monotonic() - t0
    assert res.returncode == 3, res.stderr
    assert elapsed < 8
    assert "failed: worker 1 on localhost exited with code 3" in res.stderr
    assert "worker 1 is failing" in res.stderr.split("last lines of worker 1:")[1]
    job = wait_for_job(launchkit_home)
    assert pids_with_job(job) == []
    rec = record(launchkit_home, job)
    assert rec["state"] == "failed" and rec["exit_code"] == 3


def test_signal_death_maps_to_128_plus_n() -> None:
    res = run(["launch", "-n", "1", "-s", "1", PY, PROG, "selfkill", "server", "0", str(int(signal.SIGKILL))])
    assert res.returncode == 137, res.stderr
    assert "server 0 on localhost was killed by signal 9" in res.stderr


def test_command_not_found_is_127() -> None:
    res = run(["launch", "-n", "1", "-s", "0", "no-such-program-xyz"])
    assert res.returncode == 127
    assert "cannot start 'no-such-program-xyz'" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_ends_every_process(launchkit_home, sig: int, code: int) -> None:
    proc = start(["launch", "-n", "2", "-s", "1", PY, PROG, "grandchild"])
    try:
        job = wait_for_job(launchkit_home)
        # 4 processes and 4 setsid grandchildren
        assert wait_until(lambda: len(pids_with_job(job)) >= 8, 10), pids_with_job(job)
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == code
        assert wait_until(lambda: pids_with_job(job) == [], 3), pids_with_job(job)
        assert record(launchkit_home, job)["state"] == "interrupted"
    finally:
        proc.kill()
        proc.communicate()


def test_sigkill_of_launcher_leaves_no_process(launchkit_home) -> None:
    proc = start(["launch", "-n", "2", "-s", "2", PY, PROG, "grandchild"])
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 10, 10), pids_with_job(job)
        proc.kill()
        proc.wait(timeout=5)
        assert wait_until(lambda: pids_with_job(job) == [], 5), pids_with_job(job)
    finally:
        proc.kill()
        proc.communicate()
    # nothing of it is left (the reaper ended it all): ps says so, and lists it only with --all
    # (it showed "lost" for ever; issue 40)
    ps = run(["ps", "--all", "--json"])
    states = {j["id"]: j["shown_state"] for j in json.loads(ps.stdout)}
    assert states[job] == "ended (lost)"
    assert job not in run(["ps"]).stdout and "ended (lost)" in run(["ps", "--all"]).stdout
    # kill of the lost job: it says so, and the record stays lost (it said 'ended 0', marked killed)
    res = run(["kill", job])
    assert res.returncode == 0, res.stderr
    assert (
        f"{job}: already lost (its launcher died without recording the end); ended 0 process(es)"
        in res.stdout
    )
    ps = run(["ps", "--all", "--json"])
    assert {j["id"]: j["shown_state"] for j in json.loads(ps.stdout)}[job] == "ended (lost)"
    assert record(launchkit_home, job)["state"] == "running"  # the record itself says nothing more


def test_strays_left_after_success_are_ended(launchkit_home) -> None:
    res = run(["launch", "-n", "1", "-s", "0", PY, PROG, "stray"])
    assert res.returncode == 0, res.stderr
    assert "ended 1 leftover process(es)" in res.stderr  # the worker's (no scheduler without servers)
    assert pids_with_job(wait_for_job(launchkit_home)) == []


def test_log_dir_has_one_file_per_process_and_stream(tmp_path) -> None:
    logs = tmp_path / "logs"
    res = run(["launch", "-n", "2", "-s", "1", "--log-dir", str(logs), PY, PROG, "env"])
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in logs.iterdir())
    assert names == sorted(
        f"{r}.{s}" for r in ("scheduler-0", "server-0", "worker-0", "worker-1") for s in ("stdout", "stderr")
    )
    assert json.loads((logs / "worker-1.stdout").read_text())["DMLC_ROLE"] == "worker"
    assert (logs / "worker-1.stderr").read_text() == "stderr of worker 1\n"


def test_scheduler_port_is_reserved_and_bindable_by_zeromq() -> None:
    res = run(["launch", "-n", "1", "-s", "1", PY, PROG, "zmqbind"])
    assert res.returncode == 0, res.stderr
    assert "[scheduler 0] bound" in res.stdout


@pytest.mark.slow
def test_kill_ends_a_running_job(launchkit_home) -> None:
    proc = start(["launch", "-n", "2", "-s", "1", PY, PROG, "grandchild"])
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 8, 10)
        ps = run(["ps"])
        assert job in ps.stdout and "running" in ps.stdout
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        assert f"{job}: ended 8 process(es)" in res.stdout
        assert pids_with_job(job) == []
        assert proc.wait(timeout=10) == 143
        assert record(launchkit_home, job)["state"] == "killed"
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_kill_all_ends_every_job(launchkit_home) -> None:
    procs = [start(["launch", "-n", "1", "-s", "0", PY, PROG, "wait"]) for _ in range(2)]
    try:
        assert wait_until(lambda: len(list((launchkit_home / "jobs").glob("*.json"))) == 2, 10)
        jobs = [p.stem for p in (launchkit_home / "jobs").glob("*.json")]
        assert wait_until(lambda: all(len(pids_with_job(j)) == 1 for j in jobs), 10)  # the worker
        res = run(["kill", "--all"])
        assert res.returncode == 0, res.stderr
        for j in jobs:  # (other jobs of this user, if any are running, end too)
            assert f"{j}: ended 1 process(es)" in res.stdout
        assert "ended " in res.stdout.splitlines()[-1]
        assert all(pids_with_job(j) == [] for j in jobs)
    finally:
        for p in procs:
            p.kill()
            p.communicate()


def test_kill_unknown_job_is_a_clear_error() -> None:
    res = run(["kill", "no-such-job"])
    assert res.returncode == 2
    assert "no job 'no-such-job'" in res.stderr
    assert "Traceback" not in res.stderr


def test_time_limit_ends_the_job_with_124(launchkit_home) -> None:
    t0 = time.monotonic()
    res = run(
        ["launch", "-n", "1", "-s", "1", "--time-limit", "1", "--grace-period", "1", PY, PROG, "grandchild"]
    )
    assert res.returncode == 124, res.stderr
    assert time.monotonic() - t0 < 8
    assert "reached its time limit" in res.stderr
    job = wait_for_job(launchkit_home)
    assert pids_with_job(job) == []
    assert record(launchkit_home, job)["state"] == "timed out"


def test_root_cause_is_the_process_that_failed_not_the_one_that_noticed_first(tmp_path) -> None:
    """The scheduler exits first, saying (dmlc_env.ending) that it ends because worker 1 failed;
    worker 1 exits only after the launcher has reaped the scheduler, with its own code."""
    pid = tmp_path / "scheduler.pid"
    script = tmp_path / "job.sh"
    script.write_text(
        'case "$DMLC_ROLE $LAUNCHKIT_ROLE_RANK" in\n'
        f'"scheduler 0") echo "trainer_core scheduler: aborting"; echo "{peer_failed_line("worker 1")}"; '
        f"echo $$ > {pid}; exit 1 ;;\n"
        f'"worker 1") {until_exists_sh(pid)}; while kill -0 "$(cat {pid})" 2>/dev/null; do sleep 0.02; done\n'
        '  echo "Traceback (most recent call last):" >&2; echo "ValueError: boom" >&2; exit 3 ;;\n'
        "*) exec sleep 60 ;;\n"
        "esac\n"
    )
    res = run(["launch", "-n", "2", "-s", "1", "--grace-period", "2", "sh", str(script)])
    assert res.returncode == 3, res.stderr
    assert "failed: worker 1 on localhost exited with code 3" in res.stderr
    assert "ValueError: boom" in res.stderr.split("last lines of worker 1:")[1]


TC_JOB = """\
import os, signal, sys
from trainer_core import kv
store = kv.create("dist_sync")
if os.environ["LAUNCHKIT_ROLE_RANK"] == "1":
    if sys.argv[1] == "raise":
        raise ValueError("boom from worker 1")
    print("worker 1 stops", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
signal.pause()
"""


def test_trainer_core_worker_that_raises_is_the_root_cause(tmp_path) -> None:
    (tmp_path / "job.py").write_text(TC_JOB)
    res = run(["launch", "-n", "2", "-s", "1", PY, "job.py", "raise"], cwd=tmp_path, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "failed: worker 1 on localhost exited with code 1" in res.stderr, res.stderr
    assert "ValueError: boom from worker 1" in res.stderr.split("last lines of worker 1:")[1]


def test_trainer_core_hung_worker_is_the_root_cause(tmp_path) -> None:
    """Worker 1 stops (SIGSTOP): the scheduler gives up on its heartbeats and exits; worker 1 never
    ends by itself. It is named, as the scheduler reported it, with the scheduler's exit code."""
    (tmp_path / "job.py").write_text(TC_JOB)
    env = ["--env", "PS_HEARTBEAT_INTERVAL:0.2", "--env", "PS_HEARTBEAT_TIMEOUT:1"]
    res = run(
        ["launch", "-n", "2", "-s", "1", "--grace-period", "1", *env, PY, "job.py", "stop"],
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert (
        "failed: worker 1 on localhost failed, as scheduler 0 reported (exit 1); did not end by itself: "
        "the launcher ended it (signal 9)"
    ) in " ".join(res.stderr.split()), res.stderr
    report = res.stderr.split("last lines of worker 1:")[1]
    assert "worker 1 stops" in report and "sent no heartbeat" in report.split("last lines of scheduler 0:")[1]


def test_a_command_not_found_says_where_it_was_looked_for() -> None:
    """``--env PATH:/nowhere`` (or a venv not activated): "cannot start 'sh': No such file or
    directory" said nothing of PATH on local, where the engines' shim says it."""
    res = run(["launch", "-n", "1", "-s", "0", "--env", "PATH:/nowhere/bin", "sh", "-c", "true"])
    assert res.returncode == 127, res.stderr
    assert "cannot start 'sh': No such file or directory (PATH=/nowhere/bin)" in res.stderr
    res = run(["launch", "-n", "1", "-s", "0", "./no-such-program-xyz"])
    assert res.returncode == 127
    assert (
        "cannot start './no-such-program-xyz': No such file or directory\n" in res.stderr
    )  # a path: no PATH
