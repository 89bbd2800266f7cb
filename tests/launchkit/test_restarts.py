"""``launchkit launch --max-restarts N``: which endings are restarted (a pure function), and the
real CLI restarting real jobs: the same job id and secret, a new port, ``LAUNCHKIT_RESTART_COUNT``,
the last attempt's exit code, no restart after Ctrl-C, SIGTERM or ``launchkit kill`` (during an
attempt, a failure's teardown or the backoff), on this machine and over ssh; and the digits
example, a worker SIGKILLed mid-training, resuming from its checkpoint to the accuracy of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import dmlc_env
from launchkit import launching
from launchkit.backends.local import LocalBackend
from launchkit.cli import main
from launchkit.cli.launchspec import build_spec
from launchkit.console import Ui
from launchkit.core.spec import Host, JobResult, LaunchSpec, Task, TaskResult
from launchkit.errors import BackendError, UsageError
from launchkit.jobs.records import JobRecord
from launchkit.launching import never_starts, restart_cause, restart_delay
from tests.cluster.conftest import netns_hosts, netns_session, sshd_loopback  # noqa: F401
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import (
    job_ids,
    parse_prefixed,
    pids_with_job,
    record,
    run,
    start,
    until_exists_sh,
    wait_for_job,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
# every process prints its attempt, port, job id and secret as JSON
REPORT = (
    'printf \'{"attempt": "%s", "port": "%s", "job": "%s", "secret": "%s"}\\n\' '
    '"$LAUNCHKIT_RESTART_COUNT" "$DMLC_PS_ROOT_PORT" "$LAUNCHKIT_JOB_ID" "$LAUNCHKIT_JOB_SECRET"'
)


def fail_first(barrier: Path, processes: int) -> str:
    """Every process reports, then waits until all ``processes`` of its attempt have (a file each
    in ``barrier``); attempt 0 then fails. Without the wait, the first process to fail ends the
    others, and one still starting on a loaded machine would be ended before it reported."""
    mine = f"{shlex.quote(str(barrier))}/a$LAUNCHKIT_RESTART_COUNT"
    return (
        f"{REPORT}; touch {mine}.$$; "
        f"until set -- {mine}.*; [ $# -ge {processes} ]; do sleep 0.05; done; "
        'test "$LAUNCHKIT_RESTART_COUNT" -ge 1 || exit 3'
    )


# the worker fails at once with 10 + its attempt; the scheduler waits to be ended
ALWAYS_FAIL = 'if [ "$DMLC_ROLE" = worker ]; then exit $((10 + LAUNCHKIT_RESTART_COUNT)); fi; exec sleep 30'
SLEEP = "exec sleep 30"


# -- the decision, as a pure function -------------------------------------------------------------


def result(exit_code: int = 0, sig: int | None = None, *, failed: bool = True, **kw: object) -> JobResult:
    task = Task("worker", 1, 2, Host("localhost"), 1, ("x",))
    root = TaskResult(task, exit_code, sig, 0.0) if failed and exit_code else None
    return JobResult("j", exit_code, (), root_cause=root, **kw)  # type: ignore[arg-type]


def test_a_process_failure_is_restarted_while_restarts_are_left() -> None:
    assert restart_cause(result(3), 0, 1) == "worker 1 exit 3"
    assert restart_cause(result(137, 9), 1, 3) == "worker 1 exit 137, signal 9"
    assert restart_cause(result(3), 1, 1) is None  # none left
    assert restart_cause(result(3), 0, 0) is None  # none asked for


def test_success_signals_and_the_time_limit_are_not_restarted() -> None:
    assert restart_cause(result(0), 0, 5) is None
    # Ctrl-C / SIGTERM (launchkit kill) / SIGHUP to the launcher: every process ended by it
    assert restart_cause(result(130, failed=False, interrupted_by=2, signalled=2), 0, 5) is None
    # a signal that came while a worker's failure was being torn down
    assert restart_cause(result(3, signalled=15), 0, 5) is None
    assert restart_cause(result(124, failed=False, timed_out=True), 0, 5) is None
    # a job that succeeded but whose --log-dir files are incomplete (74): no process failed
    assert restart_cause(result(74, failed=False), 0, 5) is None


def test_a_command_that_cannot_start_is_not_restarted() -> None:
    """126 / 127 on every process that ended by itself: the same command will not start again."""

    def ended(code: int, rank: int = 0, by_launcher: bool = False) -> TaskResult:
        return TaskResult(
            Task("worker", rank, rank, Host("localhost"), rank, ("x",)), code, None, 0.0, by_launcher
        )

    def job(*results: TaskResult) -> JobResult:
        return JobResult("j", results[0].exit_code, results, root_cause=results[0])

    assert restart_cause(job(ended(127), ended(127, 1)), 0, 3) is None
    assert restart_cause(job(ended(126), ended(143, 1, by_launcher=True)), 0, 3) is None
    assert never_starts(job(ended(127))) == "its command was not found (worker 0 exit 127)"
    # another process failed on its own with another code, or the root itself did: restarted
    assert restart_cause(job(ended(127), ended(3, 1)), 0, 3) == "worker 0 exit 127"
    assert restart_cause(job(ended(3), ended(127, 1)), 0, 3) == "worker 0 exit 3"


def test_a_command_that_cannot_start_ends_the_launch_saying_why(launchkit_home) -> None:
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "1",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0",
            "no-such-program-xyz",
        ]
    )
    assert res.returncode == 127, res.stderr
    assert "restarting" not in res.stderr and "attempt 2" not in res.stderr, res.stderr
    assert "no restart: its command was not found (scheduler 0 exit 127)" in " ".join(res.stderr.split())
    rec = record(launchkit_home, wait_for_job(launchkit_home))
    assert (rec["attempt"], rec["state"], rec["exit_code"]) == (0, "failed", 127)


def spec_for(launcher: str = "local", **kw: object) -> LaunchSpec:
    args: dict = dict(
        num_workers=1,
        num_servers=1,
        hostfile=None,
        launcher=launcher,
        sync_dst_dir=None,
        env=[],
        env_server=[],
        env_worker=[],
        log_dir=None,
        job_name=None,
        gpus_per_worker=None,
        scheduler_ip=None,
        scheduler_port=None,
        interface=None,
        grace_period=1.0,
        command=["true"],
        ui=Ui(),
    )
    args.update(kw)
    return build_spec(**args)


def test_flags_are_validated() -> None:
    s = spec_for(max_restarts=3, restart_backoff=0.0)
    assert (s.max_restarts, s.restart_backoff) == (3, 0.0)
    assert spec_for().max_restarts == 0 and spec_for().restart_backoff == 1.0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_restarts": -1}, "--max-restarts must be 0 or more, got -1"),
        ({"restart_backoff": -0.5}, "--restart-backoff must be from 0 to 86400 seconds, got -0.5"),
        ({"restart_backoff": float("nan")}, "got nan"),
        ({"restart_backoff": float("inf")}, "got inf"),
    ]
    for kw, message in cases:
        with pytest.raises(UsageError, match=re.escape(message)):
            spec_for(**kw)


@pytest.mark.parametrize("launcher", ["mpi", "slurm", "sge", "yarn"])
def test_backends_that_do_not_restart_refuse_the_flag(launcher: str) -> None:
    with pytest.raises(UsageError, match=f"--max-restarts: --launcher {launcher} does not restart jobs"):
        spec_for(launcher, max_restarts=1)
    spec_for(launcher, max_restarts=0)  # the default is fine everywhere


def test_bad_flags_exit_2_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process, as ``launchkit`` runs them (``main``): exit 2 and the reason, nothing started."""
    for flags, text in [
        (["--max-restarts", "-2"], "'--max-restarts': -2: expected a number from 0 to"),  # the CLI's rule
        (["--max-restarts", "two"], "Invalid value for '--max-restarts'"),
        (["--restart-backoff", "-1"], "'--restart-backoff': -1.0: expected a number from 0 to"),
        (["--restart-backoff", "86401"], "--restart-backoff must be from 0"),
        (["--max-restarts", "1", "--launcher", "mpi"], "--launcher mpi does not restart jobs"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(["launch", "-n", "1", *flags, "true"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and text in " ".join(err.split()), (flags, err)


def test_dry_run_says_what_a_restart_would_do() -> None:
    res = run(
        [
            "launch",
            "-n",
            "1",
            "--launcher",
            "local",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0.5",
            "--dry-run",
            "true",
        ]
    )
    assert res.returncode == 0, res.stderr
    assert "starts again up to 2 times, 0.5 s after the failed attempt ended" in res.stdout
    res = run(["launch", "-n", "1", "--launcher", "local", "--dry-run", "--json", "true"])
    assert json.loads(res.stdout)["max_restarts"] == 0
    assert "starts again" not in res.stdout


def test_every_process_gets_the_attempt_and_cannot_override_it() -> None:
    plan = make_plan(
        LaunchSpec(num_workers=2, num_servers=1, command=("x",), env=(("LAUNCHKIT_RESTART_COUNT", "9"),)),
        job_id="j",
        secret="s",
        root_uri="127.0.0.1",
        root_port=1,
        restart_count=2,
    )
    for t in plan.tasks:
        assert t.env[dmlc_env.LAUNCHKIT_RESTART_COUNT] == "2"
        assert dmlc_env.NodeEnv.from_environ(t.env).restart_count == 2
    first = make_plan(LaunchSpec(1, 0, ("x",)), job_id="j", secret="s", root_uri="h", root_port=1)
    assert {t.env[dmlc_env.LAUNCHKIT_RESTART_COUNT] for t in first.tasks} == {"0"}


def test_records_keep_the_attempt_and_old_records_read_as_attempt_0() -> None:
    old = {"id": "j", "name": "n", "backend": "local", "cwd": "/", "launcher_pid": 1, "started_at": 1.0}
    rec = JobRecord.from_json(old)
    assert (rec.attempt, rec.max_restarts) == (0, 0)
    again = JobRecord.from_json(json.loads(json.dumps({**old, "attempt": 2, "max_restarts": 3})))
    assert (again.attempt, again.max_restarts) == (2, 3)
    assert again.to_json()["attempt"] == 2
    with pytest.raises(ValueError, match="field 'attempt': expected a whole number"):
        JobRecord.from_json({**old, "attempt": "1"})


# -- real jobs on this machine --------------------------------------------------------------------


def attempts_of(stdout: str) -> list[dict[tuple[str, int], dict]]:
    """The JSON lines REPORT printed, grouped by attempt."""
    by: dict[str, dict[tuple[str, int], dict]] = {}
    for line in stdout.splitlines():
        for key, value in parse_prefixed(line).items():
            by.setdefault(value["attempt"], {})[key] = value
    return [by[k] for k in sorted(by)]


def test_a_job_failing_once_is_restarted_with_a_new_port_and_the_same_identity(
    launchkit_home, tmp_path: Path
) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0.2",
            "sh",
            "-c",
            fail_first(tmp_path, 4),
        ]
    )
    assert res.returncode == 0, res.stderr
    first, second = attempts_of(res.stdout)
    assert len(first) == len(second) == 4  # every process of both attempts ran (none of a third)
    assert {v["attempt"] for v in first.values()} == {"0"} and {v["attempt"] for v in second.values()} == {
        "1"
    }
    ports = [{v["port"] for v in a.values()} for a in (first, second)]
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1]
    assert len({v["job"] for a in (first, second) for v in a.values()}) == 1
    assert len({v["secret"] for a in (first, second) for v in a.values()}) == 1
    job = next(iter(first.values()))["job"]
    assert re.search(
        rf"job {job}: attempt 1 failed \(\w+ \d exit 3\); restarting in 0\.2 s \(attempt 2 of 3\)", res.stderr
    ), res.stderr
    assert f"job {job} finished (attempt 2, after 1 restart)" in res.stderr
    rec = record(launchkit_home, job)
    assert (rec["attempt"], rec["max_restarts"], rec["state"], rec["exit_code"]) == (1, 2, "succeeded", 0)
    assert next(iter(second.values()))["secret"] not in res.stderr
    ps = run(["ps", "--all"], env={**os.environ, "COLUMNS": "200"})
    assert re.search(r"state\W+attempt", ps.stdout) and re.search(rf"{job}.*succeeded\W+2/3", ps.stdout), (
        ps.stdout
    )
    assert pids_with_job(job) == []


def test_a_job_that_always_fails_ends_with_the_last_attempts_code(launchkit_home) -> None:
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0",
            "sh",
            "-c",
            ALWAYS_FAIL,
        ]
    )
    assert res.returncode == 12, res.stderr  # attempt 2 (the third) exited 10 + 2
    assert res.stderr.count("restarting in") == 2
    assert "failed (attempt 3, after 2 restarts): worker 0 on localhost exited with code 12" in res.stderr
    rec = record(launchkit_home, wait_for_job(launchkit_home))
    assert (rec["attempt"], rec["state"], rec["exit_code"]) == (2, "failed", 12)
    assert pids_with_job(rec["id"]) == []


