"""Elastic jobs end to end: ``launchkit launch -n MIN:MAX`` running trainer_core workers
(``tests/trainer_core/elastic_launchjob.py``: torch and ``hvd.elastic``). A worker SIGKILLed
mid-training is a change of membership: the launcher keeps the survivors (they reported the
in-process figure), trainer_core's scheduler drops the worker, and the others re-form and train on
in their own processes from their last commit, with no step counted twice; the job ends with 0
and ``launchkit ps JOB_ID`` shows the change. Through the parameter server
(``tests/trainer_core/elastic_launchps.py``, ``-s 1``): the sync rounds close with the survivors'
pushes, and the worker the launcher starts after the host's cool-down joins them (also when it
registers before the scheduler has dropped the lost one: it waits), ending with the others'
parameters; in restart mode (workers that report nothing to the launcher) the group starts
again and its workers take the server's values."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from tests.launchkit.procs import pids_with_job, record, run, start, wait_for_job, wait_until

PROG = str(Path(__file__).with_name("elastic_launchjob.py"))
WAIT = 120.0  # seconds for an event on a loaded machine (waits for events, never sleeps)
TIMEOUT = 6.0  # PS_HEARTBEAT_TIMEOUT: a worker importing torch on a loaded machine is slow
HEARTBEAT = ("PS_HEARTBEAT_INTERVAL:0.2", f"PS_HEARTBEAT_TIMEOUT:{TIMEOUT}", "PS_START_TIMEOUT:90")


def steps(out: Path, index: int) -> list[dict]:
    f = out / f"steps-{index}"
    if not f.exists():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]


def reported(out: Path, indices: range) -> bool:
    """Every worker trained for 2 s: its first metrics report (the in-process figure, sent when
    its group or store was made, at most one report a second) has reached the launcher."""
    return all((s := steps(out, i)) and s[-1]["t"] - s[0]["t"] > 2 for i in indices)


def launch(out: Path, bounds: str, servers: int, *flags: str) -> list[str]:
    envs = [a for e in (f"OUT:{out}", *HEARTBEAT) for a in ("--env", e)]
    head = ["launch", "-n", bounds, "-s", str(servers), "--no-dashboard", "--grace-period", "2"]
    return [*head, *envs, *flags, sys.executable, PROG]


def finish(proc, out: Path) -> tuple[str, str]:
    (out / "stop").write_text("")
    try:
        return proc.communicate(timeout=WAIT)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


@pytest.mark.timeout(400)
def test_a_sigkilled_worker_leaves_and_the_others_train_on_in_their_processes(
    tmp_path: Path, launchkit_home: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # (a long cool-down: the job stays at 3 and nothing joins meanwhile)
    proc = start(launch(out, "2:4", 0, "--blacklist-cooldown", "600"), cwd=tmp_path)
    try:
        assert wait_until(lambda: all(len(steps(out, i)) >= 3 for i in range(4)), WAIT), proc.pid
        assert wait_until(lambda: reported(out, range(4)), WAIT)
        pids = {i: int((out / f"pid-{i}").read_text()) for i in range(4)}
        os.kill(pids[2], signal.SIGKILL)
        killed_at = time.time()
        survivors = (0, 1, 3)
        assert wait_until(lambda: all(any(s["size"] == 3 for s in steps(out, i)) for i in survivors), WAIT)
        at3 = {i: [s for s in steps(out, i) if s["size"] == 3] for i in survivors}
        assert wait_until(
            lambda: all(len([s for s in steps(out, i) if s["size"] == 3]) >= 3 for i in survivors), WAIT
        )
        job = wait_for_job(launchkit_home)
    finally:
        stdout, stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    first_after = min(s["t"] for i in survivors for s in at3[i])
    assert first_after - killed_at < TIMEOUT + 2, (first_after - killed_at, stderr)
    results = {
        r["me"]: r
        for r in (json.loads(x.split("RESULT ", 1)[1]) for x in stdout.splitlines() if "RESULT " in x)
    }
    assert set(results) == {"0", "1", "3"}, stdout
    for i in survivors:
        assert results[str(i)]["pid"] == pids[i]  # kept its process
        assert results[str(i)]["size"] == 3
        got = [s["step"] for s in steps(out, i)]
        assert got == sorted(set(got)), got  # no step counted twice
    assert results["0"]["params"] == results["1"]["params"] == results["3"]["params"]
    assert results["0"]["steps"] == results["1"]["steps"] == results["3"]["steps"]
    assert "epoch 1; left: worker 2 on localhost (signal 9); in process" in stderr, stderr
    assert not pids_with_job(job)
    shown = run(["ps", job], cwd=tmp_path)
    assert shown.returncode == 0 and "left: worker 2 on localhost (signal 9)" in shown.stdout, shown
    assert record(launchkit_home, job)["changes"][0]["epoch"] == 1


PS_PROG = str(Path(__file__).with_name("elastic_launchps.py"))


def ps_job_losing_worker_2(
    tmp_path: Path, launchkit_home: Path, cooldown: str, after_kill: Callable[[Path], None]
) -> tuple[dict[int, int], str, str, dict[str, dict], list[int], str]:
    """A ``-s 1 -n 2:3`` job of ``PS_PROG`` whose worker 2 is SIGKILLed once every worker trained
    2 s; ``after_kill(out)`` waits for what the test expects, then the job is stopped. The pids,
    the job, its output, the workers' results and worker 0's count of pushes per round."""
    out = tmp_path / "out"
    out.mkdir()
    args = launch(out, "2:3", 1, "--blacklist-cooldown", cooldown)
    args[-1] = PS_PROG
    proc = start(args, cwd=tmp_path)
    try:
        assert wait_until(lambda: all(len(steps(out, i)) >= 3 for i in range(3)), WAIT), proc.pid
        assert {s["n"] for s in steps(out, 0)[:3]} == {3}
        # (the rounds take milliseconds: train on for 2 s, past the first metrics report, which
        # tells the launcher that the workers handle a change in their processes)
        assert wait_until(lambda: reported(out, range(3)), WAIT)
        pids = {i: int((out / f"pid-{i}").read_text()) for i in range(3)}
        os.kill(pids[2], signal.SIGKILL)
        after_kill(out)
        (out / "stop").write_text("")
        job = wait_for_job(launchkit_home)
        stdout, stderr = proc.communicate(timeout=WAIT)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr
    results = {
        r["me"]: r
        for r in (json.loads(x.split("RESULT ", 1)[1]) for x in stdout.splitlines() if "RESULT " in x)
    }
    assert results["0"]["pid"] == pids[0] and results["1"]["pid"] == pids[1]
    assert "left: worker 2 on localhost (signal 9); in process" in stderr, stderr
    return pids, job, stdout, results, [s["n"] for s in steps(out, 0)], stderr


@pytest.mark.timeout(400)
def test_the_parameter_server_path_drops_a_lost_worker_and_trains_on(
    tmp_path: Path, launchkit_home: Path
) -> None:
    def survivors_go_on(out: Path) -> None:  # the rounds close with the two survivors' pushes
        assert wait_until(lambda: len([s for s in steps(out, 0) if s["n"] == 2]) >= 3, WAIT)

    # (a long cool-down: nothing joins meanwhile)
    _, job, stdout, results, counts, _ = ps_job_losing_worker_2(
        tmp_path, launchkit_home, "600", survivors_go_on
    )
    assert set(results) == {"0", "1"}, stdout
    assert counts[0] == 3 and counts[-1] == 2 and 3 not in counts[counts.index(2) :], counts
    assert results["0"]["w"] == results["1"]["w"], results
    assert not pids_with_job(job)


def ps_job_where_a_new_worker_joins(tmp_path: Path, launchkit_home: Path, cooldown: str) -> None:
    """Worker 2 SIGKILLed; the rounds close with the two survivors' pushes, then (the host's
    cool-down over) with the new worker 3's too; all end with the same parameters."""

    def a_new_worker_joins(out: Path) -> None:
        assert wait_until(lambda: any(s["n"] == 2 for s in steps(out, 0)), WAIT)
        assert wait_until(lambda: len([s for s in steps(out, 3) if s["n"] == 3]) >= 3, WAIT)
        assert wait_until(lambda: any(s["n"] == 3 and s["round"] > 3 for s in steps(out, 0)), WAIT)

    _, job, stdout, results, counts, stderr = ps_job_losing_worker_2(
        tmp_path, launchkit_home, cooldown, a_new_worker_joins
    )
    assert set(results) == {"0", "1", "3"}, stdout
    assert counts[0] == 3 and 2 in counts and counts[-1] == 3, counts  # 3, then 2, then 3 again
    # the newcomer took the server's values and then the same rounds: the same parameters at the end
    assert results["0"]["w"] == results["1"]["w"] == results["3"]["w"], results
    assert results["0"]["rounds"] == results["1"]["rounds"] > results["3"]["rounds"]
    assert "joined: worker 3 on localhost" in stderr, stderr
    assert not pids_with_job(job)


