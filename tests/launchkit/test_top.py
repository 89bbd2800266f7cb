"""``launchkit top JOB_ID`` and ``launchkit ps`` from another terminal: the job's live file gives
the same view as the launching terminal; without one (or with a bad one), the record's rows."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading

from launchkit.jobs import live
from launchkit.jobs import records as jobs
from tests.launchkit import dashstates
from tests.launchkit.procs import PROG, run, start, until_exists_sh, wait_for_job, wait_until


def running_record(job_id: str) -> jobs.JobRecord:
    """A record of a job whose launcher is this test process (so it shows as running)."""
    rec = jobs.started_here(
        id=job_id,
        name="train_digits",
        backend="local",
        hosts=("localhost",),
        command=("python",),
        cwd="/",
        processes=tuple(jobs.ProcessRecord(r.role, r.rank, r.host, r.pid) for r in dashstates.rows()),
    )
    jobs.save(rec)
    return rec


def test_top_shows_the_live_files_view() -> None:
    state = dashstates.healthy(slow_rank=1)
    running_record(state.job_id)
    live.write(state)
    res = run(["top", state.job_id, "--once"])
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "train_digits 1122-000000-abcdef  local  0:01:0" in out and "4 running" in out
    for words in (
        ("loss", "0.06"),
        ("accuracy", "0.99"),
        ("samples/s", "480"),
        ("compression", "16.0x"),
        ("slowest", "worker 1", "step 150, median 225"),
        ("localhost", "1.5", "3.0/8.0", "2.00", "1.00"),
        ("worker", "1", "localhost", "103", "running", "53%", "103.0 MiB", "worker 1 line"),
        ("[worker 0] epoch 1 loss 0.51",),
    ):
        assert any(all(w in line for w in words) for line in out.splitlines()), (words, out)


def test_top_of_a_finished_job_shows_its_last_frame_and_how_it_ended() -> None:
    state = dashstates.failed()
    rec = running_record(state.job_id)
    jobs.finish(rec, "failed", 3)
    live.write(state)
    out = run(["top", state.job_id, "--once"]).stdout
    assert "root cause: worker 1 on localhost (exit 3), its last lines" in out
    assert "ValueError: the data went bad" in out
    assert "job failed (exit 3)" in out
    assert "0:00:12" in out  # the elapsed time stops with the job


def test_a_bad_live_file_falls_back_to_the_record() -> None:
    state = dashstates.healthy()
    running_record(state.job_id)
    live.path(state.job_id).parent.mkdir(parents=True, exist_ok=True)
    live.path(state.job_id).write_text('{"version": 1, "written_at": 1')
    res = run(["top", state.job_id, "--once"])
    assert res.returncode == 0
    assert "cannot use the job's live file" in res.stderr and "not valid JSON" in res.stderr
    assert "training" not in res.stdout and "scheduler" in res.stdout  # the record's rows


def test_a_succeeded_job_whose_live_file_was_cut_short_shows_its_processes_ok() -> None:
    """Was '4 ended' (the word for processes the launcher ended) for a job that succeeded."""
    state = dashstates.healthy()
    rec = running_record(state.job_id)
    jobs.finish(rec, "succeeded", 0)
    live.path(state.job_id).parent.mkdir(parents=True, exist_ok=True)
    live.path(state.job_id).write_text(live.encode(state, 1.0)[:40])
    res = run(["top", state.job_id, "--once"])
    assert res.returncode == 0, res.stderr
    assert "cannot use the job's live file" in res.stderr and "cut short?" in res.stderr
    assert "4 ok" in res.stdout and "ended" not in res.stdout, res.stdout
    assert "job succeeded" in res.stdout


def test_ps_shows_the_latest_step_and_loss() -> None:
    state = dashstates.healthy()
    running_record(state.job_id)
    live.write(state)
    res = run(["ps"])
    assert res.returncode == 0, res.stderr
    header, row = (
        line.replace("┃", " ").replace("│", " ").split() for line in res.stdout.splitlines()[::2][:2]
    )
    assert header[-2:] == ["step", "loss"]
    assert row[0] == state.job_id and row[-2:] == ["300", "0.06952"]
    (doc,) = json.loads(run(["ps", "--json"]).stdout)
    assert doc["step"] == 300 and abs(doc["loss"] - 0.0695) < 1e-3


def both_ready(job_id: str) -> bool:
    view, _ = live.read(job_id)
    lines = set(view.state.log) if view is not None else set()
    return {(f"worker {r}", "ready") for r in (0, 1)} <= lines


def test_top_of_a_real_job_shows_its_output_from_another_terminal(launchkit_home) -> None:
    proc = start(["launch", "-n", "2", "-s", "0", sys.executable, PROG, "wait"])
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: both_ready(job), 10)  # both, not the first one's line alone
        res = run(["top", job, "--once"])
        assert res.returncode == 0, res.stderr
        assert "[worker 1] ready" in res.stdout and "2 running" in res.stdout  # no scheduler: -s 0
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    res = run(["top", job, "--once"])
    assert "job interrupted" in res.stdout and "2 ended" in res.stdout


def test_top_of_a_failed_job_shows_its_root_cause_from_the_live_file(launchkit_home) -> None:
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--grace-period",
            "1",
            sys.executable,
            PROG,
            "fail",
            "worker",
            "1",
            "3",
        ]
    )
    assert res.returncode == 3
    job = wait_for_job(launchkit_home)
    out = run(["top", job, "--once"]).stdout
    assert "root cause: worker 1 on localhost (exit 3), its last lines" in out
    assert "worker 1 is failing" in out and "job failed (exit 3)" in out


def test_top_of_a_lost_job_does_not_show_its_processes_running() -> None:
    # the launcher died (SIGKILL) with the live file saying 4 running at 50-53% CPU
    state = dashstates.healthy()
    rec = running_record(state.job_id)
    assert rec.launcher_start is not None
    # the launcher's pid, now another process's (another start time): the launcher is gone
    rec = dataclasses.replace(rec, launcher_start=rec.launcher_start - 1)
    jobs.save(rec)
    live.write(state)
    res = run(["top", state.job_id, "--once"])
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "job lost" in out and "4 lost" in out and "running" not in out
    rows = [line for line in out.splitlines() if "line" in line and "localhost" in line]
    assert len(rows) == 4 and all("lost" in r and "%" not in r and "MiB" not in r for r in rows), out


def test_top_where_it_cannot_draw_prints_frames_as_they_come(launchkit_home, tmp_path) -> None:
    # a pipe (as TERM=dumb): a frame at each refresh while the job runs, not one at its end
    go = tmp_path / "go"
    proc = start(["launch", "-n", "1", "-s", "0", "--launcher", "local", "sh", "-c", until_exists_sh(go)])
    try:
        job = wait_for_job(launchkit_home)
        top = start(["top", job, "--interval", "0.2"])
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(top.stdout or ()), daemon=True)
        reader.start()
        frames = lambda: sum(line.startswith("╭─ launchkit") for line in list(lines))  # noqa: E731
        assert wait_until(lambda: frames() >= 2, 15), lines
        assert proc.poll() is None  # two frames while the job still runs
        go.touch()
        assert top.wait(timeout=20) == 0
        reader.join(timeout=10)
        assert "job succeeded" in "".join(lines).split("╭─ launchkit")[-1]
    finally:
        go.touch()
        proc.communicate(timeout=20)