def test_without_max_restarts_a_failure_ends_the_job(launchkit_home) -> None:
    res = run(["launch", "-n", "1", "-s", "0", "sh", "-c", ALWAYS_FAIL])
    assert res.returncode == 10 and "restarting" not in res.stderr, res.stderr
    assert record(launchkit_home, wait_for_job(launchkit_home))["attempt"] == 0


def test_the_time_limit_counts_over_every_attempt(launchkit_home) -> None:
    # each attempt fails after 0.4 s; alone, six attempts would take over 3 s and end with 15
    script = 'if [ "$DMLC_ROLE" = worker ]; then sleep 0.4; exit $((10 + LAUNCHKIT_RESTART_COUNT)); fi; exec sleep 30'
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--max-restarts",
            "5",
            "--restart-backoff",
            "0.3",
            "--time-limit",
            "1.2",
            "sh",
            "-c",
            script,
        ]
    )
    assert res.returncode == 124, res.stderr
    assert 1 <= res.stderr.count("restarting in") < 5, res.stderr
    rec = record(launchkit_home, wait_for_job(launchkit_home))
    assert rec["ended_at"] - rec["started_at"] < 3.0, rec  # the job's own time: no interpreter start-up
    assert (rec["state"], rec["exit_code"]) == ("timed out", 124) and rec["attempt"] < 5
    assert pids_with_job(rec["id"]) == []