@pytest.mark.timeout(400)
def test_the_parameter_server_path_drops_a_lost_worker_and_a_new_one_joins_the_rounds(
    tmp_path: Path, launchkit_home: Path
) -> None:
    # (a cool-down past the heartbeat bound: the scheduler has dropped worker 2 when 3 comes)
    ps_job_where_a_new_worker_joins(tmp_path, launchkit_home, "10")


@pytest.mark.timeout(400)
def test_the_parameter_server_path_a_replacement_that_comes_before_the_drop_waits_for_it(
    tmp_path: Path, launchkit_home: Path
) -> None:
    # a cool-down (2 s) within the heartbeat bound (6 s): worker 3 registers while the scheduler
    # still counts worker 2, at MAX; it waits there and takes worker 2's place when it is dropped
    ps_job_where_a_new_worker_joins(tmp_path, launchkit_home, "2")


@pytest.mark.timeout(400)
def test_restart_mode_with_trainer_core_workers_starts_the_group_again_on_the_parameter_server(
    tmp_path: Path, launchkit_home: Path
) -> None:
    """A worker lost before the launcher heard from every worker that it handles a change in its
    process (here no worker reports at all) puts the job in restart mode: the survivors are stopped
    and the group starts again (restart 1 of the workers, 2 workers: the host's cool-down keeps
    the third slot). The first new worker's registration drops the stopped group at the scheduler
    (it was refused above MAX while their heartbeats had not yet timed out); the new workers take
    the server's values, train on, and the job ends with 0."""
    out = tmp_path / "out"
    out.mkdir()
    # (a heartbeat timeout far longer than a restart: the stopped group is still a member when the
    # new workers register)
    args = launch(out, "2:3", 1, "--blacklist-cooldown", "600", "--env", "TEST_NO_REPORTS:1")
    args = [a.replace(f"PS_HEARTBEAT_TIMEOUT:{TIMEOUT}", "PS_HEARTBEAT_TIMEOUT:30") for a in args]
    args[-1] = PS_PROG
    proc = start(args, cwd=tmp_path)
    try:
        assert wait_until(lambda: all(len(steps(out, i)) >= 3 for i in range(3)), WAIT), proc.pid
        pids = {i: int((out / f"pid-{i}").read_text()) for i in range(3)}
        os.kill(pids[2], signal.SIGKILL)
        assert wait_until(
            lambda: all(len([s for s in steps(out, i) if s["n"] == 2]) >= 3 for i in (3, 4)), WAIT
        )
        job = wait_for_job(launchkit_home)
    finally:
        stdout, stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    assert "restart 1 of the workers (every one started again)" in stderr, stderr
    results = {
        r["me"]: r
        for r in (json.loads(x.split("RESULT ", 1)[1]) for x in stdout.splitlines() if "RESULT " in x)
    }
    assert set(results) == {"3", "4"}, stdout  # the first group was stopped (SIGTERM)
    assert results["3"]["w"] == results["4"]["w"], results
    assert not pids_with_job(job)
