"""``launchkit logs``: every process's output kept beside the job record, by role and rank,
its tail, and --follow until the job ends; the capped files behind it (launchkit.jobs.keptoutput)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launchkit.jobs import keptoutput
from tests.launchkit.procs import LAUNCHKIT, record, run, start, until_exists_sh, wait_for_job

LINES = 'for i in 1 2 3 4 5; do echo "$DMLC_ROLE $LAUNCHKIT_ROLE_RANK out $i"; done; echo "$DMLC_ROLE $LAUNCHKIT_ROLE_RANK err" >&2'


def launched(launchkit_home, script: str = LINES) -> str:
    res = run(["launch", "-n", "2", "-s", "1", "--launcher", "local", "sh", "-c", script])
    assert res.returncode == 0, res.stderr
    return wait_for_job(launchkit_home)


def test_logs_of_every_process_and_of_one(launchkit_home) -> None:
    job = launched(launchkit_home)
    res = run(["logs", job])
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[:5] == [f"[scheduler 0] scheduler 0 out {i}" for i in range(1, 6)]
    assert out[5] == "[server 0] server 0 out 1" and out[-1] == "[worker 1] worker 1 out 5"
    assert len(out) == 20
    assert res.stderr.splitlines() == [
        f"[{p}] {p} err" for p in ("scheduler 0", "server 0", "worker 0", "worker 1")
    ]

    res = run(["logs", job, "--role", "worker", "--rank", "1"])
    assert res.stdout.splitlines() == [f"[worker 1] worker 1 out {i}" for i in range(1, 6)]
    assert res.stderr == "[worker 1] worker 1 err\n"

    res = run(["logs", job, "--role", "worker", "--tail", "2"])
    assert res.stdout.splitlines() == [
        "[worker 0] worker 0 out 4",
        "[worker 0] worker 0 out 5",
        "[worker 1] worker 1 out 4",
        "[worker 1] worker 1 out 5",
    ]
    assert run(["logs", job, "--rank", "0", "--tail", "0"]).stdout == ""
    assert run(["logs", job, "--rank", "0", "--tail", "1"]).stdout.splitlines() == [
        "[scheduler 0] scheduler 0 out 5",
        "[server 0] server 0 out 5",
        "[worker 0] worker 0 out 5",
    ]


def test_logs_usage_errors(launchkit_home) -> None:
    job = launched(launchkit_home, "true")
    for args, message in (
        (["logs", "nope"], "no job 'nope'"),
        (["logs", job, "--role", "boss"], "--role 'boss': expected one of scheduler, server, worker"),
        (
            ["logs", job, "--role", "server", "--rank", "3"],
            "has no process server 3 (its processes: scheduler 0, server 0, worker 0, worker 1)",
        ),
        (["logs", job, "--tail", "-1"], "--tail"),
    ):
        res = run(args)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr


def test_a_deleted_kept_file_is_said_not_printed_as_silence(launchkit_home) -> None:
    """Was nothing printed and exit 0, as if the process had printed nothing."""
    job = launched(launchkit_home)
    where = launchkit_home / "jobs" / job
    (where / "worker-0.stdout").unlink()
    res = run(["logs", job, "--rank", "0", "--role", "worker"])
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.splitlines() == [
        "[worker 0] worker 0 err",
        f"launchkit: error: job {job}: the kept output of worker 0 stdout is gone from {where} (deleted?)",
    ]
    res = run(["logs", job, "--role", "worker", "--rank", "1"])  # untouched: as before
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 5
    for kept in where.glob("*-*.std*"):
        kept.unlink()
    res = run(["logs", job])
    assert res.returncode == 1 and "older launchkit" not in res.stderr
    assert "the kept output of scheduler 0 stdout, scheduler 0 stderr, server 0 stdout" in res.stderr


def test_follow_prints_lines_as_they_come_and_ends_with_the_job(launchkit_home, tmp_path: Path) -> None:
    # after its first tick the job waits for GO, so that it is still running however slowly
    # `logs --follow` starts; the test makes GO once the first line has come
    go = tmp_path / "go"
    script = (
        f'for i in 1 2 3 4 5 6 7 8; do echo "$DMLC_ROLE $LAUNCHKIT_ROLE_RANK tick $i"; '
        f"{until_exists_sh(go)}; sleep 0.25; done"
    )
    job_proc = start(["launch", "-n", "1", "-s", "0", "--launcher", "local", "sh", "-c", script])
    try:
        job = wait_for_job(launchkit_home)
        follow = subprocess.Popen(
            [sys.executable, "-m", "launchkit", "logs", job, "--role", "worker", "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert first.startswith("[worker 0] worker 0 tick ")
        assert job_proc.poll() is None  # the line came while the job still ran
        go.touch()
        # the rest through the same buffered reader (communicate() would skip what it holds)
        rest = follow.stdout.read()
        assert record(launchkit_home, job)["state"] == "succeeded"  # it ended with the job, not before
        assert follow.wait(timeout=15) == 0, follow.stderr.read() if follow.stderr else ""
        job_proc.communicate(timeout=10)
        lines = [first.rstrip("\n"), *rest.splitlines()]
        assert lines[-1] == "[worker 0] worker 0 tick 8"
        ticks = [int(line.rsplit(" ", 1)[1]) for line in lines]
        assert ticks == list(range(ticks[0], 9))
    finally:
        if job_proc.poll() is None:
            job_proc.terminate()
            job_proc.communicate(timeout=10)


def test_kept_files_are_capped_and_a_failure_warns_once(tmp_path, monkeypatch) -> None:
    warnings: list[str] = []
    keeper = keptoutput.Keeper("1122-000000-abcdef", warnings.append, cap=100)
    f = keeper.open("worker", 0, "out")
    assert f is not None
    for i in range(30):
        f.write(f"line {i:02d}\n".encode())  # 8 bytes each: rotated every 13 lines
    f.close()
    (k,) = keptoutput.kept("1122-000000-abcdef")
    assert (k.role, k.rank, k.stream, [p.name for p in k.paths]) == (
        "worker",
        0,
        "stdout",
        ["worker-0.stdout.1", "worker-0.stdout"],
    )
    kept = keptoutput.last_lines(k.paths, None)
    assert kept == [f"line {i:02d}" for i in range(13, 30)]  # between cap and twice the cap, the latest
    assert keptoutput.last_lines(k.paths, 3) == ["line 27", "line 28", "line 29"]

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the job's directory would go")
    monkeypatch.setenv("LAUNCHKIT_HOME", str(blocked))
    keeper = keptoutput.Keeper("1122-000000-abcdef", warnings.append)
    assert keeper.open("worker", 0, "out") is None and keeper.open("worker", 1, "err") is None
    assert len(warnings) == 1 and "cannot keep the job's output" in warnings[0]


def test_follow_loses_nothing_when_the_file_is_rotated() -> None:
    """The kept file rotates (mid-line: it is capped by bytes) between two reads of a follower:
    the rest of the old file, now ``.1``, comes first, and the cut line is joined again."""
    keeper = keptoutput.Keeper("1122-000000-fedcba", [].append, cap=100)
    f = keeper.open("worker", 0, "out")
    assert f is not None
    follower = keptoutput.follow(f.path, 0)
    text = b"".join(b"line %02d\n" % i for i in range(40))
    got: list[str] = []
    for n in range(0, len(text), 7):  # 7-byte writes: lines are cut, and so is the rotation
        f.write(text[n : n + 7])
        f.flush()
        if n % 63 == 0:  # a read now and then, fewer than 100 bytes apart: one rotation at most
            got += next(follower)
    f.close()
    got += next(follower)
    assert got == [f"line {i:02d}" for i in range(40)]


def test_logs_keeps_the_control_characters_the_console_got(launchkit_home) -> None:
    """A progress bar (carriage returns) came out of logs as one line of every state run
    together: 'progress 0progress 1progress 2'."""
    job = launched(launchkit_home, r"printf '\rprogress 0\rprogress 1\a\n'; printf 'tab\there\n' >&2")
    res = subprocess.run(
        [*LAUNCHKIT, "logs", job, "--role", "worker", "--rank", "0"], capture_output=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"[worker 0] \rprogress 0\rprogress 1\a\n"
    assert res.stderr == b"[worker 0] tab\there\n"