class UnreachableOnRestart(LocalBackend):
    """The local backend, whose hosts cannot be reached any more when the job restarts."""

    connected = 0

    def connect(self, spec: LaunchSpec) -> str | None:
        self.connected += 1
        if self.connected > 1:
            raise BackendError("ssh", "1 of 1 host(s) unreachable, nothing started: node9: timed out")
        return None


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_restart_that_cannot_start_ends_the_launch_and_its_record(launchkit_home) -> None:
    spec = LaunchSpec(1, 0, ("sh", "-c", "exit 3"), max_restarts=2, restart_backoff=0.0)
    with pytest.raises(BackendError, match="node9: timed out"):
        launching.run_job(spec, UnreachableOnRestart(), Ui())
    (job,) = job_ids(launchkit_home)
    rec = record(launchkit_home, job)
    assert (rec["attempt"], rec["state"], rec["exit_code"]) == (1, "failed", 1)


def running_job(home: Path, proc: subprocess.Popen[str], count: int, attempt: int = 0) -> str:
    """The job id once its record lists ``count`` started processes of ``attempt``."""
    job = wait_for_job(home)

    def started() -> bool:
        rec = record(home, job)
        return rec["attempt"] == attempt and len([p for p in rec["processes"] if p["pid"]]) == count

    assert wait_until(started, 15), (record(home, job), proc.poll())
    assert wait_until(lambda: len(pids_with_job(job)) >= count, 10)
    return job


