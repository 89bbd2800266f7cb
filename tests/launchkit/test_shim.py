"""The rank shim: its line protocol (pure) and the shim itself as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from launchkit.hostside import shim


def test_frames_round_trip_and_long_lines_are_cut() -> None:
    line = b"x" * (shim.CHUNK * 2 + 5) + b"\n"
    frames = [shim.parse_frame(f) for f in shim.frame_output(7, "e", line)]
    assert [f.continued for f in frames if f] == [True, True, False]
    assert b"".join(f.data for f in frames if f) == line[:-1]
    assert all(f is not None and f.task == 7 and f.kind == "e" for f in frames)


def test_user_output_cannot_forge_a_frame() -> None:
    forged = shim.frame_event(3, "x", 0, 0)  # a task printing another task's end mark
    (frame,) = shim.frame_output(1, "o", forged)
    parsed = shim.parse_frame(frame)
    assert parsed is not None and parsed.task == 1 and parsed.kind == "o"


def test_unframed_lines_are_engine_output() -> None:
    assert shim.parse_frame(b"mpirun: something went wrong\n") is None
    assert shim.parse_frame(b"\x1elk x o y\n") is None


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({"OMPI_COMM_WORLD_RANK": "3"}, 3),
        ({"PMI_RANK": "2"}, 2),
        ({"SLURM_PROCID": "0"}, 0),
        ({"SGE_TASK_ID": "1"}, 0),  # Grid Engine counts from 1
        ({"LAUNCHKIT_SHIM_RANK": "4", "SLURM_PROCID": "0"}, 4),
        ({}, None),
    ],
)
def test_engine_rank(environ: dict[str, str], rank: int | None) -> None:
    assert shim.engine_rank(environ) == rank


def test_task_of_offsets_and_errors() -> None:
    table = json.dumps({"v": 1, "tasks": [{"i": 5, "env": {"A": "1"}}, {"i": 6, "env": {"A": "2"}}]})
    env = {shim.TASKS_VAR: table, "SLURM_PROCID": "0", "LAUNCHKIT_SHIM_OFFSET": "1"}
    assert shim.task_of(env) == (6, {"A": "2"})
    with pytest.raises(ValueError, match="outside the job's 2 tasks"):
        shim.task_of({**env, "SLURM_PROCID": "1"})
    with pytest.raises(ValueError, match="not set"):
        shim.task_of({"SLURM_PROCID": "0"})


def _run_shim(argv: list[str], rank: int = 0, **extra: str) -> subprocess.CompletedProcess[bytes]:
    table = json.dumps(
        {"v": 1, "tasks": [{"i": 1, "env": {"ROLE": "server"}}, {"i": 2, "env": {"ROLE": "worker"}}]}
    )
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": str(rank), **extra}
    return subprocess.run(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", *argv],
        env=env,
        capture_output=True,
        timeout=30,
    )


def test_shim_runs_the_task_and_frames_everything() -> None:
    res = _run_shim(["sh", "-c", 'echo "out $ROLE"; echo err >&2; exit 3'], rank=1)
    assert res.returncode == 3
    out = [shim.parse_frame(line) for line in res.stdout.splitlines(keepends=True)]
    err = [shim.parse_frame(line) for line in res.stderr.splitlines(keepends=True)]
    assert all(f is not None and f.task == 2 for f in out + err)
    assert [f.kind for f in out if f] == ["s", "o", "x"] and out[1] and out[1].data == b"out worker"
    assert [f.kind for f in err if f] == ["e", "x"]
    assert out[-1] and out[-1].fields() == ["3", "0"]


def test_shim_reports_a_missing_command_as_127() -> None:
    res = _run_shim(["/nonexistent/cmd"])
    assert res.returncode == 127
    assert b"cannot start" in res.stderr


def test_a_command_not_found_on_path_names_the_path() -> None:
    res = _run_shim(["no-such-program-lk"], PATH="/nowhere/bin")
    assert res.returncode == 127
    assert b"cannot start 'no-such-program-lk': No such file or directory (PATH=/nowhere/bin)" in res.stderr


def test_the_submitters_path_is_put_back_before_the_command_starts(tmp_path) -> None:
    """sge: a login shell's profile sets PATH anew before the job script runs the shim; the
    launcher's PATH comes again as LAUNCHKIT_SHIM_PATH, which the command does not see."""
    tool = tmp_path / "lk-own-tool"
    tool.write_text('#!/bin/sh\necho "tool ran; $LAUNCHKIT_SHIM_PATH"\n')
    tool.chmod(0o755)
    res = _run_shim(["lk-own-tool"], PATH="/usr/bin:/bin", **{shim.PATH_VAR: f"{tmp_path}:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    out = [shim.parse_frame(line) for line in res.stdout.splitlines(keepends=True)]
    assert any(f is not None and f.kind == "o" and f.data == b"tool ran; " for f in out), res.stdout


def test_shim_forwards_sigterm_and_says_it_was_stopped() -> None:
    table = json.dumps({"v": 1, "tasks": [{"i": 0, "env": {}}]})
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": "0"}
    p = subprocess.Popen(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", "sleep", "30"],
        env=env,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None
    first = shim.parse_frame(p.stdout.readline())
    assert first is not None and first.kind == "s"
    p.terminate()
    rest = p.stdout.read()
    assert p.wait(10) == 143
    end = shim.parse_frame(rest.splitlines(keepends=True)[-1])
    assert end is not None and end.kind == "x" and end.fields() == ["143", "1"]


def test_a_killed_shim_takes_the_commands_whole_group_with_it() -> None:
    """An engine's SIGKILL reaches only the shim: its guardian ends what the command started."""
    table = json.dumps({"v": 1, "tasks": [{"i": 0, "env": {}}]})
    marker = f"lk-guard-{os.getpid()}"
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": "0", "X_MARK": marker}
    p = subprocess.Popen(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", "sh", "-c", "sleep 300 & sleep 301"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdout is not None
    assert shim.parse_frame(p.stdout.readline()) is not None  # started

    def sleepers() -> list[int]:
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and _has_mark(int(d), marker)]

    deadline = time.monotonic() + 5
    while len(sleepers()) < 3 and time.monotonic() < deadline:  # sh, sleep 300, sleep 301
        time.sleep(0.05)
    assert len(sleepers()) >= 2
    p.kill()
    p.wait(5)
    deadline = time.monotonic() + 5
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleepers()


def _has_mark(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return (
        f"X_MARK={marker}".encode() in env
        and state not in (b"Z", b"X")
        and b"launchkit.hostside.shim" not in cmd
    )


def test_the_command_does_not_see_the_shims_instructions() -> None:
    res = _run_shim([sys.executable, "-c", "import os; print(sorted(k for k in os.environ if 'SHIM' in k))"])
    out = [shim.parse_frame(line) for line in res.stdout.splitlines(keepends=True)]
    assert any(f is not None and f.kind == "o" and f.data == b"[]" for f in out)


def test_the_guardian_reports_a_killed_shims_end_and_a_clean_end_leaves_none() -> None:
    """SIGKILL of the shim: its guardian writes the task's end marks (137) on the shim's streams.
    A normal end: the guardian is gone before the end marks (it used to outlive the shim, and
    every mpi job warned about it as a leftover process)."""
    table = json.dumps({"v": 1, "tasks": [{"i": 4, "env": {}}]})
    marker = f"lk-guard2-{os.getpid()}"
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": "0", "X_MARK": marker}
    p = subprocess.Popen(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", "sleep", "30"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdout is not None
    assert shim.parse_frame(p.stdout.readline()) is not None  # started
    p.kill()
    ends = [shim.parse_frame(line) for line in p.stdout.read().splitlines(keepends=True)]
    assert [(f.task, f.kind, f.fields()) for f in ends if f] == [(4, "x", ["137", "0"])]
    p.wait(5)

    res = _run_shim(["true"], X_MARK=marker)
    assert res.returncode == 0
    assert not [d for d in os.listdir("/proc") if d.isdigit() and _environ_has(int(d), marker)]


def _environ_has(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"X_MARK={marker}".encode() in f.read()
    except OSError:
        return False


@pytest.mark.parametrize(
    ("value", "grace"), [("10", 10.0), ("", shim.GRACE), ("nan", shim.GRACE), ("x", shim.GRACE)]
)
def test_grace_from_the_launcher(value: str, grace: float) -> None:
    assert shim.shim_grace({shim.GRACE_VAR: value}) == grace


def test_the_end_mark_is_left_in_the_launchers_directory_too(tmp_path) -> None:
    """``LAUNCHKIT_SHIM_ENDS``: the end mark is also written there whole (Open MPI's mpirun may stop
    passing the shims' output on while it ends the job itself), by the shim and by the guardian
    of a SIGKILLed shim; a directory that is not there changes nothing."""
    res = _run_shim(["sh", "-c", "exit 3"], rank=1, LAUNCHKIT_SHIM_ENDS=str(tmp_path))
    assert res.returncode == 3
    assert os.listdir(tmp_path) == ["2"]
    assert (tmp_path / "2").read_bytes() == shim.frame_event(2, "x", 3, 0)
    assert _run_shim(["true"], LAUNCHKIT_SHIM_ENDS=str(tmp_path / "none")).returncode == 0

    table = json.dumps({"v": 1, "tasks": [{"i": 4, "env": {}}]})
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": "0", shim.ENDS_VAR: str(tmp_path)}
    p = subprocess.Popen(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", "sleep", "30"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdout is not None
    assert shim.parse_frame(p.stdout.readline()) is not None  # started
    p.kill()
    p.stdout.read()  # to EOF: the guardian, which holds the stream, has written both and ended
    p.wait(5)
    assert (tmp_path / "4").read_bytes() == shim.frame_event(4, "x", 137, 0)
