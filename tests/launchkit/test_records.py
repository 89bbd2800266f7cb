"""Job records on disk that are not records (empty, truncated, another JSON shape, a field of
the wrong type): each is skipped with a warning naming the file, and ``ps``, ``kill``, ``top``
and ``logs`` keep working for every other job (the real CLI in a subprocess)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from launchkit.errors import UsageError
from launchkit.jobs import records as jobs
from launchkit.jobs.history import Change
from tests.launchkit.procs import pids_with_job, run, wait_until

GOOD = "1123-040000-aaaaaa"


def good_record(job_id: str = GOOD) -> jobs.JobRecord:
    return jobs.JobRecord(
        id=job_id,
        name="train",
        backend="local",
        hosts=("localhost",),
        command=("python", "train.py"),
        cwd="/tmp",
        launcher_pid=2**22 + 7,
        launcher_start=1,
        started_at=1.0e9,
        state="succeeded",
        ended_at=1.0e9 + 5,
        exit_code=0,
        processes=(jobs.ProcessRecord("worker", 0, "localhost", 2**22 + 9),),
    )


def good_json(**changes: object) -> str:
    data = json.loads(json.dumps(dataclasses.asdict(good_record())))
    data.update(changes)
    return json.dumps(data)


BAD = {  # job id -> (file content, what the warning says)
    "bad-list": ("[1, 2]", "expected a JSON object, got a list"),
    "bad-empty": ("", "empty file: expected a JSON job record"),
    "bad-truncated": (good_json(id="bad-truncated")[:70], "not valid JSON (cut short?): Expecting value: line 1 column 71 (char 70)"),
    "bad-started": (good_json(id="bad-started", started_at="yesterday"),
                    "field 'started_at': expected a number, got a string \"yesterday\""),
    "bad-hosts": (good_json(id="bad-hosts", hosts=5), "field 'hosts': expected a list, got a whole number 5"),
    "bad-procs": (good_json(id="bad-procs", processes=[1]), "field 'processes[0]': expected an object"),
    "bad-pid": (good_json(id="bad-pid", launcher_pid=True), "field 'launcher_pid': expected a whole number, got true"),
    "bad-remote": (good_json(id="bad-remote", state="running", remote={"hosts": ["-oProxyCommand=x"]}),
                   "field 'remote.hosts[0]': bad host name '-oProxyCommand=x'"),
    "bad-missing": ('{"id": "bad-missing"}', "missing field(s) 'name', 'backend', 'cwd', 'launcher_pid', 'started_at'"),
    "bad-id": (good_json(), "field 'id': '1123-040000-aaaaaa' is not the file's job id 'bad-id'"),
    "bad name": (good_json(), "the name is not a job id (letters, digits, '.', '_', '-')"),
}  # fmt: skip


@pytest.fixture
def jobs_dir(launchkit_home: Path) -> Path:
    jobs.save(good_record())
    d = launchkit_home / "jobs"
    for job_id, (text, _) in BAD.items():
        (d / f"{job_id}.json").write_text(text)
    return d


def assert_warned_each(stderr: str, d: Path) -> None:
    text = " ".join(stderr.split())
    for job_id, (_, why) in BAD.items():
        assert f"launchkit: warning: skipping unreadable job record {d / job_id}.json: {why}" in text, (
            job_id,
            text,
        )
    assert "internal error" not in text and "Traceback" not in text


def test_ps_skips_each_bad_record_with_a_warning(jobs_dir: Path) -> None:
    res = run(["ps", "--all"])
    assert res.returncode == 0, res.stderr
    assert GOOD in res.stdout and "succeeded" in res.stdout and "bad-" not in res.stdout
    assert_warned_each(res.stderr, jobs_dir)
    res = run(["ps", "--all", "--json"])
    assert res.returncode == 0, res.stderr
    assert [r["id"] for r in json.loads(res.stdout)] == [GOOD]
    assert_warned_each(res.stderr, jobs_dir)
    res = run(["ps"])
    assert res.returncode == 0 and "no running jobs" in res.stdout
    assert_warned_each(res.stderr, jobs_dir)


def test_kill_all_skips_bad_records_with_a_warning(jobs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in-process, with the process scan stubbed: a real `kill --all` would end every launchkit job
    # of this user on the machine, not only this test's
    from launchkit.jobs import kill

    monkeypatch.setattr(kill.procscan, "find_job_pids", lambda job_id: [])
    (jobs_dir / "1123-050000-bbbbbb.json").write_text(good_json(id="1123-050000-bbbbbb", state="running"))
    warnings: list[str] = []
    assert kill.active_job_ids(jobs.skipping(warnings.append)) == ["1123-050000-bbbbbb"]
    assert_warned_each(" ".join(f"launchkit: warning: {w}" for w in warnings), jobs_dir)


def test_top_still_works(jobs_dir: Path) -> None:
    res = run(["top", GOOD, "--once", "--interval", "0.1"])
    assert res.returncode == 0, res.stderr
    assert GOOD in res.stdout and "worker" in res.stdout


@pytest.mark.parametrize(
    "command", [["top", "bad-started", "--once"], ["logs", "bad-started"], ["kill", "bad-started"]]
)
def test_one_job_commands_name_the_bad_record(jobs_dir: Path, command: list[str]) -> None:
    res = run(command)
    assert res.returncode == 2, res.stderr
    assert (
        f"launchkit: error: cannot read the job record {jobs_dir}/bad-started.json: field 'started_at': "
        'expected a number, got a string "yesterday"' in " ".join(res.stderr.split())
    )


def test_kill_of_a_bad_record_still_ends_its_processes(jobs_dir: Path) -> None:
    """The record cannot be read, but a process of the job runs: found by its job id and ended,
    with the same words for the record as logs and top use."""
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "LAUNCHKIT_JOB_ID": "bad-list"})
    try:
        assert wait_until(lambda: proc.pid in pids_with_job("bad-list"), 10)
        res = run(["kill", "bad-list"])
        assert res.returncode == 0, res.stderr
        assert (
            f"warning: cannot read the job record {jobs_dir}/bad-list.json: expected a JSON object, got a list; "
            "ending the job's processes found by its id"
        ) in " ".join(res.stderr.split())
        assert "bad-list: ended 1 process(es) here" in res.stdout
        assert proc.wait(10) == -15
    finally:
        proc.kill()
        proc.wait()


def test_a_written_record_reads_back() -> None:
    path = jobs.save(good_record())
    assert jobs.read(path) == good_record()
    assert jobs.load(GOOD) == good_record()
    assert jobs.load("no-such-job") is None


def test_check_home_makes_the_jobs_directory_and_names_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process: the checks a launch (check_home) and a reader (load, load_all) make of
    LAUNCHKIT_HOME before anything else."""
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "new" / "home"))
    assert jobs.load_all() == [] and jobs.load(GOOD) is None  # a home not made yet: no jobs
    assert jobs.check_home() == tmp_path / "new" / "home" / "jobs" and jobs.jobs_dir().is_dir()
    assert list(jobs.jobs_dir().iterdir()) == []  # the write probe is gone
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for home, problem in (
        ("file", "not a directory"),
        ("link", f"a link to {tmp_path / 'nowhere'}, which does"),
    ):
        monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / home))
        for check in (jobs.check_home, jobs.load_all, lambda: jobs.load(GOOD)):
            with pytest.raises(UsageError, match=f"LAUNCHKIT_HOME {tmp_path / home}: {problem}"):
                check()
    monkeypatch.setenv("LAUNCHKIT_HOME", "/proc/self/home")
    with pytest.raises(UsageError, match="cannot write job records in /proc/self/home/jobs"):
        jobs.check_home()