def ended_within(proc: subprocess.Popen[str], seconds: float) -> tuple[int, str]:
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the launcher did not end within {seconds}s:\n{err}")
    assert time.monotonic() - t0 < seconds, err
    return proc.returncode, err


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_an_attempt_is_not_restarted(launchkit_home, sig: int, code: int) -> None:
    proc = start(
        ["launch", "-n", "1", "-s", "1", "--max-restarts", "3", "--grace-period", "2", "sh", "-c", SLEEP]
    )
    job = running_job(launchkit_home, proc, 3)
    proc.send_signal(sig)
    rc, err = ended_within(proc, 10)  # the processes end at SIGTERM: well before the 30 s sleep
    assert rc == code and "restarting" not in err, err
    rec = record(launchkit_home, job)
    assert (rec["attempt"], rec["state"], rec["exit_code"]) == (0, "interrupted", code), (rec, err)
    assert pids_with_job(job) == [], err


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "launchkit kill"])
def test_a_signal_during_the_backoff_ends_the_launch_at_once(launchkit_home, how: str) -> None:
    proc = start(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--max-restarts",
            "3",
            "--restart-backoff",
            "60",
            "sh",
            "-c",
            ALWAYS_FAIL,
        ]
    )
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: record(launchkit_home, job)["attempt"] == 1, 15), record(launchkit_home, job)
    assert record(launchkit_home, job)["state"] == "running"  # waiting to restart
    killer = start(["kill", job]) if how == "launchkit kill" else None
    if killer is None:
        proc.send_signal(signal.Signals[how])
    rc, err = ended_within(proc, 6 if killer else 3)  # `launchkit kill`'s own start-up counts here
    sig = signal.SIGTERM if killer else signal.Signals[how]
    assert rc == 128 + sig, err
    assert f"received {sig.name}: no restart" in err
    assert err.count("restarting in") == 1 and err.count("1 worker on local") == 1  # no second start
    if killer is not None:
        _, kill_err = killer.communicate(timeout=10)
        assert killer.returncode == 0, kill_err
    rec = record(launchkit_home, job)
    assert (rec["state"], rec["exit_code"]) == ("killed" if killer else "interrupted", 128 + sig)
    assert rec["attempt"] == 0  # the attempt that ran: the second never started (it said 2/4; issue 40)
    assert pids_with_job(job) == []


