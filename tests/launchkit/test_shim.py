"""The rank shim: its line protocol (pure) and the shim itself as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launchkit import shim


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
        [sys.executable, "-m", "launchkit.shim", "--", *argv], env=env, capture_output=True, timeout=30
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


def test_shim_forwards_sigterm_and_says_it_was_stopped() -> None:
    table = json.dumps({"v": 1, "tasks": [{"i": 0, "env": {}}]})
    env = {**os.environ, shim.TASKS_VAR: table, "PMI_RANK": "0"}
    p = subprocess.Popen(
        [sys.executable, "-m", "launchkit.shim", "--", "sleep", "30"], env=env, stdout=subprocess.PIPE
    )
    assert p.stdout is not None
    first = shim.parse_frame(p.stdout.readline())
    assert first is not None and first.kind == "s"
    p.terminate()
    rest = p.stdout.read()
    assert p.wait(10) == 143
    end = shim.parse_frame(rest.splitlines(keepends=True)[-1])
    assert end is not None and end.kind == "x" and end.fields() == ["143", "1"]
