"""The dashboard: the pure render, and the real thing in a terminal (tmux)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid

from rich.console import Console

from launchkit.dashboard import DashboardState, ProcRow, render
from tests.launchkit.procs import PROG, pids_with_job, record, run, start, wait_for_job, wait_until


def text_of(state: DashboardState, width: int = 140) -> str:
    console = Console(record=True, width=width, no_color=True)
    console.print(render(state))
    return console.export_text()


def test_render_shows_every_process_and_the_log() -> None:
    state = DashboardState(
        job_id="1122-000000-abcdef",
        name="train",
        backend="local",
        elapsed=3725,
        rows=(
            ProcRow("scheduler", 0, "localhost", 10, "running", cpu_percent=1.0, rss_bytes=12 * 2**20),
            ProcRow("worker", 0, "localhost", 11, "failed", "exit 3", last_line="boom"),
            ProcRow("worker", 1, "localhost", 12, "ended", "signal 15"),
        ),
        log=(("worker 0", "epoch 1 loss 0.5"),),
        message="job failed",
    )
    text = text_of(state)
    assert "train 1122-000000-abcdef  local  1:02:05" in text
    assert "1 ended, 1 failed, 1 running" in text
    assert "12.0 MiB" in text and "1%" in text
    assert "failed (exit 3)" in text and "boom" in text
    assert "ended (signal 15)" in text
    assert "[worker 0] epoch 1 loss 0.5" in text
    assert "job failed" in text


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=True).stdout


SOCKET = f"lk-test-{uuid.uuid4().hex[:8]}"


def test_live_dashboard_in_a_terminal(tmp_path) -> None:
    script = tmp_path / "steps.py"
    script.write_text(
        "import os, time\n"
        "for i in range(30):\n"
        "    print(os.environ['DMLC_ROLE'], os.environ['LAUNCHKIT_ROLE_RANK'], 'step', i, flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    cmd = shlex.join(
        [
            sys.executable,
            "-m",
            "launchkit",
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--dashboard",
            sys.executable,
            str(script),
        ]
    )
    tmux("new-session", "-d", "-s", "dash", "-x", "140", "-y", "40", f"{cmd}; echo EXIT=$?; sleep 30")
    try:
        assert wait_until(lambda: "running" in tmux("capture-pane", "-p", "-t", "dash"), 10)
        live = tmux("capture-pane", "-p", "-t", "dash")
        assert "worker    │    1" in live and "scheduler │    0" in live
        assert "step" in live
        assert wait_until(lambda: "EXIT=0" in tmux("capture-pane", "-p", "-t", "dash"), 15)
        final = tmux("capture-pane", "-p", "-t", "dash")
        assert "4 ok" in final
        assert "[worker 1] worker 1 step 29" in final
        assert "all 4 processes succeeded" in final
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def test_dashboard_without_a_terminal_falls_back_to_plain_output() -> None:
    res = run(["launch", "-n", "1", "-s", "0", "--dashboard", sys.executable, PROG, "argv", "x"])
    assert res.returncode == 0
    assert "--dashboard needs a terminal" in res.stderr
    assert '[worker 0] ["x"]' in res.stdout


def test_top_once_shows_a_running_job(launchkit_home) -> None:
    proc = start(["launch", "-n", "2", "-s", "0", sys.executable, PROG, "wait"])
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) == 3, 10)
        res = run(["top", job, "--once"])
        assert res.returncode == 0, res.stderr
        assert job in res.stdout and "3 running" in res.stdout
        pids = [p["pid"] for p in record(launchkit_home, job)["processes"]]
        assert all(str(pid) in res.stdout for pid in pids)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    time.sleep(0.1)
    res = run(["top", job, "--once"])
    assert "job interrupted" in res.stdout


def test_top_unknown_job() -> None:
    res = run(["top", "nope"])
    assert res.returncode == 2 and "no job 'nope'" in res.stderr