def test_a_signal_during_a_failures_teardown_is_not_restarted(launchkit_home, tmp_path: Path) -> None:
    # worker 0 fails once both are seen running (GO); worker 1 ignores SIGTERM, so the teardown
    # lasts the grace period
    script = (
        f'if [ "$LAUNCHKIT_ROLE_RANK" = 0 ]; then {until_exists_sh(tmp_path / "go")}; exit 3; fi; '
        'trap "" TERM; exec sleep 30'
    )
    proc = start(
        ["launch", "-n", "2", "-s", "0", "--max-restarts", "3", "--grace-period", "4", "sh", "-c", script]
    )
    job = running_job(launchkit_home, proc, 2)
    (tmp_path / "go").touch()
    # worker 0 has failed, worker 1 is still there (in the grace period)
    assert wait_until(lambda: len(pids_with_job(job)) == 1, 5)
    proc.send_signal(signal.SIGINT)
    rc, err = ended_within(proc, 8)
    assert rc == 3 and "restarting" not in err, err  # the failure is the root cause; no restart
    assert record(launchkit_home, job)["attempt"] == 0
    assert pids_with_job(job) == []


def test_launchkit_kill_is_not_restarted(launchkit_home) -> None:
    proc = start(
        ["launch", "-n", "2", "-s", "1", "--max-restarts", "3", "--restart-backoff", "0", "sh", "-c", SLEEP]
    )
    job = running_job(launchkit_home, proc, 4)
    killer = start(["kill", job])  # reaping the launcher here meanwhile: a zombie would look alive to it
    rc, err = ended_within(proc, 10)
    out, kill_err = killer.communicate(timeout=10)
    assert killer.returncode == 0 and f"{job}: ended" in out, kill_err
    assert rc == 143 and "restarting" not in err, err
    rec = record(launchkit_home, job)
    assert (rec["attempt"], rec["state"]) == (0, "killed")
    assert pids_with_job(job) == []