@pytest.mark.parametrize("value", ["lk-home", "~/.launchkit", "./x"])
def test_a_relative_home_is_refused(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative LAUNCHKIT_HOME (a quoted '~' too) was taken under the current directory: a job
    launched in one directory was 'no job here' for ps/kill/logs/top run in another."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHKIT_HOME", value)
    for check in (jobs.check_home, jobs.load_all, lambda: jobs.load(GOOD)):
        with pytest.raises(UsageError, match=f"LAUNCHKIT_HOME {re.escape(value)}: a relative path"):
            check()
    assert list(tmp_path.iterdir()) == []  # nothing made here


def test_an_elastic_jobs_history_round_trips_and_older_records_have_none() -> None:
    rec = jobs.JobRecord(
        id="j1",
        name="n",
        backend="local",
        hosts=("localhost",),
        command=("x",),
        cwd="/",
        launcher_pid=1,
        launcher_start=None,
        started_at=1.0,
        processes=(jobs.ProcessRecord("worker", 3, "localhost", 9, epoch=1, ended="exit 0"),),
        changes=(
            Change(1, 2.0, ("worker 1 on localhost (exit 3)",), ("worker 3 on localhost",), "in process"),
        ),
    )
    data = json.loads(json.dumps(dataclasses.asdict(rec)))
    assert jobs.JobRecord.from_json(data) == rec
    del data["changes"]
    for p in data["processes"]:
        del p["epoch"], p["ended"]
    old = jobs.JobRecord.from_json(data)
    assert old.changes == () and old.processes[0].epoch is None
    data["changes"] = [{"epoch": "1", "at": 2.0}]
    with pytest.raises(ValueError, match=r"changes\[0\]\.epoch"):
        jobs.JobRecord.from_json(data)
