"""``launch --detach`` records the job before it submits it: ``ps`` and ``kill`` see it while the
engine's submitter runs, and a failed submission leaves a record that says so. The engine here
is a stand-in ``sbatch`` (and ``scancel``) on PATH; the real engines are in tests/cluster/."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from launchkit.jobs import records as jobs
from tests.launchkit.procs import fake_engine, job_ids, run, start, until_exists_sh, wait_until

pytestmark = pytest.mark.proc


def _tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def _engine_env(tmp_path: Path, release: Path, cancelled: Path) -> dict[str, str]:
    """A Slurm whose sbatch answers (job 4242) only once ``release`` exists, and whose scancel
    notes its arguments in ``cancelled``; no scontrol (the job's state is never asked here)."""
    env = fake_engine(tmp_path / "bin", "sbatch", "")  # (the PATH and an environment outside an allocation)
    _tool(tmp_path / "bin", "sbatch", f"cat >/dev/null\n{until_exists_sh(release)}\necho 4242")
    _tool(tmp_path / "bin", "scancel", f'echo "$@" > {shlex.quote(str(cancelled))}')
    return env


def _shown(env: dict[str, str]) -> dict[str, str]:
    res = run(["ps", "--all", "--json"], env=env)
    assert res.returncode == 0, res.stderr
    return {j["id"]: j["shown_state"] for j in json.loads(res.stdout)}


def test_a_job_being_submitted_is_listed_and_recorded_once_submitted(tmp_path: Path, launchkit_home) -> None:
    release, cancelled = tmp_path / "release", tmp_path / "cancelled"
    env = _engine_env(tmp_path, release, cancelled)
    proc = start(
        ["launch", "--launcher", "slurm", "-n", "1", "-s", "0", "--detach", "true"], cwd=tmp_path, env=env
    )
    try:
        assert wait_until(lambda: bool(job_ids(launchkit_home)), 30), "no record before the submission"
        job = job_ids(launchkit_home)[0]
        assert _shown(env)[job] == "submitting"
        assert job in run(["ps"], env=env).stdout  # listed without --all: it is under way
        logs = run(["logs", job], env=env)  # (it said 'kept no output (a job of an older launchkit ...)')
        assert logs.returncode == 0 and "is being submitted (slurm): it has no output yet" in logs.stderr
        release.touch()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == job
    record = jobs.JobRecord.from_json(json.loads((launchkit_home / "jobs" / f"{job}.json").read_text()))
    assert record.state == "running" and (record.remote or {})["engine_job"] == "4242"
    assert not record.submitting


def test_kill_during_the_submission_waits_for_it_and_cancels_the_engines_job(
    tmp_path: Path, launchkit_home
) -> None:
    release, cancelled = tmp_path / "release", tmp_path / "cancelled"
    env = _engine_env(tmp_path, release, cancelled)
    proc = start(
        ["launch", "--launcher", "slurm", "-n", "1", "-s", "0", "--detach", "true"], cwd=tmp_path, env=env
    )
    try:
        assert wait_until(lambda: bool(job_ids(launchkit_home)), 30), "no record before the submission"
        job = job_ids(launchkit_home)[0]
        killer = start(["kill", job], env=env)
        # kill waits for the submission (it does not end the submitter, whose job would run on unnamed)
        assert wait_until(lambda: killer.poll() is not None, 1.0) is False
        release.touch()
        kill_out, kill_err = killer.communicate(timeout=30)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert killer.returncode == 0, kill_err
    assert proc.returncode == 0  # the submission itself succeeded
    assert cancelled.read_text().split() == ["4242"], kill_out
    assert _shown(env)[job] == "killed"


def test_a_failed_submission_leaves_a_record_that_says_so(tmp_path: Path, launchkit_home) -> None:
    env = fake_engine(
        tmp_path / "bin", "sbatch", "sbatch: error: Batch job submission failed: Invalid account\n"
    )
    res = run(
        ["launch", "--launcher", "slurm", "-n", "1", "-s", "0", "--detach", "true"], cwd=tmp_path, env=env
    )
    assert res.returncode == 2, res.stderr
    assert "Invalid account" in res.stderr and "Traceback" not in res.stderr
    [job] = job_ids(launchkit_home)
    assert _shown(env)[job] == "not submitted"
    data = json.loads((launchkit_home / "jobs" / f"{job}.json").read_text())
    assert data["exit_code"] == 2 and data["ended_at"] is not None
    listed = run(["ps"], env=env)
    assert job not in listed.stdout  # finished: only with --all
    assert "not submitted" in run(["ps", "--all"], env={**env, "COLUMNS": "200"}).stdout