# -- over ssh (a real sshd on loopback) -------------------------------------------------------------


def test_ssh_job_is_restarted_on_its_host(sshd_loopback, tmp_path: Path, launchkit_home) -> None:  # noqa: F811
    hostfile = tmp_path / "hosts"
    hostfile.write_text(sshd_loopback.hostfile_line() + "\n")
    res = run(
        [
            "launch",
            "-H",
            str(hostfile),
            "-i",
            str(sshd_loopback.identity),
            "--known-hosts",
            str(tmp_path / "known_hosts"),
            "-n",
            "1",
            "-s",
            "1",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "0",
            "sh",
            "-c",
            fail_first(tmp_path, 3),
        ],
        cwd="/",
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    first, second = attempts_of(res.stdout)
    assert sorted(first) == sorted(second) == [("scheduler", 0), ("server", 0), ("worker", 0)]
    assert {v["port"] for v in first.values()} != {v["port"] for v in second.values()}
    assert len({v["secret"] for a in (first, second) for v in a.values()}) == 1
    job = next(iter(first.values()))["job"]
    assert "attempt 1 failed" in res.stderr and "(attempt 2 of 2)" in res.stderr
    rec = record(launchkit_home, job)
    assert (rec["attempt"], rec["state"]) == (1, "succeeded")
    assert pids_with_job(job) == []  # the loopback host is this machine: nothing of the job is left


def test_restart_delay_waits_for_a_lost_hosts_watchdog() -> None:
    task = Task("worker", 1, 2, Host("node2"), 0, ("x",))
    lost = JobResult(
        "j", 255, (TaskResult(task, 255, None, 0.0),), root_cause=TaskResult(task, 255, None, 0.0)
    )
    failed = result(3)
    assert restart_delay(1.0, failed, 13.0) == 1.0
    assert restart_delay(1.0, lost, 13.0) == 13.0 and restart_delay(20.0, lost, 13.0) == 20.0
    assert restart_delay(1.0, lost, None) == 1.0  # no watchdogs (local)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_lost_host_is_restarted_after_its_watchdog_ended(
    netns_hosts,  # noqa: F811
    launchkit_home,
    tmp_path: Path,
) -> None:
    """Host 2's link goes down, the launcher loses that host and restarts the job once the link is
    back: the restart waits until host 2's old watchdog (cut off, so never told to end) has ended the
    job there by itself, then runs on both hosts to the end."""
    group = netns_hosts(2)
    hostfile = group.write_hostfile(tmp_path / "hosts")
    script = 'test "$LAUNCHKIT_RESTART_COUNT" -ge 1 || exec sleep 60; sleep 1; echo "survived $DMLC_ROLE"'
    proc = start(
        [
            "launch",
            "-H",
            str(hostfile),
            "-i",
            str(group.identity),
            "--known-hosts",
            str(group.known_hosts),
            "-n",
            "2",
            "-s",
            "0",
            "--heartbeat-timeout",
            "1",
            "--grace-period",
            "1",
            "--max-restarts",
            "1",
            "--restart-backoff",
            "0",
            "sh",
            "-c",
            script,
        ],
        cwd="/",
    )
    job = running_job(launchkit_home, proc, 2)  # the two workers (no scheduler without servers)
    assert wait_until(lambda: group[1].pids_with_env(f"LAUNCHKIT_JOB_ID={job}"), 10)
    subprocess.run(["ip", "link", "set", group[1].veth, "down"], check=True)
    try:
        assert wait_until(lambda: record(launchkit_home, job)["attempt"] == 1, 15), proc.poll()
    finally:
        subprocess.run(["ip", "link", "set", group[1].veth, "up"], check=True)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "attempt 1 failed (worker 1 exit 255); restarting in 5 s (a host was lost" in err, err
    assert "[worker 1] survived worker" in out and "[worker 0] survived worker" in out, (out, err)
    assert pids_with_job(job) == [] and not group[1].pids_with_env(f"LAUNCHKIT_JOB_ID={job}")


# -- the digits example: a worker killed mid-training resumes from its checkpoint -----------------

EPOCH = re.compile(r"\[worker 0\] epoch\s+(\d+)\s+loss \S+\s+test accuracy ([\d.]+)%")
DIGITS = ("--epochs", "8", "--hidden", "32", "--batch-size", "2")


def digits(checkpoint: Path, seed: int, *flags: str) -> list[str]:
    return [
        "launch",
        "-n",
        "2",
        "-s",
        "1",
        *flags,
        sys.executable,
        "examples/train_digits.py",
        *DIGITS,
        "--seed",
        str(seed),
        "--checkpoint",
        str(checkpoint),
        "--resume",
    ]


def epochs(out: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(2))) for m in EPOCH.finditer(out)]


def worker_pid(home: Path, job: str, rank: int) -> int | None:
    procs = record(home, job)["processes"]
    return next((p["pid"] for p in procs if (p["role"], p["rank"]) == ("worker", rank)), None)


def kill_mid_training(home: Path, tmp: Path, seed: int) -> tuple[str, float]:
    """Run the example with a restart; SIGKILL worker 1 once the first checkpoint exists. The
    output, and the seconds from the kill until the second attempt's processes had started."""
    ck = tmp / f"killed-{seed}.npz"
    before = set(job_ids(home))
    proc = start(digits(ck, seed, "--max-restarts", "1", "--restart-backoff", "0.2"), cwd=REPO)
    try:
        assert wait_until(lambda: set(job_ids(home)) - before, 30)
        (job,) = set(job_ids(home)) - before
        assert wait_until(ck.exists, 60, interval=0.005), proc.poll()
        pid = worker_pid(home, job, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_until(lambda: record(home, job)["attempt"] == 1 and worker_pid(home, job, 1), 30)
        restarted = time.monotonic() - killed
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "attempt 1 failed (worker 1 exit 137, signal 9); restarting in 0.2 s" in err, err
    assert record(home, job)["state"] == "succeeded" and pids_with_job(job) == []
    return out, restarted


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_worker_resumes_from_its_checkpoint_to_the_uninterrupted_accuracy(
    launchkit_home, tmp_path: Path
) -> None:
    straight = run(digits(tmp_path / "straight.npz", 1), cwd=REPO, timeout=60)
    assert straight.returncode == 0, straight.stderr
    out, restarted = kill_mid_training(launchkit_home, tmp_path, 1)
    first, resumed_at, second = out.partition("resumed at epoch ")
    assert resumed_at, out
    at = int(second.split()[0].rstrip(","))
    # killed mid-training: after the first checkpoint, before the last epoch; the restart trained on
    # from the checkpoint, not from scratch
    assert 1 <= at < 8 and max(e for e, _ in epochs(first)) < 8, out
    assert [e for e, _ in epochs(second)] == list(range(at + 1, 9)), out
    final, expected = epochs(second)[-1][1], epochs(straight.stdout)[-1][1]
    assert abs(final - expected) <= 0.5, (final, expected)
    print(
        f"accuracy uninterrupted {expected:.2f}% restarted {final:.2f}% (resumed at epoch {at}); "
        f"kill to restart {restarted:.2f}s"
    )
